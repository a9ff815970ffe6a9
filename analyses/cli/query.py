"""``polytrace query``: read-only SQL over every table and view of the warehouse.

The statements run in DuckDB's sandbox (:mod:`analyses.sandbox`) with bounded memory and spill
space (:mod:`analyses.duckdb_limits`) and a time limit; run as its own process (the
``polytrace`` command, ``python -m analyses.cli``), the command also confines itself with
Landlock before DuckDB starts (:mod:`analyses.landlock`): it cannot write any file outside its
scratch directory, whatever a statement asks. Results stream from DuckDB as they are printed:
a large CSV or JSON result never sits in memory whole, and a table shows its first and last
100 rows.
"""

from __future__ import annotations

import argparse
import os
import sys

from analyses.cli.common import Command, UsageError, add_warehouse, warehouse
from analyses.duckdb_limits import ENV_MEMORY, ENV_TEMP
from analyses.landlock import ENV_LANDLOCK

DEFAULT_TIMEOUT_S = 300.0
ENV_TIMEOUT = "POLYTRACE_QUERY_TIMEOUT"


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", help="one or more SQL queries (SELECT, WITH, FROM, DESCRIBE, SUMMARIZE, EXPLAIN ...)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=None,
                   help=f"stop the statements after this long in all, exit 2 (default ${ENV_TIMEOUT} or "
                        f"{DEFAULT_TIMEOUT_S:.0f}; 0: no limit)")
    p.add_argument("--memory-limit", metavar="SIZE", default=None,
                   help=f"DuckDB's memory limit, e.g. 2GB, 512MiB, 25%% (default ${ENV_MEMORY}, or the lesser of "
                        "3 GB and a quarter of RAM); beyond it the query spills, then stops with exit 2")
    p.add_argument("--temp-limit", metavar="SIZE", default=None,
                   help=f"space the query may spill to disk (default ${ENV_TEMP}, or 4x the memory limit, "
                        "at most half the free space)")
    add_warehouse(p)


def _timeout(args: argparse.Namespace) -> float:
    if args.timeout is not None:
        value, source = args.timeout, "--timeout"
    else:
        text = os.environ.get(ENV_TIMEOUT)
        if not text:
            return DEFAULT_TIMEOUT_S
        source = f"${ENV_TIMEOUT}"
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{source}: {text!r} is not a number of seconds") from None
    if not value >= 0:
        raise UsageError(f"{source} must be 0 (no limit) or more seconds, not {value:g}")
    return value


def _run(args: argparse.Namespace) -> int:
    # DuckDB, Polars and the catalog only once a statement is to run (see analyses.cli)
    from analyses.cli.query_run import execute, sandbox_connection
    from analyses.duckdb_limits import resource_limits

    try:
        limits = resource_limits(args.memory_limit, args.temp_limit)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    timeout_s = _timeout(args)
    pt = warehouse(args)
    with sandbox_connection(pt.read_root(), limits, getattr(args, "own_process", False)) as (con, spill, _):
        return execute(con, args.sql, args.format, timeout_s, limits, spill, sys.stdout)


COMMAND = Command(
    name="query",
    help="run read-only SQL against the warehouse tables and views",
    description="Run read-only SQL in DuckDB's sandbox: every table and view of the warehouse contract by name, "
    "nothing else on disk. Several statements separated by ';' print one result each. Memory, spill space and "
    "time are bounded (exceeded: one line, exit 2); run as a command, the process cannot write any file outside "
    f"its own spill directory (Linux Landlock; ${ENV_LANDLOCK}=auto|require|off).",
    epilog='example:\n  polytrace query "SELECT run_id, count(*) FROM steps GROUP BY 1" --format csv',
    add_arguments=_arguments,
    run=_run,
)
