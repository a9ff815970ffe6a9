"""The "fit unit" of the performance issue: ``scipy.stats.lognorm.fit`` on 200,000 seeded
log-normal samples, timed in the same process as what it is compared with.

A shared machine's speed moves with the other jobs on it, so a benchmark measures the unit
beside its own work (before and after) and reports ratios; both wall time and CPU time (this
process's user + system) are kept, the CPU ratio being the steadier one on a loaded machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

UNIT_N = 200_000


@dataclass
class Timing:
    wall: float
    cpu: float

    def __truediv__(self, unit: Timing) -> Timing:
        return Timing(self.wall / unit.wall, self.cpu / unit.cpu)


def timed(fn: Callable[[], Any]) -> tuple[Timing, Any]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return Timing(time.perf_counter() - w, time.process_time() - c), out


def fit_unit(repeats: int = 3) -> Timing:
    """The fastest of ``repeats`` lognorm fits on the same 200k samples (wall and CPU separately)."""
    x = stats.lognorm.rvs(0.8, scale=300.0, size=UNIT_N, random_state=np.random.default_rng(0))
    runs = [timed(lambda: stats.lognorm.fit(x))[0] for _ in range(repeats)]
    return Timing(min(t.wall for t in runs), min(t.cpu for t in runs))


def beside(fn: Callable[[], Any]) -> tuple[Timing, Timing, Any]:
    """Time ``fn`` with the fit unit timed right before and right after it: (its time, the unit as
    the mean of the two, its result). On a shared machine the speed moves within a minute; the
    unit next to the work is the unit that work ran at."""
    before = fit_unit()
    t, out = timed(fn)
    after = fit_unit()
    return t, Timing((before.wall + after.wall) / 2, (before.cpu + after.cpu) / 2), out


def verdict(ratio: float, limit: float) -> str:
    return "PASS" if ratio <= limit else "MISS"
