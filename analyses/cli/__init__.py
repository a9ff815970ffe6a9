"""The ``polytrace`` command line: one module per command, each declaring a
:class:`~analyses.cli.common.Command`; :data:`COMMANDS` is the list the parser is built from.
Every handler works through :class:`analyses.api.PolyTrace`.

A command imports only what it uses: the command modules import nothing heavy at the top (their
handlers import DuckDB, Polars, the fits, ... when they run), and the parser adds the arguments
of the command being run only, so ``polytrace --version``, ``--help`` and ``polytrace query``
start without the fitting stack, plotly or the export formats (``tests/test_cli_imports.py``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analyses.cli import (
    alerts,
    compare,
    export,
    fidelity,
    fit,
    ingest,
    query,
    report,
    runs,
    trace_diff,
    watch,
)
from analyses.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, Command, UsageError

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
    watch.COMMAND,
)


def _version() -> str:
    from importlib import metadata  # 40 ms of imports (email, zipfile): only for --version

    try:
        return metadata.version("polytrace")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class _VersionAction(argparse.Action):
    """argparse's ``version`` action, the version looked up only when asked for."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"polytrace {_version()}")
        parser.exit()


def _chosen(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (``polytrace`` itself
    takes no option with a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv``, only the command it names gets its arguments (the others
    are listed with their help line): building a command's arguments may import what it needs
    (the export formats' names, the fidelity protocol's seeds)."""
    chosen = None if argv is None else _chosen(argv)  # given argv and no command: no command's arguments
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="polytrace",
        description="Trace analytics for RLVR training workloads.",
        formatter_class=fmt,
        epilog="example:\n  polytrace ingest --root sample_logs && polytrace runs",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for c in COMMANDS:
        p = sub.add_parser(c.name, help=c.help, description=c.description, epilog=c.epilog, formatter_class=fmt)
        if argv is None or chosen == c.name:
            c.add_arguments(p)
        p.set_defaults(handler=c.run)
    return parser


def _raised(module: str, name: str) -> tuple[type[Exception], ...]:
    """``module.name`` when the command imported ``module``: an exception of a module it never
    imported cannot have been raised, and the modules need not load for ``--version``."""
    mod = sys.modules.get(module)
    return (getattr(mod, name),) if mod is not None else ()


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words)
    args = parser.parse_args(words)
    # the command line of this process (not a call from Python): a command may confine the
    # process it owns (``query`` lands itself in Landlock), never its caller's
    args.own_process = argv is None
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    # an unusable store or --out is bad usage too
    except (UsageError, *_raised("analyses.objectstore", "StoreError"),
            *_raised("analyses.atomic_output", "OutputRefused")) as exc:
        print(f"polytrace {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _raised("analyses.atomic_output", "WriteFailed") as exc:  # a full disk is not a bad input: one line, nothing half-written
        print(f"polytrace {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:
        return EXIT_OK


GC_THRESHOLD = 100_000  # new objects between two collections of the youngest generation, in the command


def quiet_blas_threads() -> None:
    """One BLAS thread, unless the user set it: numpy's OpenBLAS starts a server thread per core
    as numpy is imported, and each spins ~70 ms of CPU before it sleeps (perf: 42% of the samples
    of ``import numpy`` and a 0.5 s sleep on 2 cores), taken from the threads of an ingest or a
    fit. Nothing here multiplies matrices large enough for BLAS threads to pay. Before numpy is
    imported: OpenBLAS reads it once, as it loads."""
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def console() -> None:
    """The installed ``polytrace`` command: :func:`main`, then out of the process without the
    interpreter's final teardown. Everything a normal exit does first still happens: threads are
    joined (idle pools told to stop) and ``atexit`` handlers run (Ray, temporary directories,
    logging), and the output is flushed; only the clearing of every module and of Polars' and
    DuckDB's runtimes is skipped, which cost 0.05-0.1 s of CPU per command (a tenth of an ingest
    of a few hundred small step files). An uncaught exception exits as usual (its traceback)."""
    import atexit
    import gc
    import os
    import threading

    # a command allocates a few hundred thousand objects, nearly all for good (modules, classes,
    # functions): at Python's default a collection per 700 new objects, ~100 collections and ~18 ms
    # of the main thread in an ingest of 315 step files, ~2 ms at this; cycles are still collected
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    quiet_blas_threads()
    try:
        code = main()
    except SystemExit as exc:  # argparse's usage errors and --version
        code = exc.code
    if code is not None and not isinstance(code, int):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    if sys.gettrace() is not None or sys.getprofile() is not None or "coverage" in sys.modules:
        # under cProfile, a debugger or coverage: their results are written at the normal exit
        raise SystemExit(code)
    threading._shutdown()  # type: ignore[attr-defined]  # noqa: SLF001 - what Py_FinalizeEx does first
    atexit._run_exitfuncs()  # noqa: SLF001 - then this
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more to say
            pass
    os._exit(code or 0)
