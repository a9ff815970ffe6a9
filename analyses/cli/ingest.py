"""``polytrace ingest``: each PATH (or each run directory under --root) as one run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from analyses.cli.common import EXIT_FAIL, EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.cli.work_progress import WorkProgress

if TYPE_CHECKING:
    from analyses.api import PolyTrace
    from analyses.fanout import RunOutcome
    from analyses.ingest import RunReport
    from analyses.run_split import PlannedRun


def _arguments(p: argparse.ArgumentParser) -> None:
    from analyses.warehouse import DEFAULT_LOCK_WAIT_S

    p.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="run directory or single log file")
    p.add_argument("--root", type=Path, help="ingest every immediate subdirectory of DIR as a run")
    p.add_argument("--run-id", help="run id (only with a single PATH; default: directory name or run.toml)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress and no per-file lines")
    p.add_argument("--replace", action="store_true",
                   help="publish a run even over a run of the same id that came from another source (refused otherwise)")
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help=f"how long to wait for another ingest of the same run id (default {DEFAULT_LOCK_WAIT_S:.0f}; "
                   "0: refuse at once)")
    fan = p.add_mutually_exclusive_group()
    fan.add_argument("--workers", type=int, default=1, metavar="N",
                     help="ingest N runs at once in local processes (default 1: one after another)")
    fan.add_argument("--ray", metavar="ADDRESS",
                     help="ingest one Ray task per run on the cluster at ADDRESS ('auto': the one running here; "
                     "needs polytrace[ray])")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    from analyses.malloc_reuse import keep_freed_heap, one_arena_per_cpu

    # the command ends with its ingest: batches reuse the pages the last one freed, whichever
    # thread freed them; set before any thread starts and before Polars and DuckDB are imported
    # (their imports' own buffers are reused too)
    keep_freed_heap()
    one_arena_per_cpu()
    from analyses import duckdb_instance

    duckdb_instance.open_early()  # while Polars and the readers import: every ingest decodes or catalogs with it
    from analyses.atomic_output import WriteFailed
    from analyses.ingest import RunSourceConflict, iter_run_dirs
    from analyses.progress import IngestProgress
    from analyses.warehouse import DEFAULT_LOCK_WAIT_S, CommitRefused, RunLocked, read_published

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
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    show = not args.quiet
    plans = _plan(runs, args.run_id, show)  # every id checked before anything is written
    pt = warehouse(args, must_exist=False)
    pt.prepare()  # an object store that does not answer fails here, before any run is read
    progress = IngestProgress(enabled=show and sys.stderr.isatty())
    t0 = time.perf_counter()
    total_rejects = 0
    refused: list[str] = []

    def on_event(kind: str, data: dict) -> None:
        if kind == "lock_wait" and show:
            print(f"polytrace ingest: {data['message']}", file=sys.stderr)
        progress.event(kind, data)

    lock_wait_s = DEFAULT_LOCK_WAIT_S if args.wait is None else args.wait
    if args.workers > 1 or args.ray:
        return _run_fanout(args, pt, plans, lock_wait_s, t0)
    unwritable: str | None = None
    appended = 0  # runs whose refresh read only appended lines: their commit refreshed the catalog's tables
    refreshed = 0  # runs whose publish refreshed the catalog with every view
    with progress:
        for plan in plans:
            try:
                # the run's publish writes the catalog's views, derived ones included, at once (a
                # second write of the file at the end cost ~0.3 s of a small ingest)
                rep = pt.ingest_planned(plan, progress=on_event, refresh=True, lock_wait_s=lock_wait_s,
                                        replace=args.replace)
            except (RunLocked, RunSourceConflict) as exc:
                raise UsageError(str(exc)) from exc
            except CommitRefused as exc:
                refused.append(str(exc))
                print(f"polytrace ingest: {exc}", file=sys.stderr)
                continue
            except WriteFailed as exc:  # a full disk fails every run after it too: stop here, one line
                kept = pt.store is None and read_published(pt.root, plan.run_id) is not None
                unwritable = (f"polytrace ingest: run {plan.run_id}: not published: {exc}"
                              + ("; its previous version stays" if kept else ""))
                break
            total_rejects += rep.rows_rejected
            appended += rep.mode == "append"
            refreshed += rep.catalog_views
            if show:
                print("\n".join(rep.summary_lines()))
            if not rep.has_data:  # landed, so that its files say why, but no success
                if not plan.leftover:
                    refused.append(rep.no_data_line())
                print(f"polytrace ingest: {_no_data(rep, plan)}", file=sys.stderr)
    if unwritable is not None:
        print(unwritable, file=sys.stderr)
        return EXIT_FAIL
    # an object-store warehouse has no shared catalog file (readers build views); after appends only,
    # the derived views are there from the run's first ingest and its commit refreshed the tables;
    # after runs whose publish each left it with every view, there is nothing to do (~6 ms)
    if pt.store is None and not (appended == len(plans) and pt.catalog_path.exists()) and refreshed < len(plans):
        import duckdb

        try:
            pt.refresh_catalog()
        except (TimeoutError, OSError, duckdb.Error) as exc:  # the runs landed; only the file for other clients is stale
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"polytrace ingest: warning: catalog file {pt.catalog_path} not refreshed ({why}); the runs are "
                  "published and `polytrace query` reads them; run `polytrace ingest` again to refresh it",
                  file=sys.stderr)
    if show:
        print(f"warehouse: {pt.location}  ({len(plans)} run(s), {total_rejects} rejected line(s), "
              f"{time.perf_counter() - t0:.1f}s)")
    return EXIT_FAIL if refused else EXIT_OK


def _run_fanout(args: argparse.Namespace, pt: PolyTrace, plans: list[PlannedRun], lock_wait_s: float,
                t0: float) -> int:
    """One task per run on local processes (``--workers``) or Ray (``--ray``); the progress bar
    counts runs done, and each run's summary prints as it lands."""
    from analyses.fanout import RayUnavailable, RunTask, ingest_local, ingest_ray

    show = not args.quiet
    by_id = {p.run_id: p for p in plans}
    tasks = [RunTask.of(p, pt.location, lock_wait_s, args.replace) for p in plans]
    with WorkProgress(show and sys.stderr.isatty(), len(tasks), "ingest") as bar:
        def on_done(out: RunOutcome) -> None:
            bar.event("run_done", {"run_id": out.run_id})
            if out.report is not None and show:
                print("\n".join(out.report.summary_lines()))
            if out.report is None:
                print(f"polytrace ingest: run {out.run_id}: {out.message}", file=sys.stderr)
            elif not out.report.has_data:
                print(f"polytrace ingest: {_no_data(out.report, by_id[out.run_id])}", file=sys.stderr)

        try:
            outcomes = (ingest_ray(tasks, args.ray, on_done) if args.ray
                        else ingest_local(tasks, args.workers, on_done))
        except RayUnavailable as exc:
            raise UsageError(str(exc)) from exc
    if pt.store is None:  # an object-store warehouse has no shared catalog file: readers build views
        pt.refresh_catalog()
    failed = [o for o in outcomes if o.report is None]
    if show:
        rejects = sum(o.report.rows_rejected for o in outcomes if o.report is not None)
        engine = f"ray {args.ray}" if args.ray else f"{args.workers} workers"
        print(f"warehouse: {pt.location}  ({len(outcomes) - len(failed)} of {len(plans)} run(s) on {engine}, "
              f"{rejects} rejected line(s), {time.perf_counter() - t0:.1f}s)")
    locked = [o for o in failed if o.kind in ("locked", "source_conflict")]
    if locked:  # as in the serial ingest: another writer holding a run, or another source's run, is a usage error
        raise UsageError(locked[0].message)
    no_data = [o for o in outcomes if o.report is not None and not o.report.has_data and not by_id[o.run_id].leftover]
    return EXIT_FAIL if failed or no_data else EXIT_OK


def _no_data(rep: RunReport, plan: PlannedRun) -> str:
    """The line for a run without data; the leftover files of a split directory (parameter files,
    notes beside several logs) are said not to be a run, and fail nothing."""
    if plan.leftover:
        return f"{rep.no_data_line()} (the files of no single log beside the directory's runs: not a run)"
    return rep.no_data_line()


def _plan(paths: list[Path], forced: str | None, show: bool) -> list[PlannedRun]:
    """The runs of every PATH (a directory of several logs is several runs, analyses.run_split);
    one usage error for a bad run.toml, a bad id or two runs with one id."""
    from analyses.manifest import ManifestError, RunIdError
    from analyses.run_split import plan_runs

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
    "  polytrace ingest train.log --run-id qwen-0.5b\n"
    "  polytrace ingest --root logs --workers 4\n  polytrace ingest --root logs --ray auto",
    add_arguments=_arguments,
    run=_run,
)
