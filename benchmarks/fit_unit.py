"""The "fit unit" of the performance issue: ``scipy.stats.lognorm.fit`` on 200,000 seeded
log-normal samples, timed beside what it is compared with.

A shared machine's speed moves with the other jobs on it, so a benchmark measures the unit
beside its own work (before and after) and reports ratios; both wall time and CPU time (user +
system) are kept, the CPU ratio being the steadier one on a loaded machine.

The unit is timed in a fresh interpreter, never in the benchmark's own process. Most of a fit's
time on this VM is page faults: each fit's temporary arrays (1.6 MB each) come from the kernel
and go back to it. A process that has freed a large block before (a 10 M-sample fit does) has
had glibc raise its trim threshold, keeps those pages, and times the same fit 5x faster (0.011
against 0.055 s here; ``MALLOC_TOP_PAD_=268435456`` reproduces it in a fresh process). Timed in
the benchmark's process, the unit depended on what that process had done before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


_UNIT_CHILD = f"""
import json, time
import numpy as np
from scipy import stats
x = stats.lognorm.rvs(0.8, scale=300.0, size={UNIT_N}, random_state=np.random.default_rng(0))
runs = []
for _ in range({{repeats}}):
    w, c = time.perf_counter(), time.process_time()
    stats.lognorm.fit(x)
    runs.append((time.perf_counter() - w, time.process_time() - c))
print(json.dumps(runs))
"""


def fit_unit(repeats: int = 3) -> Timing:
    """The fastest of ``repeats`` lognorm fits on the same 200k samples, in a fresh interpreter
    (wall and CPU separately; see the module's docstring for why not in this process)."""
    out = _fresh(_UNIT_CHILD.format(repeats=repeats))
    runs = json.loads(out.stdout)
    return Timing(min(w for w, _c in runs), min(c for _w, c in runs))


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


_VARIANTS_CHILD = f"""
import json, time
import numpy as np, scipy
from scipy import stats
out = {{"scipy": scipy.__version__}}
for s, scale, seed in ((0.8, 300.0, 0), (1.0, 1.0, 0), (0.5, 1.0, 42), (1.5, 1.0, 1), (2.0, 1.0, 7)):
    x = stats.lognorm.rvs(s, scale=scale, size={UNIT_N}, random_state=np.random.default_rng(seed))
    runs = []
    for _ in range(3):
        t = time.perf_counter(); stats.lognorm.fit(x); runs.append(time.perf_counter() - t)
    out[f"lognorm.fit s={{s}} scale={{scale}} seed={{seed}}"] = min(runs)
x = stats.lognorm.rvs(0.8, scale=300.0, size={UNIT_N}, random_state=np.random.default_rng(0))
t = time.perf_counter(); stats.lognorm.fit(x, floc=0); out["lognorm.fit floc=0 (closed form)"] = time.perf_counter() - t
t = time.perf_counter(); stats.rv_continuous.fit(stats.lognorm, x)
out["rv_continuous.fit (the generic Nelder-Mead fit)"] = time.perf_counter() - t
print(json.dumps(out))
"""


def unit_variants() -> dict[str, Any]:
    """The unit's fit on other seeded shapes, the closed-form fit and scipy's generic one, in one
    fresh interpreter: what the unit can read with this machine and scipy."""
    return json.loads(_fresh(_VARIANTS_CHILD).stdout)


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter without glibc malloc tuning (see the module's docstring)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})


if __name__ == "__main__":  # python benchmarks/fit_unit.py: the unit and its variants, in seconds
    print(f"fit unit: {fit_unit().wall:.4f} s wall")
    for name, value in unit_variants().items():
        print(f"{name}: {value if isinstance(value, str) else f'{value:.4f} s'}")
