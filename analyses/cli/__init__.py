"""The ``polytrace`` command line: one module per command, each declaring a
:class:`~analyses.cli.common.Command`; :data:`COMMANDS` is the list the parser is built from.
Every handler works through :class:`analyses.api.PolyTrace`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from analyses.atomic_output import OutputRefused, WriteFailed
from analyses.cli import alerts, compare, export, fidelity, fit, ingest, query, report, runs, trace_diff
from analyses.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, Command, UsageError
from analyses.objectstore import StoreError

COMMANDS: tuple[Command, ...] = (
    ingest.COMMAND,
    query.COMMAND,
    runs.COMMAND,
    report.COMMAND,
    compare.COMMAND,
    fit.COMMAND,
    export.COMMAND,
    export.SAMPLE,
    fidelity.COMMAND,
    alerts.COMMAND,
    trace_diff.COMMAND,
)


def _version() -> str:
    try:
        return metadata.version("polytrace")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="polytrace",
        description="Trace analytics for RLVR training workloads.",
        formatter_class=fmt,
        epilog="example:\n  polytrace ingest --root sample_logs && polytrace runs",
    )
    parser.add_argument("--version", action="version", version=f"polytrace {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for c in COMMANDS:
        p = sub.add_parser(c.name, help=c.help, description=c.description, epilog=c.epilog, formatter_class=fmt)
        c.add_arguments(p)
        p.set_defaults(handler=c.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the command line of this process (not a call from Python): a command may confine the
    # process it owns (``query`` lands itself in Landlock), never its caller's
    args.own_process = argv is None
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except (UsageError, StoreError, OutputRefused) as exc:  # an unusable store or --out is bad usage too
        print(f"polytrace {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WriteFailed as exc:  # a full disk is not a bad input: one line, nothing half-written
        print(f"polytrace {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:
        return EXIT_OK
