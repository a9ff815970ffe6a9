"""``polytrace ingest``: each PATH (or each run directory under --root) as one run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analyses.cli.common import EXIT_FAIL, EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.ingest import iter_run_dirs
from analyses.manifest import ManifestError, RunIdError
from analyses.progress import IngestProgress
from analyses.run_split import PlannedRun, plan_runs
from analyses.warehouse import DEFAULT_LOCK_WAIT_S, CommitRefused, RunLocked


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="run directory or single log file")
    p.add_argument("--root", type=Path, help="ingest every immediate subdirectory of DIR as a run")
    p.add_argument("--run-id", help="run id (only with a single PATH; default: directory name or run.toml)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress and no per-file lines")
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help=f"how long to wait for another ingest of the same run id (default {DEFAULT_LOCK_WAIT_S:.0f}; "
                   "0: refuse at once)")
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
    if args.wait is not None and args.wait < 0:
        raise UsageError("--wait must be >= 0 seconds")
    show = not args.quiet
    plans = _plan(runs, args.run_id, show)  # every id checked before anything is written
    pt = warehouse(args, must_exist=False)
    progress = IngestProgress(enabled=show and sys.stderr.isatty())
    t0 = time.perf_counter()
    total_rejects = 0
    refused: list[str] = []

    def on_event(kind: str, data: dict) -> None:
        if kind == "lock_wait" and show:
            print(f"polytrace ingest: {data['message']}", file=sys.stderr)
        progress.event(kind, data)

    with progress:
        for plan in plans:
            try:
                rep = pt.ingest_planned(plan, progress=on_event, refresh=False,
                                        lock_wait_s=DEFAULT_LOCK_WAIT_S if args.wait is None else args.wait)
            except RunLocked as exc:
                raise UsageError(str(exc)) from exc
            except CommitRefused as exc:
                refused.append(str(exc))
                print(f"polytrace ingest: {exc}", file=sys.stderr)
                continue
            total_rejects += rep.rows_rejected
            if show:
                print("\n".join(rep.summary_lines()))
    pt.refresh_catalog()
    if show:
        print(f"warehouse: {pt.root.resolve()}  ({len(plans)} run(s), {total_rejects} rejected line(s), "
              f"{time.perf_counter() - t0:.1f}s)")
    return EXIT_FAIL if refused else EXIT_OK


def _plan(paths: list[Path], forced: str | None, show: bool) -> list[PlannedRun]:
    """The runs of every PATH (a directory of several logs is several runs, analyses.run_split);
    one usage error for a bad run.toml, a bad id or two runs with one id."""
    out: list[PlannedRun] = []
    ids: dict[str, Path] = {}
    for p in paths:
        try:
            plans = plan_runs(p, forced)
        except (ManifestError, RunIdError) as exc:
            raise UsageError(f"{p}: {exc}") from exc
        if len(plans) > 1 and show:
            print(f"{p}: {len(plans)} runs: " + ", ".join(f"{r.run_id} ({r.reason})" for r in plans)
                  + "  [run.toml split = \"none\" keeps them one run]")
        for r in plans:
            if r.run_id in ids:
                raise UsageError(f"{ids[r.run_id]} and {p} both hold run {r.run_id!r}; give one of them another "
                                 "run_id in run.toml")
            ids[r.run_id] = p
            out.append(r)
    return out


COMMAND = Command(
    name="ingest",
    help="ingest runs (directories or files) into the warehouse",
    description="Ingest each PATH as a run (a directory of logs, or a single file); a directory holding several "
    "separate logs (verl console logs whose steps each start over, wandb run-* folders, PolyTrace v2 log "
    "directories) is one run per log, and says so (run.toml split = \"none\" | \"each\" | \"auto\" forces it). "
    "Formats are detected by content. Prints, per file, the format and lines parsed/rejected/skipped.",
    epilog="examples:\n  polytrace ingest logs/run-a logs/run-b\n  polytrace ingest --root sample_logs --warehouse /tmp/wh\n"
    "  polytrace ingest train.log --run-id qwen-0.5b",
    add_arguments=_arguments,
    run=_run,
)
