"""``polytrace trace-diff``: operators and kernels added, removed and changed between two traces
(two runs, two ranks, two step ranges or two RL stages), as HTA's TraceDiff, ranked by impact."""

from __future__ import annotations

import argparse

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse

SELECTION = "RUN[:RANKS[:STEPS[:STAGE]]]"


def parse_selection(text: str) -> tuple[str, tuple[int, ...] | None, tuple[int, ...] | None, str | None]:
    """``run:0,1:3-5:update_actor`` -> (run, ranks, steps, stage); an empty part means HTA's default
    (the first rank, the first step) or any stage. Steps are a list and/or ranges, ends included."""
    parts = text.split(":")
    if not parts[0] or len(parts) > 4:
        raise UsageError(f"{text!r}: expected {SELECTION}")

    def ints(s: str, what: str) -> tuple[int, ...] | None:
        if not s:
            return None
        out: list[int] = []
        try:
            for tok in s.split(","):
                a, sep, b = tok.partition("-")
                out += list(range(int(a), int(b) + 1)) if sep else [int(a)]
        except ValueError as exc:
            raise UsageError(f"{text!r}: {what} must be numbers, lists (1,3) or ranges (3-5)") from exc
        return tuple(out)

    parts += [""] * (4 - len(parts))
    return parts[0], ints(parts[1], "ranks"), ints(parts[2], "steps"), parts[3] or None


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control", required=True, metavar=SELECTION, help="the reference selection")
    p.add_argument("--test", required=True, metavar=SELECTION, help="the selection compared with it")
    p.add_argument("--device", choices=("all", "cpu", "gpu"), default="all", help="CPU operators, GPU kernels or both")
    p.add_argument("--short-names", action="store_true", help="compare names without templates and arguments (HTA)")
    p.add_argument("--limit", type=int, default=40, help="rows printed, by impact (0: all)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    from analyses.cli.query_run import print_frame
    from analyses.trace.diff import TraceSelection, trace_diff  # duckdb-only, but kept off the CLI's start

    pt = warehouse(args)
    sel = [TraceSelection(*parse_selection(s)) for s in (args.control, args.test)]
    runs = set(pt.run_ids())
    for s in sel:
        if s.run_id not in runs:
            raise UsageError(f"no run {s.run_id!r} in {pt.location}")
    try:
        df = trace_diff(pt.connect(), sel[0], sel[1], args.device, args.short_names)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print_frame(df.head(args.limit) if args.limit else df, args.format)
    return EXIT_OK


COMMAND = Command(
    name="trace-diff",
    help="operators and kernels that changed between two profiler traces (HTA's TraceDiff)",
    description="Per operator and kernel name: counts and total seconds in the control and the test selection, "
    "their difference, HTA's category (+ - =) and change (added, deleted, increased, decreased, unchanged), "
    f"ranked by impact (absolute change in seconds). A selection is {SELECTION}: ranks and steps as lists "
    "(0,2) or ranges (3-5), empty for HTA's default (the first rank, the first step); STAGE an RL stage "
    "(gen, update_actor, ...).",
    epilog="examples:\n  polytrace trace-diff --control jobA:0 --test jobA:1          # two ranks\n"
    "  polytrace trace-diff --control jobA::3-4 --test jobB::3-4    # two runs, steps 3 and 4\n"
    "  polytrace trace-diff --control jobA:0:5:gen --test jobA:0:6:gen --device gpu",
    add_arguments=_arguments,
    run=_run,
)
