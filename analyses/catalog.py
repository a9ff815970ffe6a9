"""The DuckDB catalog: a file of views over the Parquet warehouse, never of data.

``refresh_catalog`` rewrites ``<root>/polytrace.duckdb`` under an OS file lock so that parallel
ingests never meet DuckDB's single-writer lock. ``connect`` gives readers an in-memory
connection with the same views, so queries never contend for the catalog file at all.
The caller says which derived views to create (``analyses.views.all_views()`` for all of them);
this module knows only the base tables.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import duckdb

from analyses.sandbox import lock_down
from analyses.schema import TABLES, duckdb_type
from analyses.warehouse import table_files

CATALOG_NAME = "polytrace.duckdb"

def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def base_table_ddl(root: Path) -> tuple[list[str], list[str]]:
    """``CREATE OR REPLACE VIEW`` for each base table over its Parquet files (typed and empty when
    it has none), and the files those views read."""
    out, files = [], []
    for name, t in TABLES.items():
        parts = table_files(root, name)
        files.extend(parts)
        cols = ", ".join(f'"{c}"' for c in t.columns)
        if parts:
            body = (
                f"SELECT {cols} FROM read_parquet([{', '.join(_sql_str(f) for f in parts)}], "
                "hive_partitioning = true, hive_types = {'run_id': 'VARCHAR'}, union_by_name = true)"
            )
        else:
            typed = ", ".join(f'CAST(NULL AS {duckdb_type(d)}) AS "{c}"' for c, d in t.columns.items())
            body = f"SELECT {typed} WHERE false"
        out.append(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
    return out, files


class DerivedView(Protocol):
    name: str
    sql: str


def all_ddl(root: Path, views: Iterable[DerivedView] = ()) -> tuple[list[str], list[str]]:
    """DDL for the base tables, then ``views`` in the order given; and the data files they read."""
    ddl, files = base_table_ddl(root)
    return ddl + [f'CREATE OR REPLACE VIEW "{v.name}" AS {v.sql}' for v in views], files


@contextmanager
def _file_lock(path: Path, timeout_s: float = 120.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"catalog lock {path} held for more than {timeout_s:.0f}s") from None
                time.sleep(0.05)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def catalog_path(root: Path) -> Path:
    return root / CATALOG_NAME


def refresh_catalog(
    root: Path,
    views: Iterable[DerivedView] = (),
    retries: int = 50,
    on_retry: Callable[[Exception], None] | None = None,
) -> Path:
    """Rewrite the catalog file's base-table views (and ``views``, when given). Safe to call from
    several processes at once. Derived views already in the file are kept: DuckDB binds a view's
    SQL when it is queried, so they read the new base tables."""
    root.mkdir(parents=True, exist_ok=True)
    path = catalog_path(root)
    with _file_lock(root / ".catalog.lock"):
        for attempt in range(retries):
            try:
                con = duckdb.connect(str(path))
            except duckdb.IOException as exc:  # someone outside our lock (a user's CLI) holds it
                if on_retry:
                    on_retry(exc)
                time.sleep(min(0.05 * (attempt + 1), 1.0))
                continue
            try:
                for stmt in all_ddl(root, views)[0]:
                    con.execute(stmt)
            finally:
                con.close()
            return path
    raise TimeoutError(f"could not open {path} for writing after {retries} attempts")


def connect(root: Path, views: Iterable[DerivedView] = (), sandbox: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every base table and ``views`` by name.

    With ``sandbox`` the connection can read the warehouse's data files and nothing else, for
    good (:func:`analyses.sandbox.lock_down`).
    """
    con = duckdb.connect(":memory:")
    ddl, files = all_ddl(root, views)
    for stmt in ddl:
        con.execute(stmt)
    if sandbox:
        lock_down(con, files)
    return con
