"""The fuzz drivers' worker pool (:mod:`tests.fuzz.pool`): a worker that dies or hangs on an input
is killed and replaced, the driver hears of it with the input, and what it asks to run again
runs; every other input of every job runs once."""

from __future__ import annotations

import collections
from pathlib import Path

from tests.fuzz.pool import Pool, Worker


def test_a_worker_that_crashes_or_hangs_is_replaced_and_the_rest_of_its_job_runs(tmp_path: Path) -> None:
    jobs = collections.deque([
        {"id": 0, "n": 4, "crash_at": 1, "hang_at": -1, "exclude": []},
        {"id": 1, "n": 4, "crash_at": -1, "hang_at": 2, "exclude": []},
        {"id": 2, "n": 3, "crash_at": -1, "hang_at": -1, "exclude": []},
    ])
    done: list[tuple[int, int]] = []
    lost: list[tuple[str, int, int | None, str]] = []
    started: list[Worker] = []

    def start() -> Worker:
        started.append(Worker(tmp_path, "tests.fuzz.probe_worker"))
        return started[-1]

    def on_lost(w: Worker, kind: str, detail: str) -> dict | None:
        lost.append((kind, w.job["id"], w.current, detail))
        return dict(w.job, exclude=[*w.job["exclude"], w.current])

    def handle(w: Worker, ev: dict) -> None:
        if ev["ev"] == "done":
            done.append((w.job["id"], ev["i"]))
        elif ev["ev"] == "end":
            pool.feed(w)

    pool = Pool(jobs, start, on_lost, "died (exit {code})", input_seconds=2.0)
    pool.run(2, handle)

    assert sorted(lost) == [("crash", 0, 1, "died (exit 3)"), ("hang", 1, 2, "no result after 2 s")]
    # each lost job ran again from its start without the lost input, as the driver asked
    assert sorted(done) == [(0, 0), (0, 0), (0, 2), (0, 3), (1, 0), (1, 0), (1, 1), (1, 1), (1, 3),
                            (2, 0), (2, 1), (2, 2)]
    assert len(started) == 4  # two at the start, one replacing each lost worker
    assert all(w.proc.poll() is not None for w in started)  # none is left running
