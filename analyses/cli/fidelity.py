"""``polytrace fidelity``: our generator and PolyTrace's histogram resampler scored by rolling
origin over a run's steps (CRPS skill, 90% coverage, KS of sample shape)."""

from __future__ import annotations

import argparse
import json
import sys

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.cli.work_progress import WorkProgress


def _arguments(p: argparse.ArgumentParser) -> None:
    from analyses.fit.fidelity import DEFAULT_SEEDS

    p.add_argument("runs", nargs="*", metavar="RUN", help="run id(s)")
    p.add_argument("--all", action="store_true", help="every run with per-sample lengths (or a step log)")
    p.add_argument("--seeds", type=int, default=None,
                   help=f"seeds per generator and origin (default: the protocol's {len(DEFAULT_SEEDS)}, see docs/spec.md)")
    p.add_argument("--from-summaries", action="store_true",
                   help="also fit each run from its per-step summaries alone (computed from its samples as verl prints "
                   "them) and score that fit beside the per-sample one (block summary_fit; docs/spec.md)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    p.add_argument("--no-cache", action="store_true",
                   help="compute again even for runs unchanged since their last result (<warehouse>/fits/cache)")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    from analyses.fit.fidelity import DEFAULT_SEEDS
    from analyses.fit.fidelity_table import criterion, fidelity_table, summary_criterion

    pt = warehouse(args)
    have, timed = pt.runs_with_samples(), pt.runs_with_steps()
    if args.from_summaries:  # the proof needs the truth: runs with per-sample lengths only
        timed = []
        if not args.all and any(r not in have for r in args.runs):
            raise UsageError(f"--from-summaries needs per-sample lengths (the truth to score against): "
                             f"{', '.join(r for r in args.runs if r not in have)}")
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
    with WorkProgress(not args.quiet and sys.stderr.isatty(), len(runs), "fidelity") as bar:
        for r in runs:
            try:
                res = pt.fidelity(r, seeds=seeds, progress=bar.event, cache=not args.no_cache,
                                  from_summaries=args.from_summaries)
            except ValueError as exc:  # too little data to split, fit or score: say so, score the rest
                print(f"polytrace fidelity: {r}: cannot score: {exc}", file=sys.stderr)
                continue
            finally:
                if r not in have:  # step-time-only runs send no events of their own
                    bar.event("run_done", {"run_id": r})
            if res is not None:
                results.append(res)
    if not results:
        raise UsageError("no run could be scored")
    if args.format == "json":
        doc: object = results if len(results) > 1 else results[0]
        if len(results) > 1:
            doc = {"runs": results, "criterion": criterion(results)}
            if args.from_summaries:
                doc["summary_criterion"] = summary_criterion(results)
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        print(fidelity_table(results))
    return EXIT_OK


COMMAND = Command(
    name="fidelity",
    help="score generated workloads by rolling origin (ours vs PolyTrace's histogram resampler)",
    description="For every origin with at least 2 full steps up to it, fit our generator and PolyTrace's 20-bin "
    "histogram resampler on those steps, generate the next step (and the one after) with many seeds, and score "
    "each per-step statistic (total tokens, longest and p99 response, rollout makespan; turns and tool time) by "
    "CRPS skill over the histogram and 90% interval coverage, and the per-sample shape by KS. Partial steps are "
    "never fitted or scored; runs with fewer than 3 full steps are scored on prompt-group pseudo-steps.",
    epilog="examples:\n  polytrace fidelity run-a\n  polytrace fidelity --all --format json --warehouse /tmp/wh\n"
    "  polytrace fidelity --all --from-summaries --format json   # the fit from summaries, scored where the truth is known",
    add_arguments=_arguments,
    run=_run,
)
