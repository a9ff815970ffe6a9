"""``polytrace fit``: fitted workload distributions per run into one versioned spec file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.cli.work_progress import WorkProgress


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", nargs="+", metavar="RUN",
                   help="runs to fit (default: every run with per-sample lengths or per-step length summaries)")
    p.add_argument("--out", type=Path, required=True, help="spec file to write")
    p.add_argument("--seed", type=int, default=0, help="seed for subsampling and model selection (default 0)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    p.add_argument("--no-cache", action="store_true",
                   help="compute again even for runs unchanged since their last result (<warehouse>/fits/cache)")
    add_warehouse(p)


def workload_line(key: str, w: dict[str, Any]) -> str:
    """One line per fitted workload: its shape and the models chosen."""
    v = w["variables"]
    r = v["response_tokens"]
    fam = r.get("family") or r["kind"]
    sel = (w.get("selection") or {}).get("selected")
    src = w.get("source") or {}
    how = (f" from summaries (n: {src.get('n_source')}" + (f"; assumed: {', '.join(src['assumed'])}" if src.get("assumed") else "")
           + ")") if src.get("kind") == "summaries" else ""
    cens = f", {r.get('n_censored', 0)} censored at {r['censor_at']:.0f}" if r.get("censor_at") else ""
    b = w["batch"]
    extra = ", ".join(k for k in v if k not in ("prompt_tokens", "response_tokens"))
    return (f"{key}: task={w['task']} samples={w['n_samples']} batch={b['prompts_per_step']}x{b['samples_per_prompt']} "
            f"dp={len(b['dp_ranks'])} response={fam}{cens} joint={w['joint']['selected']} drift={w['drift']['kind']}"
            f" step_sd={float(w['drift'].get('step_sd') or 0):.3f}" + (f" options={sel}" if sel else "")
            + (f" also: {extra}" if extra else "") + how)


def _run(args: argparse.Namespace) -> int:
    pt = warehouse(args)
    have = sorted(set(pt.runs_with_samples()) | set(pt.runs_with_summaries()))
    if args.runs:
        missing = [r for r in args.runs if r not in have]
        if missing:
            raise UsageError(f"neither per-sample lengths nor per-step length summaries for run(s): {', '.join(missing)} "
                             f"(runs with lengths: {', '.join(have) or 'none'})")
    elif not have:
        raise UsageError("no run in the warehouse has per-sample lengths or per-step length summaries to fit")
    n = len(args.runs) if args.runs else len(have)
    skipped: dict[str, str] = {}
    with WorkProgress(not args.quiet and sys.stderr.isatty(), n, "fit") as bar:
        try:
            spec = pt.fit(args.runs, seed=args.seed, out=args.out, progress=bar.event, cache=not args.no_cache,
                          skipped=None if args.runs else skipped)
        except ValueError as exc:  # a named run whose logs cannot give a workload (no batch size, ...): one line
            raise UsageError(str(exc)) from exc
    for r, why in skipped.items():
        print(f"polytrace fit: {r}: not fitted: {why}", file=sys.stderr)
    if not spec["workloads"]:
        raise UsageError("no run could be fitted")
    for key, w in spec["workloads"].items():
        print(workload_line(key, w))
    print(f"spec: {args.out.resolve()}  ({len(spec['workloads'])} workload(s), version {spec['polytrace_spec_version']})")
    return EXIT_OK


COMMAND = Command(
    name="fit",
    help="fit workload distributions per run into a PolyTrace spec (JSON)",
    description="Fit, per run x task, from per-sample records or, for a run that logged only per-step summaries (verl, "
    "TRL, Unsloth), from those (min, mean, max, clip ratio, turns; docs/spec.md 'From per-step summaries'): prompt/response lengths and latencies (the data's own body with a censored GPD "
    "tail, plus plain scipy families for PolyTrace's parameter file), turns and tool calls (pmfs), tool failures, "
    "reward time, the prompt/response dependence (group copula) and the step-to-step level of response lengths "
    "(a shrunk trend, a step random effect); options chosen by rolling origin inside the run's steps. "
    "Writes one versioned spec file (schema: analyses/export/spec.schema.json, docs/spec.md).",
    epilog="examples:\n  polytrace fit --out spec.json\n  polytrace fit --runs run-a run-b --out spec.json --warehouse /tmp/wh",
    add_arguments=_arguments,
    run=_run,
)
