"""The ``polytrace`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from analyses.warehouse import ENV_WAREHOUSE, default_root

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Unusable arguments: one clear line, exit 2."""


def _add_warehouse(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--warehouse",
        type=Path,
        default=None,
        help=f"warehouse directory (default: ${ENV_WAREHOUSE} or ./warehouse)",
    )


def _warehouse(args: argparse.Namespace) -> Path:
    return args.warehouse if args.warehouse is not None else default_root()


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="polytrace",
        description="Trace analytics for RLVR training workloads.",
        formatter_class=fmt,
        epilog="example:\n  polytrace ingest --root sample_logs && polytrace runs",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "ingest",
        help="ingest runs (directories or files) into the warehouse",
        description="Ingest each PATH as one run (a directory of logs, or a single file). Formats are "
        "detected by content. Prints, per file, the format and lines parsed/rejected/skipped.",
        formatter_class=fmt,
        epilog="examples:\n  polytrace ingest logs/run-a logs/run-b\n  polytrace ingest --root sample_logs --warehouse /tmp/wh\n"
        "  polytrace ingest train.log --run-id qwen-0.5b",
    )
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="run directory or single log file")
    p.add_argument("--root", type=Path, help="ingest every immediate subdirectory of DIR as a run")
    p.add_argument("--run-id", help="run id (only with a single PATH; default: directory name or run.toml)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress and no per-file lines")
    _add_warehouse(p)

    p = sub.add_parser(
        "query",
        help="run read-only SQL against the warehouse tables and views",
        description="Run one read-only SQL statement. Every table and view of the warehouse contract is there by name.",
        formatter_class=fmt,
        epilog='example:\n  polytrace query "SELECT run_id, count(*) FROM steps GROUP BY 1" --format csv',
    )
    p.add_argument("sql", help="the SQL statement")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    _add_warehouse(p)

    p = sub.add_parser(
        "runs",
        help="list ingested runs with their counts",
        description="One line per run: task, model, files, steps, samples, rejects.",
        formatter_class=fmt,
        epilog="example:\n  polytrace runs --warehouse /tmp/wh",
    )
    _add_warehouse(p)

    p = sub.add_parser(
        "report",
        help="write the characterization report (one self-contained HTML file)",
        description="Write one self-contained HTML file (plotly.js embedded, opens offline) with a section per "
        "characterization view, a cross-run comparison when several runs are selected, and PNGs of the key "
        "figures beside it (needs Chrome/Chromium for kaleido; without one the HTML is still complete).",
        formatter_class=fmt,
        epilog="examples:\n  polytrace report --warehouse /tmp/wh\n  polytrace report --runs run-a run-b --out cmp.html --no-png",
    )
    p.add_argument("--out", type=Path, help="HTML file to write (default: <warehouse>/polytrace_report.html)")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="runs to include (default: all)")
    p.add_argument("--png-dir", type=Path, help="where PNGs go (default: <out stem>_png beside the HTML)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG export")
    p.add_argument("--all-png", action="store_true", help="export every figure, not only the key ones")
    _add_warehouse(p)

    from analyses.fit.commands import add_fit_parsers  # fit | export | sample | fidelity

    add_fit_parsers(sub, fmt, _add_warehouse)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        handler = _HANDLERS[args.command]
        return handler(args)
    except UsageError as exc:
        print(f"polytrace {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK


def _cmd_ingest(args: argparse.Namespace) -> int:
    from analyses.catalog import refresh_catalog
    from analyses.ingest import ingest_run, iter_run_dirs
    from analyses.progress import IngestProgress

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
    root = _warehouse(args)
    show = not args.quiet
    progress = IngestProgress(enabled=show and sys.stderr.isatty())
    t0 = time.perf_counter()
    total_rejects = 0
    with progress:
        for r in runs:
            rep = ingest_run(r, root, run_id=args.run_id, progress=progress.event, refresh=False)
            total_rejects += rep.rows_rejected
            if show:
                _print_run(rep)
    refresh_catalog(root)
    if show:
        print(f"warehouse: {root.resolve()}  ({len(runs)} run(s), {total_rejects} rejected line(s), "
              f"{time.perf_counter() - t0:.1f}s)")
    return EXIT_OK


def _print_run(rep) -> None:  # noqa: ANN001 - RunReport, imported lazily
    tables = ", ".join(f"{k}={v}" for k, v in rep.table_rows.items() if v)
    print(f"run {rep.run_id}: {len(rep.files)} file(s); {tables or 'no rows'}")
    for f in rep.files:
        err = f"  [{f.status}: {f.error}]" if f.error else (f"  [{f.status}]" if f.status != "ok" else "")
        print(
            f"  {f.path}: {f.format}  lines={f.lines} parsed={f.rows_ok} rejected={f.rows_rejected} "
            f"skipped={f.rows_skipped} rows={f.rows_out}"
            + (f" superseded={f.rows_superseded}" if f.rows_superseded else "") + err
        )


def _cmd_query(args: argparse.Namespace) -> int:
    import duckdb

    from analyses.catalog import connect

    root = _warehouse(args)
    if not root.exists():
        raise UsageError(f"warehouse {root} does not exist (run `polytrace ingest` first)")
    con = connect(root)
    try:
        _refuse_writes(args.sql)
        rel = con.sql(args.sql)
    except duckdb.Error as exc:
        raise UsageError(str(exc).splitlines()[0]) from exc
    if rel is None:
        raise UsageError("the statement returned no result (only queries are allowed)")
    df = rel.pl()
    if args.format == "csv":
        sys.stdout.write(df.write_csv())
    elif args.format == "json":
        sys.stdout.write(json.dumps(df.to_dicts(), default=str, indent=None) + "\n")
    else:
        import polars as pl

        with pl.Config(tbl_rows=200, tbl_cols=40, fmt_str_lengths=80, tbl_width_chars=200):
            print(df)
    return EXIT_OK


_WRITE_WORDS = ("insert", "update", "delete", "create", "drop", "alter", "copy", "attach", "detach", "install",
                "load", "pragma", "set", "export", "import", "call", "checkpoint", "vacuum")


def _refuse_writes(sql: str) -> None:
    """The query connection is in-memory, so a write cannot reach the warehouse; refusing
    writes up front still gives a clear message instead of a silent no-op."""
    first = sql.lstrip().split(None, 1)[0].lower() if sql.strip() else ""
    if first in _WRITE_WORDS:
        raise UsageError(f"read-only: {first.upper()} statements are not allowed")


def _cmd_runs(args: argparse.Namespace) -> int:
    from analyses.catalog import connect

    root = _warehouse(args)
    if not root.exists():
        raise UsageError(f"warehouse {root} does not exist (run `polytrace ingest` first)")
    con = connect(root)
    df = con.sql(RUNS_SQL).pl()
    if df.height == 0:
        print("no runs")
        return EXIT_OK
    for r in df.iter_rows(named=True):
        print(
            f"{r['run_id']}: task={r['task'] or '-'} model={r['model'] or '-'} files={r['files']} "
            f"(errors={r['file_errors']}) steps={r['steps']} samples={r['samples']} gpu_samples={r['gpu_samples']} "
            f"rejects={r['rejects']}"
        )
    return EXIT_OK


RUNS_SQL = """
SELECT r.run_id, r.task, r.model,
       (SELECT count(*) FROM source_files f WHERE f.run_id = r.run_id) AS files,
       (SELECT count(*) FROM source_files f WHERE f.run_id = r.run_id AND f.status NOT IN ('ok', 'partial')) AS file_errors,
       (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) AS steps,
       (SELECT count(*) FROM samples s WHERE s.run_id = r.run_id) AS samples,
       (SELECT count(*) FROM gpu_samples s WHERE s.run_id = r.run_id) AS gpu_samples,
       (SELECT count(*) FROM rejects s WHERE s.run_id = r.run_id) AS rejects
FROM runs r ORDER BY r.run_id
"""

def _cmd_report(args: argparse.Namespace) -> int:
    from analyses.report import build_report

    root = _warehouse(args)
    if not root.exists():
        raise UsageError(f"warehouse {root} does not exist (run `polytrace ingest` first)")
    try:
        res = build_report(root, out=args.out, runs=args.runs, png=not args.no_png, png_dir=args.png_dir,
                           all_pngs=args.all_png)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    empty = [s.title for s in res.sections if s.empty]
    print(f"report: {res.path.resolve()}  ({len(res.sections)} section(s), {res.n_figures} figure(s))")
    if empty:
        print(f"  no data for: {', '.join(empty)}")
    if res.pngs:
        print(f"  PNGs: {len(res.pngs)} in {next(iter(res.pngs.values())).parent.resolve()}")
    elif res.png_note:
        print(f"  {res.png_note}")
    return EXIT_OK


def _cmd_fit(args: argparse.Namespace) -> int:
    from analyses.fit.commands import run

    return run(args)


_HANDLERS = {"ingest": _cmd_ingest, "query": _cmd_query, "runs": _cmd_runs, "report": _cmd_report,
             "fit": _cmd_fit, "export": _cmd_fit, "sample": _cmd_fit, "fidelity": _cmd_fit}


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    raise SystemExit(main())
