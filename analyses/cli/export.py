"""``polytrace export`` and ``polytrace sample``: a spec's workloads in another tool's format.

The format choices come from :func:`analyses.export.registry.export_formats`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analyses.cli.common import EXIT_OK, Command, UsageError


def _arguments(p: argparse.ArgumentParser, required_format: bool) -> None:
    from analyses.export.registry import format_names

    p.add_argument("--spec", type=Path, required=True, help="spec file written by `polytrace fit`")
    if required_format:
        p.add_argument("--format", choices=format_names(), required=True)
    else:
        p.add_argument("--format", choices=format_names(), default="polytrace-v2")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--steps", type=int, default=None,
                   help="steps to generate, numbered 0..N-1 (default: the run's full steps, at least 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", help="only this workload (key or run id)")
    p.add_argument("--step-interval-s", type=float, default=None, help="seconds between steps in request traces (vidur, mooncake)")
    p.add_argument("--records-per-step", type=int, default=None,
                   help="samples (trajectories) per generated step, a multiple of the samples per prompt "
                   "(default: the source batch)")
    p.add_argument("--vidur-date", default=None,
                   help="Date column of vidur_replay_trace.csv (default 2023-08-21, vidur's own default)")
    p.add_argument("--task", default=None,
                   help="task key of polytrace-params (default: from the data, tool calls -> tool_calling_task, else "
                   "math_task)")


def _run(args: argparse.Namespace) -> int:
    from analyses.api import PolyTrace
    from analyses.export.registry import ExportError
    from analyses.export.spec import SpecError, read_spec

    if not args.spec.exists():
        raise UsageError(f"{args.spec}: no such spec file")
    try:
        spec = read_spec(args.spec)
    except SpecError as exc:
        raise UsageError(str(exc)) from exc
    if args.steps is not None and args.steps < 1:
        raise UsageError("--steps must be >= 1")
    options = {k: v for k, v in (("vidur_date", args.vidur_date), ("task", args.task),
                                 ("records_per_step", args.records_per_step)) if v is not None}
    try:
        files = PolyTrace(None).export(spec, args.format, args.out, steps=args.steps, seed=args.seed,
                                       workload=args.workload, step_interval_s=args.step_interval_s, **options)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    except ExportError as exc:
        raise UsageError(str(exc)) from exc
    print(f"{args.format}: {len(files)} file(s) in {args.out.resolve()}")
    return EXIT_OK


def _export_arguments(p: argparse.ArgumentParser) -> None:
    """``export``'s arguments, and the formats' list before its examples (the formats are
    imported only for the command that shows them)."""
    from analyses.export.registry import export_formats

    _arguments(p, required_format=True)
    p.epilog = ("formats:\n" + "\n".join(f"  {f.name:<17} {f.files}  (read by {f.consumer})" for f in export_formats())
                + "\n" + (p.epilog or ""))


COMMAND = Command(
    name="export",
    help="write a spec's workloads in another tool's format",
    description="Write every workload of SPEC in FORMAT under DIR (one subdirectory per workload when the spec "
    "has several). Sample-based formats generate --steps steps with --seed; the same seed gives the same bytes.",
    epilog="examples:\n  polytrace export --spec spec.json --format polytrace-v2 --out gen/\n"
    "  polytrace export --spec spec.json --format vidur --out vidur/ --steps 10 --step-interval-s 120",
    add_arguments=_export_arguments,
    run=_run,
)

SAMPLE = Command(
    name="sample",
    help="regenerate N steps of workload from a spec (seeded, byte-identical per seed)",
    description="Generate --steps steps from SPEC with --seed and write them in --format (default polytrace-v2).",
    epilog="example:\n  polytrace sample --spec spec.json --steps 20 --seed 7 --out gen/",
    add_arguments=lambda p: _arguments(p, required_format=False),
    run=_run,
)
