"""Read-only SQL over the warehouse in DuckDB's own sandbox.

What a query connection can touch is decided by DuckDB, not by inspecting SQL text:

- ``enable_external_access = false`` with ``allowed_paths`` = exactly the warehouse's data
  files: no other file, directory listing, extension, secret or database can be opened;
- ``lock_configuration = true``: a query cannot switch that off again;
- DuckDB's own parser (``extract_statements``) classifies each statement; only queries
  (``SELECT``/``WITH``/``FROM``/``VALUES``/``DESCRIBE``/``SUMMARIZE``/``SHOW`` and ``EXPLAIN``)
  run. This matters because an allowed path is writable too: ``COPY ... TO`` one of the
  warehouse's own files would pass the path check, so COPY never runs.

Every statement is checked before the first one runs, so a refused input changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import polars as pl

QUERY_TYPES = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)


class QueryRefused(ValueError):
    """SQL that the sandbox does not run, with a one-line reason."""


def lock_down(con: duckdb.DuckDBPyConnection, readable: Iterable[str]) -> None:
    """Let ``con`` read only ``readable`` files from now on, for good."""
    paths = sorted(set(readable))
    con.execute("SET allowed_paths = $1", [paths])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _message(exc: Exception) -> str:
    """DuckDB's message on one line, its hints ("Did you mean ...") kept, the SQL excerpt left out."""
    lines = []
    for ln in str(exc).splitlines():
        if ln.startswith("LINE "):
            break
        if ln.strip():
            lines.append(ln.strip())
    return " ".join(lines) or type(exc).__name__


def query_statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    """The statements of ``sql``, each a query; :class:`QueryRefused` otherwise."""
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(_message(exc)) from exc
    if not stmts:
        raise QueryRefused("no SQL statement given")
    for i, s in enumerate(stmts):
        if s.type not in QUERY_TYPES:
            kind = str(s.type).rsplit(".", 1)[-1]
            where = f"statement {i + 1}: " if len(stmts) > 1 else ""
            raise QueryRefused(f"read-only: {where}{kind} statements are not allowed (only queries)")
    return stmts


def run_queries(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[str, pl.DataFrame]]:
    """Every statement of ``sql`` with its result, in order (all checked before any runs)."""
    out = []
    for s in query_statements(con, sql):
        try:
            rel = con.sql(s.query)
            df = rel.pl() if rel is not None else pl.DataFrame()
        except duckdb.Error as exc:
            raise QueryRefused(_message(exc)) from exc
        out.append((s.query.strip().rstrip(";").strip(), df))
    return out
