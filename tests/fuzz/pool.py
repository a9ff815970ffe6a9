"""The worker pool both fuzz drivers run on (:mod:`tests.fuzz.run`, :mod:`tests.fuzz.sql_run`).

Jobs (JSON objects) go from a queue to worker processes speaking JSON lines; every worker
announces each input it starts (``{"ev": "start", "i": ...}``), and the driver handles the rest of
its events. A worker that dies, or spends longer than ``input_seconds`` on one input, is killed
and replaced; the driver decides what of its job runs again.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATUS_EVERY_S = 30.0


class Worker:
    """A worker process speaking JSON lines: jobs on its stdin, events on its stdout. It runs in
    a session of its own, so that killing it also kills any process it forked."""

    def __init__(self, scratch: Path, module: str = "tests.fuzz.worker", env: dict[str, str] | None = None) -> None:
        penv = dict(os.environ, PYTHONPATH=str(REPO), POLARS_MAX_THREADS=os.environ.get("POLARS_MAX_THREADS", "2"),
                    **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, str(scratch)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=penv, cwd=REPO,
            start_new_session=True,
        )
        self.buf = b""
        self.job: dict | None = None
        self.current: int | None = None
        self.started = 0.0
        self.batches = 0

    def send(self, job: dict) -> None:
        self.job, self.current, self.started = job, None, time.monotonic()
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def lines(self) -> list[dict]:
        data = os.read(self.proc.stdout.fileno(), 1 << 20)
        if not data:
            raise EOFError
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in done if x.startswith(b"{")]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


# what of a lost worker's job runs again (None: nothing), given the worker, "crash" or "hang",
# and the detail; the driver records the finding here
LostFn = Callable[[Worker, str, str], "dict | None"]


class Pool:
    """Feeds ``jobs`` to workers made by ``start``. ``handle(worker, event)`` gets every event but
    ``start``, and calls :meth:`feed` (the worker is free) or :meth:`recycle` (replace it with a
    fresh process) as the protocol says; ``lost`` is told of a worker that crashed or hung
    (``crash_detail`` formats the crash's detail from the exit code). ``max_seconds``: no job is
    started after this long (the ones in flight finish). ``status(elapsed)``: a progress line
    printed every :data:`STATUS_EVERY_S`."""

    def __init__(self, jobs: collections.deque[dict], start: Callable[[], Worker], lost: LostFn,
                 crash_detail: str, input_seconds: float, max_seconds: float | None = None,
                 t0: float | None = None, status: Callable[[float], str] | None = None) -> None:
        self.queue = jobs
        self._start, self._lost, self._crash = start, lost, crash_detail
        self.input_seconds, self.max_seconds = input_seconds, max_seconds
        self.t0 = time.monotonic() if t0 is None else t0
        self._status = status
        self.sel = selectors.DefaultSelector()
        self.workers: list[Worker] = []

    def start_worker(self) -> Worker:
        w = self._start()
        self.sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        self.workers.append(w)
        return w

    def feed(self, w: Worker) -> None:
        if self.max_seconds is not None and time.monotonic() - self.t0 > self.max_seconds:
            self.queue.clear()  # out of time: finish the jobs in flight, report what ran
        if self.queue:
            w.send(self.queue.popleft())
        else:
            w.job = None

    def _remove(self, w: Worker) -> None:
        self.sel.unregister(w.proc.stdout)
        w.kill()
        self.workers.remove(w)

    def recycle(self, w: Worker) -> None:
        """Replace ``w`` (between jobs) with a fresh process: no state creeps across many jobs."""
        w.proc.stdin.close()
        self._remove(w)
        self.feed(self.start_worker())

    def drop(self, w: Worker, kind: str, detail: str) -> None:
        """``w`` died or hung on its current input: kill it, let the driver record it and say what
        runs again, and go on with a new worker."""
        self._remove(w)
        if w.job is not None:
            again = self._lost(w, kind, detail)
            if again is not None:
                self.queue.appendleft(again)
        if self.queue:
            self.feed(self.start_worker())

    def run(self, procs: int, handle: Callable[[Worker, dict], None]) -> None:
        last_print = time.monotonic()
        try:
            for _ in range(min(procs, len(self.queue))):
                self.feed(self.start_worker())
            while any(w.job is not None for w in self.workers):
                for key, _ in self.sel.select(timeout=1.0):
                    w: Worker = key.data
                    try:
                        events = w.lines()
                    except EOFError:
                        self.drop(w, "crash", self._crash.format(code=w.proc.wait()))
                        continue
                    for ev in events:
                        if ev["ev"] == "start":
                            w.current, w.started = ev["i"], time.monotonic()
                        else:
                            handle(w, ev)
                now = time.monotonic()
                for w in list(self.workers):
                    if w.job is not None and w.current is not None and now - w.started > self.input_seconds:
                        self.drop(w, "hang", f"no result after {self.input_seconds:.0f} s")
                if self._status is not None and now - last_print > STATUS_EVERY_S:
                    last_print = now
                    print(self._status(now - self.t0), flush=True)
        finally:
            for w in self.workers:
                w.kill()
