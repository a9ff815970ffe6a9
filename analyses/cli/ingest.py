"""``polytrace ingest``: each PATH (or each run directory under --root) as one run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analyses.cli.common import EXIT_FAIL, EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.ingest import iter_run_dirs, resolve_run_id
from analyses.manifest import ManifestError, RunIdError, load_manifest
from analyses.progress import IngestProgress
from analyses.run_split import plan_runs
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
    runs, forced = _expand(runs, args.run_id, show)
    ids = _run_ids(runs, forced)  # every id checked before anything is written
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
        for r, rid in zip(runs, ids, strict=True):
            try:
                rep = pt.ingest(r, run_id=rid, progress=on_event, refresh=False,
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
        print(f"warehouse: {pt.root.resolve()}  ({len(runs)} run(s), {total_rejects} rejected line(s), "
              f"{time.perf_counter() - t0:.1f}s)")
    return EXIT_FAIL if refused else EXIT_OK


def _expand(paths: list[Path], forced: str | None, show: bool) -> tuple[list[Path], list[str | None]]:
    """Each PATH as its runs (:func:`analyses.run_split.plan_runs`: a directory of several runs
    becomes one run each, and the ingest says so); ``--run-id`` keeps its PATH one run."""
    runs: list[Path] = []
    ids: list[str | None] = []
    for p in paths:
        try:
            plan = plan_runs(p.resolve()) if forced is None else None
        except ManifestError as exc:
            raise UsageError(f"{p}: {exc}") from exc
        if plan is not None and plan.split:
            if show:
                print(f"{p}: {plan.reason}: {len(plan.runs)} runs ({', '.join(r.run_id for r in plan.runs)})")
            runs += [r.path for r in plan.runs]
            ids += [r.run_id for r in plan.runs]
            continue
        if plan is not None and plan.note and show:
            print(f"{p}: {plan.note}")
        runs.append(p)
        ids.append(forced)
    return runs, ids


def _run_ids(runs: list[Path], forced: list[str | None]) -> list[str]:
    """The run id of each PATH; one usage error for a bad run.toml, a bad id or two PATHs with one id."""
    ids: dict[str, Path] = {}
    for r, f in zip(runs, forced, strict=True):
        try:
            rid = resolve_run_id(r.resolve(), load_manifest(r.resolve()), f)
        except (ManifestError, RunIdError) as exc:
            raise UsageError(f"{r}: {exc}") from exc
        if rid in ids:
            raise UsageError(f"{ids[rid]} and {r} are both run {rid!r}; give one of them another run_id in run.toml")
        ids[rid] = r
    return list(ids)


COMMAND = Command(
    name="ingest",
    help="ingest runs (directories or files) into the warehouse",
    description="Ingest each PATH as one run (a directory of logs, or a single file). A directory whose files are "
    "separate runs (several wandb run-* folders, PolyTrace workload directories side by side, several console logs "
    "whose steps each start over) becomes one run each, and the ingest says so; split_runs in run.toml forces either. "
    "Formats are detected by content. Prints, per file, the format and lines parsed/rejected/skipped.",
    epilog="examples:\n  polytrace ingest logs/run-a logs/run-b\n  polytrace ingest --root sample_logs --warehouse /tmp/wh\n"
    "  polytrace ingest train.log --run-id qwen-0.5b",
    add_arguments=_arguments,
    run=_run,
)
