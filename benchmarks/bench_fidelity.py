"""``polytrace fidelity --all`` over the five shared real PolyTrace runs, in fit units (target: <= 300).

The five run directories under ``../shared/real_logs/polytrace`` (verl-video 20260609_033329,
DAPO 20260610_092349 and 20260614_023133, rllm 20260616_024512, Search-R1 0617_0223) are
ingested once into ``benchmarks/out/fidelity_wh`` with ``polytrace ingest``; then ``polytrace
fidelity --all --format json`` runs in a subprocess (the command a user types, 200 seeds per
origin), timed by wall clock and by the child's CPU time (``os.wait4`` rusage). The fit unit
(``benchmarks/fit_unit.py``, in a fresh interpreter) is timed right before and after each run; the command
runs ``--repeat`` times (3) and the smallest ratio is reported, with PASS/MISS, and the fidelity
table with the criterion's targets.

Run: ``.venv/bin/python benchmarks/bench_fidelity.py [--real-logs DIR] [--seeds S]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from fit_unit import Timing, fit_unit, verdict

from analyses.fit.fidelity_table import fidelity_table

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
RUNS = (
    "verl-video/profile/packed_length_log/20260609_033329",
    "verl/profile/packed_length_log/20260610_092349",
    "verl/profile/packed_length_log/20260614_023133",
    "rllm/profile/packed_length_log/20260616_024512",
    "search_r1/profile/multiturn_workload_log/0617_0223",
)
LIMIT_UNITS = 300.0


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "analyses.cli", *args]


def ensure_warehouse(real_logs: Path, wh: Path) -> None:
    if (wh / "parquet").exists():
        return
    for r in RUNS:
        path = real_logs / "polytrace" / r
        if not path.exists():
            raise SystemExit(f"missing real run {path} (set --real-logs or POLYTRACE_REAL_LOGS)")
        subprocess.run(cli("ingest", str(path), "--warehouse", str(wh), "-q"), check=True, cwd=ROOT)


def run_child(cmd: list[str]) -> tuple[Timing, str]:
    """Run ``cmd``; its wall time, and its CPU time from this process's children's rusage."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode())
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Timing(wall, cpu), proc.stdout.decode()


def _timed_runs(real_logs: Path, repeat: int, seeds: int | None) -> list[tuple[Timing, Timing, str]]:
    """The command ``repeat`` times, the fit unit timed before and after each: the run with the
    smallest ratio first, each as (its time, the unit beside it, its JSON output). ``--no-cache``: every run
    fits every run and origin again (what a cached refresh costs is bench_incremental's subject)."""
    wh = OUT / "fidelity_wh"
    OUT.mkdir(parents=True, exist_ok=True)
    ensure_warehouse(real_logs, wh)
    cmd = cli("fidelity", "--all", "--format", "json", "--quiet", "--no-cache", "--warehouse", str(wh),
              *(["--seeds", str(seeds)] if seeds else []))
    runs = []
    for _ in range(repeat):
        before = fit_unit()
        t, out = run_child(cmd)
        after = fit_unit()
        runs.append((t, Timing((before.wall + after.wall) / 2, (before.cpu + after.cpu) / 2), out))
    return sorted(runs, key=lambda x: x[0].wall / x[1].wall)


def measure(real_logs: Path, repeat: int = 3, seeds: int | None = None) -> tuple[float, float, str]:
    """``polytrace fidelity --all --no-cache``: (wall seconds, fit units, its JSON output) of the
    best of ``repeat`` runs."""
    t, unit, out = _timed_runs(real_logs, repeat, seeds)[0]
    return t.wall, t.wall / unit.wall, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--real-logs", type=Path, default=Path(os.environ.get("POLYTRACE_REAL_LOGS", ROOT.parent / "shared" / "real_logs")))
    p.add_argument("--seeds", type=int, default=None, help="seeds per origin (default: the protocol's)")
    p.add_argument("--repeat", type=int, default=3, help="runs of the command (the smallest ratio is reported)")
    a = p.parse_args()
    runs = _timed_runs(a.real_logs, a.repeat, a.seeds)
    t, unit, out = runs[0]
    r = t / unit
    doc = json.loads(out)
    results = doc["runs"] if isinstance(doc, dict) and "runs" in doc else (doc if isinstance(doc, list) else [doc])
    print(fidelity_table(results))
    print()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print("runs (command wall s / unit wall s = ratio): "
          + ", ".join(f"{x[0].wall:.1f}/{x[1].wall:.3f} = {x[0].wall / x[1].wall:.0f}" for x in runs))
    print(f"fit unit beside the best run: {unit.wall:.3f} s wall, {unit.cpu:.3f} s CPU (mean of the unit before and after it)")
    print(f"polytrace fidelity --all ({len(results)} runs): {t.wall:.1f} s wall = {r.wall:.0f} fit units, "
          f"{t.cpu:.1f} s CPU = {r.cpu:.0f} CPU fit units; target <= {LIMIT_UNITS:.0f}: wall {verdict(r.wall, LIMIT_UNITS)}, "
          f"CPU {verdict(r.cpu, LIMIT_UNITS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
