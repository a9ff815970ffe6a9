"""Adding one run to a warehouse of N fitted runs: the cross-run refresh with the per-run fit
cache (``analyses/fit/cache.py``) beside the same refresh computing every run again.

For each N (default 1, 8, 32) a warehouse is built under ``benchmarks/out/incremental_<N>`` from
N copies of one run under new ids (default ``sample_logs/polytrace-math-dapo``, 1,280 samples
over 10 steps; ``--run DIR`` for another), refreshed once (``PolyTrace.fit_warehouse``: every
run's spec and rolling-origin fidelity), then one more copy is ingested and the refresh is timed
twice: with the cache (what ``polytrace fit``/``fidelity`` and the Dagster ``workload_specs``
asset do) and with every run computed again (``cache=False``, the behaviour before the cache).
The ratios are unit-free (both refreshes run on the same warehouse, one after the other); the
target of the performance issue is that adding a run costs about one run's fit, not N.

Run: ``.venv/bin/python benchmarks/bench_incremental.py [--sizes 1 8 32] [--run DIR]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from fit_unit import timed

from analyses.api import PolyTrace

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"


def measure(n: int, run: Path, adds: int = 1) -> tuple[float, list[float], float]:
    """A warehouse of ``n`` fitted copies of ``run``: (first refresh s, [refresh s after adding one
    more run] x ``adds``, refresh s with every run computed again after the last add)."""
    wh = OUT / f"incremental_{n}"
    shutil.rmtree(wh, ignore_errors=True)
    pt = PolyTrace(wh)
    for i in range(n):
        pt.ingest(run, run_id=f"run-{i:04d}", refresh=False)
    first, _ = timed(pt.fit_warehouse)
    cached = []
    for i in range(n, n + adds):
        pt.ingest(run, run_id=f"run-{i:04d}", refresh=False)
        cached.append(timed(pt.fit_warehouse)[0].wall)
    full, _ = timed(lambda: pt.fit_warehouse(cache=False))
    return first.wall, cached, full.wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--run", type=Path, default=ROOT / "sample_logs" / "polytrace-math-dapo")
    args = ap.parse_args(argv)
    print(f"run copied: {args.run}", flush=True)
    rows = []
    for n in args.sizes:
        first, (cached,), full = measure(n, args.run)
        rows.append((n, first, cached, full))
        print(f"N={n}: first refresh {first:.1f} s; after adding one run: cached {cached:.1f} s, "
              f"all recomputed {full:.1f} s", flush=True)
    print("\nadding one run to N fitted runs (wall seconds)")
    print(f"{'N':>4} {'first refresh':>14} {'+1 cached':>10} {'+1 all again':>13} {'cached/all':>11} {'cached/1-run':>13}")
    for n, first, cached, full in rows:
        one_run = full / (n + 1)  # "all again" fits and scores the N + 1 runs
        print(f"{n:>4} {first:>12.1f} s {cached:>8.1f} s {full:>11.1f} s {cached / full:>11.2f} {cached / one_run:>13.2f}")
    print("\ncached/1-run: the refresh after adding a run, over the cost of fitting and scoring one run "
          "(target: about 1, whatever N)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
