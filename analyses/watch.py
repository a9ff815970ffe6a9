"""Follow a run while it is written: ``polytrace watch`` for people without Dagster.

A :class:`Watcher` polls one run (a directory of logs or one log file). When any of its files
changed (size or modification time), it ingests the run again (an append-only refresh when the
files only grew: :func:`analyses.ingest.ingest_run`), then says what is new in short lines for an
80-column terminal: one per batch of new training steps, one per alert not seen before. New alerts
are also sent through :func:`analyses.alerts.deliver` when notification URLs are configured; the
sent-alerts state is the one ``polytrace alerts --notify`` and the Dagster sensor use, so an alert
is sent once whoever sees it first.

The loop is a plain function of a :class:`threading.Event` (set it to stop), so a test or another
program drives it without signals; the command line maps Ctrl-C and SIGTERM onto it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING, Any

from analyses.ingest import discover_files, resolve_run_id
from analyses.manifest import load_manifest

if TYPE_CHECKING:
    from analyses.alerts import Alert
    from analyses.api import PolyTrace
    from analyses.ingest import RunReport

DEFAULT_INTERVAL_S = 2.0
LINE_WIDTH = 80

Signature = tuple[tuple[str, int, int], ...]  # (path, size, mtime_ns) of every input file


def signature(path: Path) -> Signature:
    """What the watcher compares between polls: each input file's size and modification time."""
    files = discover_files(path, load_manifest(path)).files
    out = []
    for p in files:
        try:
            st = p.stat()
        except OSError:  # removed between the listing and the stat: the next poll sees it gone
            continue
        out.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.3g}%"


# (column of training_health, label in the step line, format); response length first: a collapse shows there
STEP_FIELDS = (("response_length_mean", "len", _num), ("reward_mean", "reward", _num), ("entropy", "entropy", _num),
               ("clip_ratio", "clip", _pct))


def step_line(first: int, last: int, means: dict[str, float | None], step_time_s: float | None) -> str:
    """One line for a batch of new steps: the batch's mean of each field it has, then its mean step
    time, e.g. ``steps 41-48: len=812 reward=0.41 entropy=0.21 clip=3.1% 37.2 s/step`` (under 80
    columns for steps up to 99,999)."""
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    parts = [f"{label}={fmt(means.get(col))}" for col, label, fmt in STEP_FIELDS if means.get(col) is not None]
    if step_time_s is not None and math.isfinite(step_time_s):
        parts.append(f"{step_time_s:.3g} s/step")
    line = f"{span}: " + " ".join(parts) if parts else f"{span}: no health metrics"
    return line if len(line) <= LINE_WIDTH else line[: LINE_WIDTH - 3] + "..."


@dataclass
class Refresh:
    """What one poll did: whether it ingested, and the lines it has to say."""

    ingested: bool = False
    lines: list[str] = field(default_factory=list)
    new_alerts: list[Alert] = field(default_factory=list)
    seconds: float = 0.0


class Watcher:
    """Polls one run and reports what is new; see the module docstring."""

    def __init__(self, pt: PolyTrace, path: Path, run_id: str | None = None, urls: list[str] | None = None) -> None:
        self.pt = pt
        self.path = path.resolve()
        self.run_id = resolve_run_id(self.path, load_manifest(self.path), run_id)
        self.urls = urls or []
        self._forced_id = run_id
        self._last_sig: Signature | None = None
        self.last_step: int | None = None  # the last step reported
        self.first_step: int | None = None
        self.seen: set[str] = set()  # alert keys already printed by this watcher
        self.refreshes = 0
        self.notified = 0
        self.failed = 0
        self._catalog_views = False

    def poll(self, say: Callable[[str], Any] | None = None,
             hold: Callable[[], AbstractContextManager[Any]] = nullcontext) -> Refresh:
        """Ingest when a file changed since the last poll, and say what is new. Each line goes to
        ``say`` as soon as it is known, inside ``hold()`` together with counting what it reports (the
        command line holds Ctrl-C there), so an interrupted poll leaves a summary matching its output."""
        out = Refresh()

        def emit(line: str, counted: Callable[[], None] = lambda: None) -> None:
            with hold():
                if say is not None:
                    say(line)
                counted()
                out.lines.append(line)

        sig = signature(self.path)
        if sig == self._last_sig:
            return out
        t0 = time.perf_counter()
        report = self.pt.ingest(self.path, run_id=self._forced_id, refresh=not self._catalog_views)
        self._catalog_views = True  # derived views are in the catalog file; later commits refresh its tables
        self._last_sig = sig
        self.refreshes += 1
        out.ingested = True
        for line in self._mode_lines(report):
            emit(line)
        steps = self._new_steps()
        if steps is not None:
            first, last, line = steps

            def counted() -> None:
                self.first_step = first if self.first_step is None else self.first_step
                self.last_step = last

            emit(line, counted)
        alerts = self.pt.alerts([self.run_id])
        for a in alerts:
            if a.key not in self.seen:
                emit(a.line()[:LINE_WIDTH], lambda a=a: (self.seen.add(a.key), out.new_alerts.append(a)))
        if self.urls and alerts:
            # every alert of the run, each time: deliver() skips those sent before (by anyone), and
            # one whose delivery failed is tried again here
            done = self.pt.notify(alerts, self.urls)
            self.notified += len(done.sent)
            self.failed += len(done.failed)
            for ln in done.lines():
                emit(ln[:160])
        out.seconds = time.perf_counter() - t0
        return out

    def _mode_lines(self, report: RunReport) -> list[str]:
        """A refresh that could not append says why it read everything again."""
        return list(report.refresh_notes)

    def _new_steps(self) -> tuple[int, int, str] | None:
        """The steps ingested since the last report as (first, last, one line), from training_health."""
        con = self.pt.connect()
        try:
            after = -1 if self.last_step is None else self.last_step
            cols = ", ".join(f"avg({c})" for c, _, _ in STEP_FIELDS)
            row = con.execute(
                f"SELECT min(step), max(step), {cols}, avg(step_time_s) FROM training_health "
                "WHERE run_id = ? AND step > ?", [self.run_id, after]).fetchone()
        finally:
            con.close()
        if row is None or row[0] is None:
            return None
        first, last, *vals, step_time = row
        means = {c: v for (c, _, _), v in zip(STEP_FIELDS, vals, strict=True)}
        return first, last, step_line(first, last, means, step_time)

    def summary(self) -> str:
        steps = "no steps" if self.last_step is None else f"steps {self.first_step}-{self.last_step}"
        sent = f", {self.notified} notified" if self.urls else ""
        failed = f", {self.failed} failed" if self.failed else ""
        return (f"watch {self.run_id}: stopped after {self.refreshes} refresh(es); {steps}; "
                f"{len(self.seen)} alert(s){sent}{failed}")


def watch(watcher: Watcher, interval_s: float, stop: Event, say: Callable[[str], Any],
          on_error: Callable[[str], Any] | None = None,
          hold: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
    """Poll ``watcher`` every ``interval_s`` until ``stop`` is set; each line goes to ``say`` (inside
    ``hold()``: :meth:`Watcher.poll`). A refresh that fails (a locked run, a refused commit) is one
    line to ``on_error`` and the loop goes on: the next change is tried again."""
    from analyses.warehouse import CommitRefused, RunLocked

    while not stop.is_set():
        try:
            watcher.poll(say, hold)
        except (RunLocked, CommitRefused, OSError) as exc:
            (on_error or say)(f"refresh failed: {exc}".replace("\n", " "))  # the next poll tries again
        stop.wait(interval_s)
