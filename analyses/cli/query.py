"""``polytrace query``: read-only SQL over every table and view of the warehouse."""

from __future__ import annotations

import argparse
import json
import sys

import polars as pl

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse
from analyses.sandbox import QueryRefused


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", help="one or more SQL queries (SELECT, WITH, FROM, DESCRIBE, SUMMARIZE, EXPLAIN ...)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    add_warehouse(p)


def _print(df: pl.DataFrame, fmt: str) -> None:
    if fmt == "csv":
        # CSV has no nested types: lists and structs are written as their JSON text
        nested = [c for c, t in df.schema.items() if isinstance(t, pl.List | pl.Array | pl.Struct)]
        # (to_list gives plain Python values; map_elements would hand a list cell over as a Series)
        out = df.with_columns(pl.Series(c, [None if v is None else json.dumps(v, default=str) for v in df[c].to_list()],
                                        dtype=pl.String) for c in nested) if nested else df
        sys.stdout.write(out.write_csv())
    elif fmt == "json":
        sys.stdout.write(json.dumps(df.to_dicts(), default=str, indent=None) + "\n")
    else:
        with pl.Config(tbl_rows=200, tbl_cols=40, fmt_str_lengths=80, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
            print(df)


def _run(args: argparse.Namespace) -> int:
    pt = warehouse(args)
    try:
        results = pt.query(args.sql)
    except QueryRefused as exc:
        raise UsageError(str(exc)) from exc
    for i, (stmt, df) in enumerate(results):
        if len(results) > 1 and args.format == "table":
            print(f"-- [{i + 1}/{len(results)}] {stmt}")
        _print(df, args.format)
    return EXIT_OK


COMMAND = Command(
    name="query",
    help="run read-only SQL against the warehouse tables and views",
    description="Run read-only SQL in DuckDB's sandbox: every table and view of the warehouse contract by name, "
    "nothing else on disk. Several statements separated by ';' print one result each.",
    epilog='example:\n  polytrace query "SELECT run_id, count(*) FROM steps GROUP BY 1" --format csv',
    add_arguments=_arguments,
    run=_run,
)
