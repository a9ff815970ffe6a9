"""Fan-out of the ingest: N runs through the serial ingest, ``--workers 2`` and ``--ray auto``.

Runs are copies of the real verl console logs (``../shared/real_logs/verl/*.log``, 160-600 KB
each) under new run ids, built under ``/tmp/polytrace-fanout`` (never in the repository). Each
engine is one ``polytrace ingest --root`` subprocess, timed wall-clock; the tables of every
engine are checked identical (rows per table and run, from the manifests). A fit
``T(N) = a + b*N`` per engine gives the start-up ``a`` and the per-run cost ``b``; the per-run
overhead of an engine with ``w`` slots is ``b - b_serial / w`` (what it costs beyond a perfect
split of the serial work). From these, a projection for 1,000 runs x 1 GB on a 32-node Ray
cluster, its assumptions printed with it.

    .venv/bin/python benchmarks/bench_fanout.py                 # N = 8, 32
    .venv/bin/python benchmarks/bench_fanout.py --n 8 32 128

Ray is started here as a two-CPU head on 127.0.0.1 (own temp dir; stopped with its process
group at the end), and ``--ray auto`` finds it through ``RAY_ADDRESS``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = Path(os.environ.get("POLYTRACE_REAL_LOGS", REPO.parent / "shared" / "real_logs"))
WORK = Path("/tmp/polytrace-fanout")
# measured by benchmarks/bench_verl_reader.py on this machine (benchmarks/README.md, "After"):
# the verl console reader spends 4.12 CPU-s per GB
READER_CPU_S_PER_GB = 4.12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_runs(n: int) -> tuple[Path, int]:
    """``n`` run directories, each a copy of one real verl log with its own run id; total bytes."""
    templates = sorted((REAL / "verl").glob("*.log"))
    if not templates:
        sys.exit(f"no real verl logs under {REAL / 'verl'}")
    root = WORK / f"runs-{n}"
    shutil.rmtree(root, ignore_errors=True)
    total = 0
    for i in range(n):
        d = root / f"fan-{i:04d}"
        d.mkdir(parents=True)
        src = templates[i % len(templates)]
        shutil.copyfile(src, d / "train.log")
        (d / "run.toml").write_text(f'run_id = "fan-{i:04d}"\n')
        total += src.stat().st_size
    return root, total


def start_ray() -> tuple[subprocess.Popen, str, str]:
    tmp = tempfile.mkdtemp(prefix="/tmp/raybf")
    port = free_port()
    ports = [free_port() for _ in range(6)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--num-cpus", "2",
         "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir", tmp, "--include-dashboard", "false",
         "--disable-usage-stats", "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
         "--dashboard-agent-listen-port", str(ports[2]), "--dashboard-agent-grpc-port", str(ports[3]),
         "--metrics-export-port", str(ports[4]), "--runtime-env-agent-port", str(ports[5])],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"127.0.0.1:{port}", tmp
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("ray start failed")
            time.sleep(0.5)


def stop_ray(proc: subprocess.Popen, tmp: str) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
    shutil.rmtree(tmp, ignore_errors=True)


def ingest(root: Path, wh: Path, extra: list[str], env: dict[str, str]) -> float:
    shutil.rmtree(wh, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "analyses.cli", "ingest", "--root", str(root), "--warehouse", str(wh),
                    "-q", *extra], check=True, env=env, cwd=REPO)
    return time.perf_counter() - t0


def rows(wh: Path) -> dict[tuple[str, str], int]:
    sys.path.insert(0, str(REPO))
    from analyses.warehouse import published_runs

    return {(r, t): m.rows(t) for r, m in published_runs(wh).items() for t in m.tables}


def fit_line(ns: list[int], ts: list[float]) -> tuple[float, float]:
    """Least squares ``t = a + b*n`` (exact through two points)."""
    k = len(ns)
    mn, mt = sum(ns) / k, sum(ts) / k
    b = sum((n - mn) * (t - mt) for n, t in zip(ns, ts, strict=True)) / sum((n - mn) ** 2 for n in ns)
    return mt - b * mn, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[8, 32])
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    ray_proc, address, ray_tmp = start_ray()
    engines = {"serial": ([], 1), "workers 2": (["--workers", "2"], 2), "ray auto (2 CPUs)": (["--ray", "auto"], 2)}
    times: dict[str, list[float]] = {e: [] for e in engines}
    sizes = {}
    try:
        env_ray = {**env, "RAY_ADDRESS": address}
        for n in args.n:
            root, total = build_runs(n)
            sizes[n] = total
            got = {}
            for name, (extra, _) in engines.items():
                wh = WORK / f"wh-{n}-{name.split()[0]}"
                times[name].append(ingest(root, wh, extra, env_ray if "ray" in name else env))
                got[name] = rows(wh)
            assert all(g == got["serial"] for g in got.values()), "engines published different tables"
            print(f"N={n}: {', '.join(f'{k} {v[-1]:.1f}s' for k, v in times.items())} (tables identical)", flush=True)
    finally:
        stop_ray(ray_proc, ray_tmp)

    load = os.getloadavg()
    print(f"\nmachine: {os.cpu_count()} CPUs, load average after the runs {load[0]:.1f}; "
          f"runs: copies of {len(sorted((REAL / 'verl').glob('*.log')))} real verl console logs, "
          f"{sizes[args.n[0]] / args.n[0] / 1e3:.0f} KB each on average\n")
    print("| engine | " + " | ".join(f"N={n} wall s" for n in args.n) + " | start-up a (s) | per run b (s) "
          "| overhead per run (s) | speed-up at N=max |")
    print("|---|" + "---:|" * (len(args.n) + 4))
    a_s, b_s = fit_line(args.n, times["serial"])
    fits = {}
    for name, (_, w) in engines.items():
        a, b = fit_line(args.n, times[name])
        fits[name] = (a, b, w)
        over = b - b_s / w
        print(f"| {name} | " + " | ".join(f"{t:.1f}" for t in times[name]) +
              f" | {a:.2f} | {b:.3f} | {over:+.3f} | {times['serial'][-1] / times[name][-1]:.2f}x |")

    # ---- projection: 1,000 runs x 1 GB on 32 nodes
    a_r, b_r, w_r = fits["ray auto (2 CPUs)"]
    per_run_overhead = max(b_r - b_s / w_r, 0.0) * w_r  # seconds of a slot per run beyond the work itself
    fixed_per_run = b_s - (sizes[args.n[-1]] / args.n[-1]) / 1e9 * READER_CPU_S_PER_GB  # serial cost not due to bytes
    nodes, slots_per_node, runs, gb = 32, 8, 1000, 1.0
    upload_s = gb * 0.10 * 8 / 1.0  # Parquet ~10% of the log bytes, 1 Gbit/s per task to the store
    task_s = gb * READER_CPU_S_PER_GB * 2.5 + fixed_per_run + per_run_overhead + upload_s
    waves = -(-runs // (nodes * slots_per_node))
    total = a_r + waves * task_s
    print(f"""
Projection: {runs} runs x {gb:.0f} GB on a {nodes}-node Ray cluster
  assumptions: {slots_per_node} concurrent ingest tasks per node (a 1 GB run peaks at ~0.6 GB RSS in the reader,
  benchmarks/README.md; memory, not cores, bounds it); per task, the reader's {READER_CPU_S_PER_GB} CPU-s/GB
  (bench_verl_reader) x 2.5 for the rest of the ingest (conform, compact, checks; ASSUMED, not measured at
  1 GB here) = {gb * READER_CPU_S_PER_GB * 2.5:.1f} s; the measured fixed cost per run
  {fixed_per_run:.2f} s and the measured Ray overhead per run {per_run_overhead:.2f} s; the upload of ~{gb * 0.1:.1f} GB
  of Parquet at 1 Gbit/s = {upload_s:.1f} s; the logs already on the nodes (or read from the store at the same rate).
  per task: {task_s:.1f} s; {waves} wave(s) of {nodes * slots_per_node} tasks; plus the measured start-up {a_r:.1f} s
  => about {total:.0f} s ({total / 60:.1f} min) for the whole fan-out, vs {runs * (gb * READER_CPU_S_PER_GB * 2.5
  + b_s):.0f} s ({runs * (gb * READER_CPU_S_PER_GB * 2.5 + b_s) / 3600:.1f} h) serial on one core.""")


if __name__ == "__main__":
    main()
