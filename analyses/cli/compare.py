"""``polytrace compare A B``: what changed between two runs (or two step ranges), and by how much."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="run id, or a step range of one: RUN:FIRST-LAST (RUN:FIRST-, RUN:-LAST)")
    p.add_argument("b", metavar="B", help="the run (or step range) compared with A")
    p.add_argument("--format", choices=("table", "json", "html"), default="table",
                   help="table (terminal), json (the ranked list and what was not compared), html (one page with "
                        "the overlaid curves; see --out)")
    p.add_argument("--out", type=Path, help="html: the file to write (default: "
                                            "<warehouse>/reports/comparisons/<B>__vs__<A>.html); json: write there "
                                            "instead of stdout")
    p.add_argument("--top", type=int, default=30, help="table: rows shown (0: all; default 30)")
    p.add_argument("--no-png", action="store_true", help="html: no PNG of the curves")
    p.add_argument("--boot", type=int, default=None, help="bootstrap replicates per side (default 2000)")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    pt = warehouse(args)
    if args.boot is not None and args.boot < 100:
        raise UsageError("--boot must be at least 100")
    try:
        cmp = pt.compare(args.a, args.b, n_boot=args.boot)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    if args.format == "json":
        doc = json.dumps(cmp.to_dict(), indent=1) + "\n"
        if args.out:
            from analyses.atomic_output import write_text

            write_text(args.out, doc)  # whole or not at all
            print(f"comparison: {args.out.resolve()}")
        else:
            sys.stdout.write(doc)
    elif args.format == "html":
        res = pt.compare_report(cmp, out=args.out, png=not args.no_png)
        print(f"comparison: {res.path.resolve()}  ({len(cmp.credible)} credible difference(s) of "
              f"{len(cmp.differences)})")
        if res.pngs:
            print(f"  PNG: {next(iter(res.pngs.values())).resolve()}")
        elif res.png_note:
            print(f"  {res.png_note}")
    else:
        from analyses.compare.render import text_table

        print(text_table(cmp, top=args.top or None))
    return EXIT_OK


COMMAND = Command(
    name="compare",
    help="what changed between two runs (or step ranges), ranked, and whether it is beyond the noise",
    description="Compare two runs, or two step ranges of one run, on the steps both have: length distributions "
    "(quantiles, KS and CRPS distances), step and stage times and shares, throughput, GPU utilization, rank "
    "imbalance, truncation, filter waste, training health and alerts, run facts and config differences. Each "
    "measured difference is tested against the step-to-step variation within each side (a moving-block bootstrap "
    "over steps; Holm-adjusted) and the list is ranked biggest credible difference first. What one side lacks is "
    "said under 'not compared'.",
    epilog="examples:\n  polytrace compare run-a run-b\n  polytrace compare my-run:1-100 my-run:300-435 --format json\n"
    "  polytrace compare run-a run-b --format html --out cmp.html",
    add_arguments=_arguments,
    run=_run,
)
