"""``polytrace ingest``: each PATH (or each run directory under --root) as one run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.ingest import iter_run_dirs
from analyses.progress import IngestProgress


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="run directory or single log file")
    p.add_argument("--root", type=Path, help="ingest every immediate subdirectory of DIR as a run")
    p.add_argument("--run-id", help="run id (only with a single PATH; default: directory name or run.toml)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress and no per-file lines")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    runs: list[Path] = list(args.paths)
    if args.root is not None:
        if not args.root.is_dir():
            raise UsageError(f"--root {args.root}: not a directory")
        runs.extend(iter_run_dirs(args.root))
    if not runs:
        raise UsageError("nothing to ingest: give PATH... or --root DIR")
    for r in runs:
        if not r.exists():
            raise UsageError(f"{r}: no such file or directory")
    if args.run_id and len(runs) != 1:
        raise UsageError("--run-id needs exactly one PATH")
    pt = warehouse(args, must_exist=False)
    show = not args.quiet
    progress = IngestProgress(enabled=show and sys.stderr.isatty())
    t0 = time.perf_counter()
    total_rejects = 0
    with progress:
        for r in runs:
            rep = pt.ingest(r, run_id=args.run_id, progress=progress.event, refresh=False)
            total_rejects += rep.rows_rejected
            if show:
                print("\n".join(rep.summary_lines()))
    pt.refresh_catalog()
    if show:
        print(f"warehouse: {pt.root.resolve()}  ({len(runs)} run(s), {total_rejects} rejected line(s), "
              f"{time.perf_counter() - t0:.1f}s)")
    return EXIT_OK


COMMAND = Command(
    name="ingest",
    help="ingest runs (directories or files) into the warehouse",
    description="Ingest each PATH as one run (a directory of logs, or a single file). Formats are "
    "detected by content. Prints, per file, the format and lines parsed/rejected/skipped.",
    epilog="examples:\n  polytrace ingest logs/run-a logs/run-b\n  polytrace ingest --root sample_logs --warehouse /tmp/wh\n"
    "  polytrace ingest train.log --run-id qwen-0.5b",
    add_arguments=_arguments,
    run=_run,
)
