"""Our Kineto reader vs Meta's HolisticTraceAnalysis (HTA) on HTA's own sample traces.

For each trace set (a directory of per-rank traces) it runs, each in its own subprocess:

* HTA: ``TraceAnalysis(trace_dir=...)`` (parse) + ``get_temporal_breakdown(visualize=False)``,
  from a separate venv (``benchmarks/out/hta-venv``, created with ``pip install
  HolisticTraceAnalysis`` when missing: a benchmark-only dependency, never a runtime one);
* ours: :func:`analyses.readers.kineto.load_rank_events` (streaming parse) + the per-step
  ``rank_times`` rows the reader emits + the whole-trace breakdown over HTA's window
  (:func:`analyses.kineto_breakdown.hta_window`: GPU work launched before the last ProfilerStep).

and prints, per rank, HTA's idle / compute / non-compute / kernel time next to ours with the %
difference, and the time ratio. Run: ``.venv/bin/python benchmarks/bench_kineto_vs_hta.py``
(``--real-logs DIR`` to point elsewhere; ``--repeat N`` to take the best of N runs).

``--scale N [N ...]`` also builds, per N, a trace holding the ``nccl_data`` events N times
(``benchmarks/out/kineto_scaled_xN.json.gz``; copies share timestamps, so only speed and memory
are meaningful) and reports time and peak RSS of both tools on it (``--hta-max-scale`` bounds
the N HTA is run on: its pandas frames need several GB beyond that).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "out"
HTA_VENV = OUT / "hta-venv"
HTA_PY = HTA_VENV / "bin" / "python"
DEFAULT_LOGS = REPO.parent / "shared" / "real_logs" / "kineto_traces_hta"
SETS = {"trace_filter": "trace_filter", "nccl_parser_config": "nccl_parser_config"}

HTA_SCRIPT = r"""
import json, sys, time, logging
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
df = a.get_temporal_breakdown(visualize=False)
t2 = time.perf_counter()
rows = {int(r["rank"]): {"idle_us": float(r["idle_time(us)"]), "compute_us": float(r["compute_time(us)"]),
        "non_compute_us": float(r["non_compute_time(us)"]), "kernel_us": float(r["kernel_time(us)"])}
        for r in df.to_dict("records")}
import resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("@@RESULT" + json.dumps({"ranks": rows, "import_s": t1 - t0, "work_s": t2 - t1, "rss_mb": rss}))
"""

OURS_SCRIPT = r"""
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from analyses.kineto_breakdown import assign_steps, breakdown, hta_window, step_rows
from analyses.readers.kineto import load_rank_events, rank_of
t1 = time.perf_counter()
import resource
rows, per_step = {}, {}
for f in sorted(Path(sys.argv[1]).iterdir()):
    ev = load_rank_events(f)
    g = assign_steps(ev.gpu, ev.launches, ev.steps)
    steps = step_rows(g, ev.steps)  # what the reader stores in rank_times
    w = breakdown(hta_window(g, ev.steps), []).row(0, named=True)
    r = rank_of(ev.metadata, f)
    rows[r] = {"idle_us": w["gpu_idle"] * 1e6, "compute_us": w["compute"] * 1e6,
               "non_compute_us": w["non_compute"] * 1e6, "kernel_us": w["gpu_span"] * 1e6}
    per_step[r] = steps.to_dicts()
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("@@RESULT" + json.dumps({"ranks": rows, "steps": per_step, "import_s": t1 - t0, "work_s": t2 - t1, "rss_mb": rss}))
"""


def ensure_hta_venv() -> None:
    if HTA_PY.exists():
        return
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
    subprocess.run([str(HTA_VENV / "bin" / "pip"), "install", "--quiet", "HolisticTraceAnalysis"], check=True)


def run(py: Path | str, script: str, trace_dir: Path, cwd: Path) -> tuple[dict, float]:
    env = {
        **os.environ,
        "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "2"),
        "PYTHONPATH": str(REPO),
    }
    t0 = time.perf_counter()
    p = subprocess.run(
        [str(py), "-c", script, str(trace_dir)], capture_output=True, text=True, cwd=cwd, env=env
    )
    wall = time.perf_counter() - t0
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("@@RESULT")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{py} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[len("@@RESULT") :]), wall


def scaled_trace(src: Path, n: int, dst: Path) -> Path:
    """``src``'s events written ``n`` times into one gzipped trace (streamed out, level 1)."""
    if dst.exists():
        return dst
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = json.dumps(doc.pop("traceEvents"))[1:-1].encode()
    head = json.dumps(doc)[:-1].encode() + b', "traceEvents": ['
    tmp = dst.with_suffix(".part")
    with gzip.open(tmp, "wb", compresslevel=1) as fh:
        fh.write(head)
        for i in range(n):
            fh.write(events if i == 0 else b", " + events)
        fh.write(b"]}")
    tmp.rename(dst)
    return dst


def pct(ours: float, ref: float) -> float:
    if ref == 0:
        return 0.0 if ours == 0 else float("inf")
    d = 100.0 * (ours - ref) / ref
    return 0.0 if abs(d) < 5e-4 else d  # float noise from the µs -> s -> µs round trip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-logs", type=Path, default=DEFAULT_LOGS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", type=int, nargs="*", default=[])
    ap.add_argument("--hta-max-scale", type=int, default=10)
    args = ap.parse_args()
    ensure_hta_venv()
    lines = [
        "| trace set | rank | metric | HTA (µs) | ours (µs) | diff % |",
        "|---|---|---|---:|---:|---:|",
    ]
    timing = [
        "| trace set | HTA parse+breakdown (s) | ours parse+breakdown (s) | HTA / ours | HTA subprocess wall (s) | ours subprocess wall (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    worst = 0.0
    for label, sub in SETS.items():
        src = args.real_logs / sub
        with tempfile.TemporaryDirectory(prefix="kineto_bench_") as tmp:
            d = Path(tmp) / label
            d.mkdir()
            for f in sorted(src.glob("*.json*")):  # HTA wants a directory holding only rank traces
                (d / f.name).symlink_to(f.resolve())
            hta_runs = [run(HTA_PY, HTA_SCRIPT, d, Path(tmp)) for _ in range(args.repeat)]
            our_runs = [run(sys.executable, OURS_SCRIPT, d, REPO) for _ in range(args.repeat)]
        hta, hta_wall = min(hta_runs, key=lambda r: r[0]["work_s"])
        ours, our_wall = min(our_runs, key=lambda r: r[0]["work_s"])
        for rank in sorted(hta["ranks"], key=int):
            h, o = hta["ranks"][rank], ours["ranks"][str(rank)]
            for m in ("idle_us", "compute_us", "non_compute_us", "kernel_us"):
                d_ = pct(o[m], h[m])
                worst = max(worst, abs(d_))
                lines.append(
                    f"| {label} | {rank} | {m.removesuffix('_us')} | {h[m]:,.0f} | {o[m]:,.0f} | {d_:+.3f} |"
                )
        timing.append(
            f"| {label} | {hta['work_s']:.3f} | {ours['work_s']:.3f} | {hta['work_s'] / ours['work_s']:.1f}x "
            f"| {hta_wall:.2f} | {our_wall:.2f} |"
        )
    scale = [
        "| trace | size (MB gz / MB json) | events | HTA s | HTA peak RSS MB | ours s | ours peak RSS MB | HTA / ours |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in args.scale:
        src = args.real_logs / "nccl_parser_config" / "nccl_data.json.gz"
        f = scaled_trace(src, n, OUT / f"kineto_scaled_x{n}.json.gz")
        with tempfile.TemporaryDirectory(prefix="kineto_scale_") as tmp:
            d = Path(tmp) / "scaled"
            d.mkdir()
            (d / "rank-0.json.gz").symlink_to(f)
            ours, _ = run(sys.executable, OURS_SCRIPT, d, REPO)
            hta = run(HTA_PY, HTA_SCRIPT, d, Path(tmp))[0] if n <= args.hta_max_scale else None
        with open(f, "rb") as fh:  # gzip trailer: uncompressed size mod 2**32
            fh.seek(-4, 2)
            raw_mb = int.from_bytes(fh.read(4), "little") / 1e6
        h_s = f"{hta['work_s']:.1f}" if hta else "not run"
        h_m = f"{hta['rss_mb']:.0f}" if hta else "-"
        ratio = f"{hta['work_s'] / ours['work_s']:.1f}x" if hta else "-"
        scale.append(
            f"| nccl_data x{n} | {f.stat().st_size / 1e6:.0f} / {raw_mb:.0f} | {40573 * n:,} | {h_s} | {h_m} "
            f"| {ours['work_s']:.1f} | {ours['rss_mb']:.0f} | {ratio} |"
        )
    report = "\n".join(lines) + f"\n\nworst |diff| = {worst:.3f} %\n\n" + "\n".join(timing) + "\n"
    if args.scale:
        report += "\n" + "\n".join(scale) + "\n"
    print(report)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "kineto_vs_hta.md").write_text(report)
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
