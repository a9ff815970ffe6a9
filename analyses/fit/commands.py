"""``polytrace fit | export | sample | fidelity``: parsers and handlers, wired into
:mod:`analyses.cli`. Heavy imports (scipy, the fitting modules) happen inside the handlers."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXPORT_FORMATS = ("polytrace-v2", "polytrace-v1", "polytrace-params", "vidur", "mooncake", "aiperf")
COMMANDS = ("fit", "export", "sample", "fidelity")


def add_fit_parsers(sub: Any, fmt: type[argparse.HelpFormatter], add_warehouse: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "fit",
        help="fit workload distributions per run into a PolyTrace spec (JSON)",
        description="Fit, per run x task, prompt/response lengths (censored MLE over candidate families, AIC, "
        "KS/Wasserstein/tail errors), turns and tool calls (pmfs), tool latency (body + GPD tail), reward time, "
        "the prompt/response dependence (copula or mixture) and the response-length drift across steps. "
        "Writes one versioned spec file (schema: analyses/fit/spec.schema.json, docs/spec.md).",
        formatter_class=fmt,
        epilog="examples:\n  polytrace fit --out spec.json\n  polytrace fit --runs run-a run-b --out spec.json --warehouse /tmp/wh",
    )
    p.add_argument("--runs", nargs="+", metavar="RUN", help="runs to fit (default: every run with samples)")
    p.add_argument("--out", type=Path, required=True, help="spec file to write")
    p.add_argument("--seed", type=int, default=0, help="seed for subsampling and model selection (default 0)")
    add_warehouse(p)

    p = sub.add_parser(
        "export",
        help="write a spec's workloads in another tool's format",
        description="Write every workload of SPEC in FORMAT under DIR (one subdirectory per workload when the spec "
        "has several). Sample-based formats generate --steps steps with --seed; the same seed gives the same bytes.",
        formatter_class=fmt,
        epilog="formats: " + ", ".join(EXPORT_FORMATS) + "\nexamples:\n  polytrace export --spec spec.json --format polytrace-v2 --out gen/\n"
        "  polytrace export --spec spec.json --format vidur --out vidur/ --steps 10 --step-interval-s 120",
    )
    _export_args(p, required_format=True)

    p = sub.add_parser(
        "sample",
        help="regenerate N steps of workload from a spec (seeded, byte-identical per seed)",
        description="Generate --steps steps from SPEC with --seed and write them in --format (default polytrace-v2).",
        formatter_class=fmt,
        epilog="example:\n  polytrace sample --spec spec.json --steps 20 --seed 7 --out gen/",
    )
    _export_args(p, required_format=False)

    p = sub.add_parser(
        "fidelity",
        help="score generated workloads against a run's held-out steps (ours vs PolyTrace's histogram)",
        description="Fit on the first two thirds of a run's steps, generate the held-out steps with several seeds, "
        "and compare per-step total tokens, longest and p99 response, rollout makespan (and turns, tool time). "
        "Accuracy = 100% - MAPE. The same score for PolyTrace's 20-bin histogram resampler is shown beside it.",
        formatter_class=fmt,
        epilog="examples:\n  polytrace fidelity run-a\n  polytrace fidelity --all --format json --warehouse /tmp/wh",
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="run id(s)")
    p.add_argument("--all", action="store_true", help="every run with per-sample lengths")
    p.add_argument("--seeds", type=int, default=None,
                   help="number of seeds averaged per method (default: the protocol's 200, see docs/spec.md)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_warehouse(p)


def _export_args(p: argparse.ArgumentParser, required_format: bool) -> None:
    p.add_argument("--spec", type=Path, required=True, help="spec file written by `polytrace fit`")
    if required_format:
        p.add_argument("--format", choices=EXPORT_FORMATS, required=True)
    else:
        p.add_argument("--format", choices=EXPORT_FORMATS, default="polytrace-v2")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--steps", type=int, default=None, help="steps to generate (default: as many as the run had)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", help="only this workload (key or run id)")
    p.add_argument("--step-interval-s", type=float, default=None, help="seconds between steps in request traces (vidur, mooncake)")


def run(args: argparse.Namespace) -> int:
    from analyses.cli import EXIT_OK, UsageError, _warehouse

    if args.command == "fit":
        from analyses.fit.data import fit_runs, runs_with_samples
        from analyses.fit.spec import write_spec

        root = _warehouse(args)
        if not root.exists():
            raise UsageError(f"warehouse {root} does not exist (run `polytrace ingest` first)")
        have = runs_with_samples(root)
        if args.runs:
            missing = [r for r in args.runs if r not in have]
            if missing:
                raise UsageError(f"no per-sample lengths for run(s): {', '.join(missing)} (runs with samples: {', '.join(have) or 'none'})")
        elif not have:
            raise UsageError("no run in the warehouse has per-sample lengths to fit")
        spec = fit_runs(root, args.runs, seed=args.seed)
        write_spec(spec, args.out)
        for key, w in spec["workloads"].items():
            _print_workload(key, w)
        print(f"spec: {args.out.resolve()}  ({len(spec['workloads'])} workload(s), version {spec['polytrace_spec_version']})")
        return EXIT_OK

    if args.command in ("export", "sample"):
        from analyses.fit.exporters import export
        from analyses.fit.spec import SpecError, read_spec

        if not args.spec.exists():
            raise UsageError(f"{args.spec}: no such spec file")
        try:
            spec = read_spec(args.spec)
        except SpecError as exc:
            raise UsageError(str(exc)) from exc
        if args.steps is not None and args.steps < 1:
            raise UsageError("--steps must be >= 1")
        try:
            files = export(spec, args.format, args.out, steps=args.steps, seed=args.seed, workload=args.workload,
                           step_interval_s=args.step_interval_s)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from exc
        print(f"{args.format}: {len(files)} file(s) in {args.out.resolve()}")
        return EXIT_OK

    if args.command == "fidelity":
        from analyses.fit.data import load_run, runs_with_samples, runs_with_steps
        from analyses.fit.fidelity import fidelity, step_time_only

        root = _warehouse(args)
        if not root.exists():
            raise UsageError(f"warehouse {root} does not exist (run `polytrace ingest` first)")
        have = runs_with_samples(root)
        timed = runs_with_steps(root)
        runs = sorted(set(have) | set(timed)) if args.all else list(args.runs)
        if not runs:
            raise UsageError("give RUN... or --all")
        missing = [r for r in runs if r not in have and r not in timed]
        if missing:
            raise UsageError(f"neither per-sample lengths nor step times for run(s): {', '.join(missing)}")
        if args.seeds is not None and args.seeds < 1:
            raise UsageError("--seeds must be >= 1")
        from analyses.fit.fidelity import DEFAULT_SEEDS

        seeds = DEFAULT_SEEDS if args.seeds is None else tuple(range(args.seeds))
        results = []
        for r in runs:
            f = load_run(root, r)
            try:
                res = fidelity(f, seeds=seeds) if r in have else step_time_only(f)
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
    raise UsageError(f"unknown command {args.command}")


def _print_workload(key: str, w: dict[str, Any]) -> None:
    v = w["variables"]
    r = v["response_tokens"]
    fam = r.get("family") or r["kind"]
    cens = f", {r.get('n_censored', 0)} censored at {r['censor_at']:.0f}" if r.get("censor_at") else ""
    b = w["batch"]
    extra = ", ".join(k for k in v if k not in ("prompt_tokens", "response_tokens"))
    print(f"{key}: task={w['task']} samples={w['n_samples']} batch={b['prompts_per_step']}x{b['samples_per_prompt']} "
          f"dp={len(b['dp_ranks'])} response={fam}{cens} joint={w['joint']['selected']} drift={w['drift']['kind']}"
          + (f" also: {extra}" if extra else ""))


def fidelity_table(results: list[dict[str, Any]]) -> str:
    """A plain-text table: one line per run, ours beside the baseline, the references that say what
    the held-out steps allow, then per-statistic errors."""
    w = max([18, *(len(r["run_id"]) for r in results if "accuracy_pct" in r)])
    head = (f"{'run':<{w}} {'split':<13} {'held-out':<10} {'ours %':>11} {'base %':>11}  {'ceiling':>7} {'rec.mean':>8}  "
            f"{'1-replay ours/base':>18}  {'level ours/base':>15}  {'in-sample ours/base':>19}")
    lines = [head, "-" * len(head)]
    timed = [r for r in results if r.get("step_time_model")]
    results = [r for r in results if "accuracy_pct" in r]

    def pm(v: float, se: float | None) -> str:
        return f"{v:.1f}" if se is None or se != se else f"{v:.1f}±{se:.1f}"

    for r in results:
        ho = f"{len(r['heldout_steps'])} steps"
        lines.append(
            f"{r['run_id']:<{w}} {r['split']:<13} {ho:<10} {pm(r['accuracy_pct'], r.get('monte_carlo_se_pct')):>11} "
            f"{pm(r['baseline_accuracy_pct'], r.get('baseline_monte_carlo_se_pct')):>11}  "
            f"{r.get('ceiling_accuracy_pct', float('nan')):>7.1f} {r.get('recorded_mean_accuracy_pct', float('nan')):>8.1f}  "
            f"{r['single_replay_accuracy_pct']:>8.1f}/{r['baseline_single_replay_accuracy_pct']:<9.1f}  "
            f"{r['level_accuracy_pct']:>7.1f}/{r['baseline_level_accuracy_pct']:<7.1f}  "
            f"{r.get('in_sample_level_accuracy_pct', float('nan')):>9.1f}/{r.get('baseline_in_sample_level_accuracy_pct', float('nan')):<9.1f}"
        )
        errs = "  ".join(f"{k}={r['errors_pct'][k]:.1f}/{r['baseline_errors_pct'][k]:.1f}" for k in r["statistics"])
        lines.append(f"    per-step APE % (ours/base): {errs}")
        if r.get("ceiling_errors_pct"):
            lines.append("    ceiling APE %: " + "  ".join(f"{k}={r['ceiling_errors_pct'][k]:.1f}" for k in r["statistics"]))
    if len(results) > 1:
        import statistics

        lines.append(f"{'mean':<{w}} {'':<13} {'':<10} {statistics.fmean(r['accuracy_pct'] for r in results):>11.1f} "
                     f"{statistics.fmean(r['baseline_accuracy_pct'] for r in results):>11.1f}")
    if results:
        lines.append("")
        lines.append("ours/base: 100 - per-step MAPE on the held-out steps, ± the Monte Carlo standard error of the seed average.")
        lines.append("ceiling: the best one prediction for every held-out step can score, chosen knowing the held-out answers.")
        lines.append("rec.mean: the fitted steps' mean as the prediction. in-sample: level score against the fitted steps.")
    if timed:
        lines.append("")
        lines.append("step-time model (time = a + b*tokens + c*longest response; fitted on the first 2/3 of steps), accuracy %:")
        lines.append(f"{'run':<54} {'target':<12} {'real wl':>8} {'gen wl':>8} {'trainmean':>9}")
        for r in timed:
            for t in ("gen_time_s", "step_time_s"):
                m = r["step_time_model"].get(t)
                if m:
                    lines.append(f"{r['run_id'][:54]:<54} {t:<12} {m['accuracy_from_real_workload_pct']:>8.1f} "
                                 f"{m['accuracy_from_generated_workload_pct']:>8.1f} {m['baseline_mean_accuracy_pct']:>9.1f}")
    return "\n".join(lines)
