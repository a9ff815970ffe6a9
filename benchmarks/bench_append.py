"""Append-only refresh (issue 26, item 1): ``polytrace ingest`` of a large verl console log after
1 MB of real lines were appended, beside a full ingest of the same final file, as whole commands.

Builds a verl console log of ``--size-gb`` (default 0.6) from the real Qwen2.5-0.5B GSM8K log with
renumbered steps (:func:`bench_verl_reader.build_log`), in a temporary directory; ingests all but
its last ~``--append-mb`` MB per append (a full ingest, which records where it stopped), then for
each of ``--appends`` rounds appends the next ~1 MB of lines (ending at a newline) and times

1. ``append``: ``polytrace ingest RUN --warehouse W`` on the warehouse holding the previous version
   (it reads only the appended lines: the summary says "appended lines only");
2. ``full``:   ``polytrace ingest RUN --warehouse W2`` into an empty warehouse (every byte read).

Each is a fresh process (start-up included, as a user runs them), one after the other on the same
file with a warm page cache; the ratio append/full is unit-free. The target is <= 10 %. The same
two ingests are also timed inside a process, after its imports (``ingest_run`` alone): the
refresh's own work, without the CLI's start-up (which both commands pay alike).

With ``--v2``, the run is instead a PolyTrace v2 log directory of ``--size-gb`` of copies of the
real Search-R1 ``multiturn_workload_step_0.jsonl`` (3.4 MB, renumbered per file name), and each
round adds one more step file.

Run: ``.venv/bin/python benchmarks/bench_append.py [--size-gb 0.6] [--appends 3] [--v2]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_all import V2_STEP0, _v2_dir, as_step
from bench_verl_reader import build_log

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.10


def _ingest(run: Path, wh: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "analyses.cli", "ingest", str(run), "--warehouse", str(wh)],
                         cwd=REPO, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, out.stdout


_IN_PROCESS = """
import sys, time
from pathlib import Path
from analyses.ingest import ingest_run
t0 = time.perf_counter()
rep = ingest_run(Path(sys.argv[1]), Path(sys.argv[2]))
print(time.perf_counter() - t0, rep.mode)
"""


def _ingest_in_process(run: Path, wh: Path) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-c", _IN_PROCESS, str(run), str(wh)], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    return float(out[0]), out[1]


def _chunks(data: bytes, cut: int, n: int, size: int) -> list[bytes]:
    """``n`` pieces of about ``size`` bytes after ``cut``, each ending at a newline."""
    out = []
    for _ in range(n):
        end = data.index(b"\n", min(cut + size, len(data) - 1)) + 1
        out.append(data[cut:end])
        cut = end
    return out


def _round(run: Path, work: Path, what: str) -> tuple[float, float] | None:
    """One refresh of the grown run (``wh`` and ``whp`` hold its earlier versions) against a full
    ingest of it into a fresh warehouse, as commands and in process: (command ratio, in-process
    ratio), or None when the refresh was not append-only."""
    appended, out = _ingest(run, work / "wh")
    if "appended lines only" not in out:
        print(f"{what}: not an append-only refresh:\n{out}", file=sys.stderr)
        return None
    shutil.rmtree(work / "wh2", ignore_errors=True)
    full, _ = _ingest(run, work / "wh2")
    app_in, mode = _ingest_in_process(run, work / "whp")
    shutil.rmtree(work / "wh3", ignore_errors=True)
    full_in, _ = _ingest_in_process(run, work / "wh3")
    assert mode == "append", mode
    print(f"{what}: commands: append {appended:.2f} s, full {full:.2f} s, ratio {appended / full:.3f}; in process: "
          f"append {app_in:.2f} s, full {full_in:.2f} s, ratio {app_in / full_in:.3f}", flush=True)
    return appended / full, app_in / full_in


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=0.6)
    ap.add_argument("--append-mb", type=float, default=1.0)
    ap.add_argument("--appends", type=int, default=3)
    ap.add_argument("--v2", action="store_true", help="a v2 log directory gaining one step file per round")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="polytrace-bench-append-") as tmp:
        work = Path(tmp)
        if args.v2:
            return _v2(work, args.size_gb, args.appends)
        src = build_log(args.size_gb, out_dir=work / "src")
        data = src.read_bytes()
        size = int(args.append_mb * 1e6)
        start = data.rindex(b"\n", 0, len(data) - size * args.appends - 1) + 1
        pieces = _chunks(data, start, args.appends, size)
        run = work / "run"
        run.mkdir()
        log = run / "train.log"
        log.write_bytes(data[:start])
        del data
        src.unlink()
        first, _ = _ingest(run, work / "wh")
        _ingest_in_process(run, work / "whp")  # the in-process series' own first (full) ingest
        rows = []
        for i, piece in enumerate(pieces):
            with log.open("ab") as fh:
                fh.write(piece)
            row = _round(run, work, f"round {i}: +{len(piece) / 1e6:.2f} MB to {log.stat().st_size / 1e6:.0f} MB")
            if row is None:
                return 1
            rows.append(row)
    cmd = statistics.median(r[0] for r in rows)
    work_ratio = statistics.median(r[1] for r in rows)
    print(f"first full ingest {first:.2f} s; median append/full: commands {cmd:.3f}, in process {work_ratio:.3f} "
          f"(target <= {TARGET:.2f}); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0 if cmd <= TARGET else 1


def _v2(work: Path, size_gb: float, appends: int) -> int:
    data = V2_STEP0.read_bytes()
    n = max(1, int(size_gb * 1e9) // len(data))
    run = _v2_dir(work / "run", data, n)
    first, _ = _ingest(run, work / "wh")
    _ingest_in_process(run, work / "whp")
    rows = []
    for i in range(appends):
        (run / f"multiturn_workload_step_{n + i}.jsonl").write_bytes(as_step(data, n + i))
        row = _round(run, work, f"round {i}: +1 step file ({len(data) / 1e6:.1f} MB) to {n + i + 1} files")
        if row is None:
            return 1
        rows.append(row)
    cmd = statistics.median(r[0] for r in rows)
    print(f"v2: first full ingest {first:.2f} s; median append/full: commands {cmd:.3f}, in process "
          f"{statistics.median(r[1] for r in rows):.3f} (target <= {TARGET:.2f}); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0 if cmd <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
