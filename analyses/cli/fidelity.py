"""``polytrace fidelity``: generated workloads scored against a run's held-out steps."""

from __future__ import annotations

import argparse
import json
import sys

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.fit.fidelity import DEFAULT_SEEDS
from analyses.fit.fidelity_table import fidelity_table


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="*", metavar="RUN", help="run id(s)")
    p.add_argument("--all", action="store_true", help="every run with per-sample lengths")
    p.add_argument("--seeds", type=int, default=None,
                   help="number of seeds averaged per method (default: the protocol's 200, see docs/spec.md)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    pt = warehouse(args)
    have, timed = pt.runs_with_samples(), pt.runs_with_steps()
    runs = sorted(set(have) | set(timed)) if args.all else list(args.runs)
    if not runs:
        raise UsageError("give RUN... or --all")
    missing = [r for r in runs if r not in have and r not in timed]
    if missing:
        raise UsageError(f"neither per-sample lengths nor step times for run(s): {', '.join(missing)}")
    if args.seeds is not None and args.seeds < 1:
        raise UsageError("--seeds must be >= 1")
    seeds = DEFAULT_SEEDS if args.seeds is None else tuple(range(args.seeds))
    results = []
    for r in runs:
        try:
            res = pt.fidelity(r, seeds=seeds)
        except ValueError as exc:  # too little data to split, fit or score: say so, score the rest
            print(f"polytrace fidelity: {r}: cannot score: {exc}", file=sys.stderr)
            continue
        if res is not None:
            results.append(res)
    if not results:
        raise UsageError("no run could be scored")
    if args.format == "json":
        out = [{k: v for k, v in r.items() if k != "real_per_step"} for r in results]
        sys.stdout.write(json.dumps(out if len(out) > 1 else out[0], indent=1) + "\n")
    else:
        print(fidelity_table(results))
    return EXIT_OK


COMMAND = Command(
    name="fidelity",
    help="score generated workloads against a run's held-out steps (ours vs PolyTrace's histogram)",
    description="Fit on the first two thirds of a run's steps, generate the held-out steps with several seeds, "
    "and compare per-step total tokens, longest and p99 response, rollout makespan (and turns, tool time). "
    "Accuracy = 100% - MAPE. The same score for PolyTrace's 20-bin histogram resampler is shown beside it.",
    epilog="examples:\n  polytrace fidelity run-a\n  polytrace fidelity --all --format json --warehouse /tmp/wh",
    add_arguments=_arguments,
    run=_run,
)
