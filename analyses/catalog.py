"""The DuckDB catalog: a file of views over the Parquet warehouse, never of data.

``refresh_catalog`` rewrites ``<root>/polytrace.duckdb`` under an OS file lock so that parallel
ingests never meet DuckDB's single-writer lock. ``connect`` gives readers an in-memory
connection with the same views, so queries never contend for the catalog file at all.
Characterization modules register their views with :func:`register_view`.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import duckdb

from analyses.schema import TABLES, duckdb_type
from analyses.warehouse import parquet_root, table_glob

CATALOG_NAME = "polytrace.duckdb"

# name -> SQL body (a SELECT over the base tables and earlier views); insertion order is creation order
_VIEWS: dict[str, str] = {}
_VIEW_DOCS: dict[str, str] = {}


def register_view(name: str, sql: str, doc: str = "") -> None:
    """Register a derived view created in every catalog after the base tables."""
    _VIEWS[name] = sql
    _VIEW_DOCS[name] = doc


def registered_views() -> dict[str, str]:
    _load_view_modules()
    return dict(_VIEWS)


_VIEW_MODULES: tuple[str, ...] = ("analyses.views",)
_loaded = False


def _load_view_modules() -> None:
    global _loaded
    if _loaded:
        return
    import importlib

    for mod in _VIEW_MODULES:
        importlib.import_module(mod)
    _loaded = True


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def base_table_ddl(root: Path) -> list[str]:
    """``CREATE OR REPLACE VIEW`` for each base table: over its Parquet files, or typed and empty."""
    out = []
    for name, t in TABLES.items():
        has_files = any((parquet_root(root) / name).glob("run_id=*/*.parquet"))
        cols = ", ".join(f'"{c}"' for c in t.columns)
        if has_files:
            body = (
                f"SELECT {cols} FROM read_parquet({_sql_str(str(table_glob(root.resolve(), name)))}, "
                "hive_partitioning = true, hive_types = {'run_id': 'VARCHAR'}, union_by_name = true)"
            )
        else:
            typed = ", ".join(f'CAST(NULL AS {duckdb_type(d)}) AS "{c}"' for c, d in t.columns.items())
            body = f"SELECT {typed} WHERE false"
        out.append(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
    return out


def all_ddl(root: Path) -> list[str]:
    return base_table_ddl(root) + [f'CREATE OR REPLACE VIEW "{n}" AS {sql}' for n, sql in registered_views().items()]


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


def refresh_catalog(root: Path, retries: int = 50, on_retry: Callable[[Exception], None] | None = None) -> Path:
    """Rewrite the catalog file's views. Safe to call from several processes at once."""
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
                for stmt in all_ddl(root):
                    con.execute(stmt)
            finally:
                con.close()
            return path
    raise TimeoutError(f"could not open {path} for writing after {retries} attempts")


def connect(root: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every table and view of the contract by name."""
    con = duckdb.connect(":memory:")
    for stmt in all_ddl(root):
        con.execute(stmt)
    return con
