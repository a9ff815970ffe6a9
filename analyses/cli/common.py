"""What every ``polytrace`` command shares: the command declaration, exit codes, usage errors and
the ``--warehouse`` option."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analyses.api import PolyTrace

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Unusable arguments or input: one clear line, exit 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its parser text, its arguments and its handler (returns the exit code)."""

    name: str
    help: str
    description: str
    epilog: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def add_warehouse(p: argparse.ArgumentParser) -> None:
    from analyses.warehouse import ENV_WAREHOUSE

    p.add_argument(
        "--warehouse",
        default=None,
        metavar="DIR|s3://BUCKET/PREFIX",
        help=f"warehouse directory or object-store URL (default: ${ENV_WAREHOUSE} or ./warehouse)",
    )


def warehouse(args: argparse.Namespace, must_exist: bool = True) -> PolyTrace:
    """The warehouse the command works on; a missing one is a usage error when it must exist."""
    from analyses.api import PolyTrace

    pt = PolyTrace(args.warehouse)
    if must_exist and not pt.exists():
        raise UsageError(f"warehouse {pt.location} does not exist (run `polytrace ingest` first)")
    return pt
