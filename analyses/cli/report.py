"""``polytrace report``: the characterization report as one self-contained HTML file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.cli.work_progress import WorkProgress


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="HTML file to write (default: <warehouse>/reports/polytrace_report.html)")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="runs to include (default: all)")
    p.add_argument("--png-dir", type=Path, help="where PNGs go (default: <out stem>_png beside the HTML)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG export")
    p.add_argument("--all-png", action="store_true", help="export every figure, not only the key ones")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    pt = warehouse(args)
    try:
        # the number of steps comes with the report's own "start" event
        with WorkProgress(not args.quiet and sys.stderr.isatty(), 0, "report", unit="steps") as bar:
            res = pt.report(out=args.out, runs=args.runs, png=not args.no_png, png_dir=args.png_dir,
                            all_pngs=args.all_png, progress=bar.event)
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


COMMAND = Command(
    name="report",
    help="write the characterization report (one self-contained HTML file)",
    description="Write one self-contained HTML file (plotly.js embedded, opens offline) with a section per "
    "characterization view group, a cross-run comparison when several runs are selected, and PNGs of the key "
    "figures beside it (needs Chrome/Chromium; without one the HTML is still complete).",
    epilog="examples:\n  polytrace report --warehouse /tmp/wh\n  polytrace report --runs run-a run-b --out cmp.html --no-png",
    add_arguments=_arguments,
    run=_run,
)
