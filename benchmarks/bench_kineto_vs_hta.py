"""Our Kineto ingest and profiler-trace views vs Meta's HolisticTraceAnalysis 0.5.0, side by side.

On the shared trace set (``../shared/real_logs/kineto_traces_hta``: ``trace_filter``, two ranks of a
128-rank job, and ``nccl_parser_config``, one rank of an 8-GPU NCCL job) scaled ``--scale`` times
(default 40): each rank's trace is written N times one after the other (copy k shifted by k x the
trace's span, its ProfilerSteps renumbered, its correlation, external and flow ids offset), so the
scaled trace is a longer run of the same job, every analysis meaningful. Gzipped, level 1, under
``benchmarks/out/kineto_scaled_xN/`` (built once).

Per trace set, each in its own subprocess, one after the other in one run (so under the same load):

* HTA: ``TraceAnalysis(trace_dir=...)`` (parse) and every analysis PolyTrace mirrors, on every rank:
  get_temporal_breakdown, get_idle_time_breakdown, get_gpu_kernel_breakdown, get_comm_comp_overlap,
  get_cuda_kernel_launch_stats, get_queue_length_summary + get_time_spent_blocked_on_full_queue,
  get_memory_bw_summary, get_gpu_user_annotation_breakdown (GPU and CPU) and get_potential_stragglers
  (frequent kernel sequences left out: HTA's call graph sorts events with a Python comparator, and
  fails on ns traces; TraceDiff re-parses). HTA runs from its cached environment
  (``make conformance-env``; tests/conformance/consumers.py).
* ours, ingest: ``analyses.ingest.ingest_run`` + ``analyses.catalog.refresh_catalog`` (what
  ``PolyTrace.ingest`` runs: every table, the catalog with its views), in a process that imports
  only that; and the same through the CLI, ``polytrace ingest SET --run-id X --warehouse W``,
  whose process also imports every command (scipy for fit/fidelity/export: ~80 MB more);
* ours, views: every view of the ``profiler_trace`` group computed in full (``SELECT *`` fetched).

Peak memory is the peak RSS of the subprocess and its children (HTA parses ranks in a fork pool),
sampled every 20 ms. Run: ``.venv/bin/python benchmarks/bench_kineto_vs_hta.py [--scale 40]``; the
table goes to stdout and ``benchmarks/out/kineto_vs_hta.md``. Exit 1 when a target is missed
(ingest >= 5x faster than HTA and <= 1/4 of its peak memory).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "out"
DEFAULT_LOGS = Path(os.environ.get("POLYTRACE_REAL_LOGS", REPO.parent / "shared" / "real_logs")) / "kineto_traces_hta"
SETS = ("trace_filter", "nccl_parser_config")
TARGET_SPEED, TARGET_MEMORY = 5.0, 0.25

HTA_SCRIPT = r"""
import logging, sys, time, warnings
logging.disable(logging.CRITICAL); warnings.filterwarnings("ignore")
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
ranks = sorted(a.t.traces)
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(ranks=ranks, visualize=False)
a.get_gpu_kernel_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
a.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False)
a.get_queue_length_summary(ranks=ranks)
a.get_time_spent_blocked_on_full_queue(a.get_queue_length_time_series(ranks=ranks))
a.get_memory_bw_summary(ranks=ranks)
a.get_gpu_user_annotation_breakdown(visualize=False)
a.get_gpu_user_annotation_breakdown(use_gpu_annotation=False, visualize=False)
try:
    a.get_potential_stragglers()
except Exception:
    pass  # one rank: HTA raises
print("@@SECONDS", time.perf_counter() - t0)
"""

INGEST_SCRIPT = r"""
import sys, time
from pathlib import Path
t0 = time.perf_counter()
from analyses.catalog import refresh_catalog
from analyses.ingest import ingest_run
from analyses.views import all_views
root = Path(sys.argv[2])
ingest_run(Path(sys.argv[1]), root, run_id=sys.argv[3])
refresh_catalog(root, all_views())
print("@@SECONDS", time.perf_counter() - t0)
"""

VIEWS_SCRIPT = r"""
import sys, time
t0 = time.perf_counter()
from analyses.api import PolyTrace
from analyses.views import group
con = PolyTrace(sys.argv[1]).connect()
rows = 0
for v in group("profiler_trace").views:
    rows += con.sql(f'SELECT * FROM "{v.name}"').to_arrow_table().num_rows
print("@@SECONDS", time.perf_counter() - t0, rows)
"""


def _offsets(events: list[dict]) -> tuple[float, float, int, int, int]:
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    end = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    steps = [int(m.group(1)) for e in events if (m := re.match(r"ProfilerStep#(\d+)", str(e.get("name", ""))))]
    corr = [e["args"]["correlation"] for e in events if isinstance(e.get("args"), dict)
            and isinstance(e["args"].get("correlation"), int)]
    ext = [e["args"]["External id"] for e in events if isinstance(e.get("args"), dict)
           and isinstance(e["args"].get("External id"), int)]
    ids = [e["id"] for e in events if isinstance(e.get("id"), int)]
    span = max(end) - min(ts)
    return span + 1000.0, float(max(steps) - min(steps) + 1 if steps else 0), max(corr + ids + [0]) + 1, \
        max(ext + [0]) + 1, len(events)


def _shift(e: dict, k: int, dt: float, dstep: float, dcorr: int, dext: int) -> dict:
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + k * dt
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * dcorr
    name = e.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        e["name"] = f"ProfilerStep#{int(name[13:]) + k * int(dstep)}"
    if isinstance(e.get("args"), dict):
        a = e["args"] = dict(e["args"])
        if isinstance(a.get("correlation"), int):
            a["correlation"] += k * dcorr
        if isinstance(a.get("External id"), int):
            a["External id"] += k * dext
    return e


def scaled_trace(src: Path, n: int, dst: Path) -> int:
    """``src`` written ``n`` times in time order as one gzipped trace; returns its event count."""
    doc = json.loads(gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes())
    events = doc.pop("traceEvents")
    dt, dstep, dcorr, dext, _ = _offsets(events)
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    tmp = dst.with_suffix(".part")
    count = len(meta)
    with gzip.open(tmp, "wb", compresslevel=1) as fh:
        fh.write(json.dumps({k: v for k, v in doc.items()})[:-1].encode() + b', "traceEvents": [')
        fh.write(", ".join(json.dumps(e) for e in meta).encode())
        for k in range(n):
            fh.write(b", " + ", ".join(json.dumps(_shift(e, k, dt, dstep, dcorr, dext)) for e in body).encode())
            count += len(body)
        fh.write(b"]}")
    tmp.rename(dst)
    return count


def build_set(logs: Path, name: str, n: int) -> tuple[Path, int, float]:
    d = OUT / f"kineto_scaled_x{n}" / name
    stamp = d / ".events"
    if not stamp.exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        total = sum(scaled_trace(f, n, d / (f.name if f.suffix == ".gz" else f.name + ".gz"))
                    for f in sorted((logs / name).glob("*.json*")))
        stamp.write_text(str(total))
    mb = sum(p.stat().st_size for p in d.glob("*.gz")) / 1e6
    return d, int(stamp.read_text()), mb


@dataclass
class Run:
    wall: float  # seconds
    cpu: float  # user + system seconds of the process and its children: less sensitive to load
    mb: float  # peak RSS of the process tree
    out: str


def measure(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    t0 = time.perf_counter()
    before = os.times()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    proc, peak = psutil.Process(p.pid), 0
    while p.poll() is None:
        try:
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    after = os.times()
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({p.returncode}):\n{err[-3000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return Run(wall, cpu, peak / 2**20, out)


def _hta_python() -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from conformance import consumers

    return consumers.ensure(consumers.CONSUMERS["hta"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-logs", type=Path, default=DEFAULT_LOGS)
    ap.add_argument("--scale", type=int, default=40)
    ap.add_argument("--sets", nargs="*", default=list(SETS))
    args = ap.parse_args()
    hta_py = _hta_python()
    env = {**os.environ, "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2"), "PYTHONPATH": str(REPO)}
    hta_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    load0 = os.getloadavg()
    rows = []
    tot = {k: 0.0 for k in ("hta_s", "hta_cpu", "ing_s", "ing_cpu", "views_s", "cli_s")}
    peak = {k: 0.0 for k in ("hta", "ing", "views", "cli")}
    for name in args.sets:
        d, n_events, mb = build_set(args.real_logs, name, args.scale)
        with tempfile.TemporaryDirectory(prefix="kineto_bench_") as tmp:
            hta = measure([str(hta_py), "-c", HTA_SCRIPT, str(d)], env=hta_env, cwd=Path(tmp))
            wh = Path(tmp) / "wh"
            ing = measure([sys.executable, "-c", INGEST_SCRIPT, str(d), str(wh), name], env=env, cwd=REPO)
            views = measure([sys.executable, "-c", VIEWS_SCRIPT, str(wh)], env=env, cwd=REPO)
            cli = measure([sys.executable, "-m", "analyses.cli", "ingest", str(d), "--run-id", name,
                           "--warehouse", str(Path(tmp) / "wh_cli"), "--quiet"], env=env, cwd=REPO)
        view_rows = int(views.out.split("@@SECONDS")[1].split()[1])
        for k, v in (("hta_s", hta.wall), ("hta_cpu", hta.cpu), ("ing_s", ing.wall), ("ing_cpu", ing.cpu),
                     ("views_s", views.wall), ("cli_s", cli.wall)):
            tot[k] += v
        for k, r in (("hta", hta), ("ing", ing), ("views", views), ("cli", cli)):
            peak[k] = max(peak[k], r.mb)
        rows.append(f"| {name} x{args.scale} | {mb:.0f} | {n_events:,} | {hta.wall:.1f} ({hta.cpu:.1f}) | {hta.mb:,.0f} | "
                    f"{ing.wall:.1f} ({ing.cpu:.1f}) | {ing.mb:,.0f} | {hta.wall / ing.wall:.1f}x ({hta.cpu / ing.cpu:.1f}x) | "
                    f"{ing.mb / hta.mb:.3f} | {cli.wall:.1f} / {cli.mb:,.0f} | {views.wall:.1f} ({view_rows:,} rows) / "
                    f"{views.mb:,.0f} |")
    speed, speed_cpu = tot["hta_s"] / tot["ing_s"], tot["hta_cpu"] / tot["ing_cpu"]
    mem = peak["ing"] / peak["hta"]
    ok = speed >= TARGET_SPEED and mem <= TARGET_MEMORY
    head = ["| trace set | MB (gz) | events | HTA s wall (CPU) | HTA peak RSS MB | ours ingest s wall (CPU) | "
            "ours ingest peak RSS MB | HTA / ingest, wall (CPU) | ingest / HTA, memory | `polytrace ingest` s / peak MB | "
            "every view s / peak MB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows.append(f"| **all** | | | {tot['hta_s']:.1f} ({tot['hta_cpu']:.1f}) | {peak['hta']:,.0f} (max) | "
                f"{tot['ing_s']:.1f} ({tot['ing_cpu']:.1f}) | {peak['ing']:,.0f} (max) | **{speed:.1f}x** ({speed_cpu:.1f}x) | "
                f"**{mem:.3f}** | {tot['cli_s']:.1f} / {peak['cli']:,.0f} (max) | {tot['views_s']:.1f} / "
                f"{peak['views']:,.0f} (max) |")
    load1 = os.getloadavg()
    report = "\n".join(head + rows) + (
        f"\n\ntargets: ingest >= {TARGET_SPEED:.0f}x faster than HTA: {'PASS' if speed >= TARGET_SPEED else 'MISS'} "
        f"({speed:.1f}x wall, {speed_cpu:.1f}x CPU); peak memory <= {TARGET_MEMORY} of HTA's: "
        f"{'PASS' if mem <= TARGET_MEMORY else 'MISS'} ({mem:.3f}, the larger peak of each side); load average "
        f"{load0[0]:.1f} at the start, {load1[0]:.1f} at the end (2 cores)\n")
    print(report)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "kineto_vs_hta.md").write_text(report)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
