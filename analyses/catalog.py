"""The DuckDB catalog: views over the published Parquet of every run, never data.

Two forms of the same views:

- ``connect`` gives an in-memory connection (absolute paths), so queries never contend for a
  file; with ``sandbox`` it can read those files and nothing else.
- ``refresh_catalog`` rewrites ``<root>/polytrace.duckdb`` for any DuckDB client, under an OS
  file lock so parallel ingests never meet DuckDB's single-writer lock. Its paths are relative
  to the warehouse directory, so a copied or moved warehouse still opens (``cd warehouse &&
  duckdb -readonly polytrace.duckdb``, or ``SET file_search_path`` to the warehouse), and it is
  written in DuckDB's v1.0 storage format, so DuckDB 1.x opens it as well as 2.x.

The base-table views list exactly the files the run manifests name (see
:mod:`analyses.warehouse`), so a half-written run is never read, and a reader lease keeps those
files while the views may read them. The caller says which derived
views to create (``analyses.views.all_views()`` for all of them); this module knows only the
base tables.
"""

from __future__ import annotations

import fcntl
import os
import time
import weakref
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import duckdb

from analyses.duckdb_limits import ResourceLimits, apply_limits, new_scratch_path, resource_limits
from analyses.sandbox import lock_down
from analyses.schema import TABLES, column_docs, duckdb_type, table_description
from analyses.warehouse import ReaderLease, TableFile, published_runs, reader_lease

CATALOG_NAME = "polytrace.duckdb"
STORAGE_VERSION = "v1.0.0"  # the catalog file opens in DuckDB 1.0 and later


class DerivedView(Protocol):
    name: str
    sql: str
    doc: str


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def base_table_ddl(root: Path, relative: bool = False) -> tuple[list[str], list[str]]:
    """``CREATE OR REPLACE VIEW`` for each base table over its published files (typed and empty
    when it has none), and the absolute paths of every published file of those tables."""
    pub = published_runs(root)
    base = root.resolve()
    out, files = [], []
    for name, t in TABLES.items():
        parts = [f for r in sorted(pub) for f in pub[r].tables.get(name, [])]
        files.extend(str(base / f.path) for f in parts)
        rels = [f.path for f in view_files(parts)]
        cols = ", ".join(f'"{c}"' for c in t.columns)
        if rels:
            listed = ", ".join(_sql_str(p if relative else str(base / p)) for p in rels)
            body = (f"SELECT {cols} FROM read_parquet([{listed}], hive_partitioning = true, "
                    "hive_types = {'run_id': 'VARCHAR'})")
        else:
            typed = ", ".join(f'CAST(NULL AS {duckdb_type(d)}) AS "{c}"' for c, d in t.columns.items())
            body = f"SELECT {typed} WHERE false"
        out.append(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
    return out, files


def view_files(parts: list[TableFile]) -> list[TableFile]:
    """The files a table's view lists: the non-empty ones, that nearest the mean row count first.

    DuckDB estimates a Parquet file list's rows as the first file's rows times the number of
    files. With every run listed in id order a table's first file was often empty (a run without
    samples), the estimate 0, and the optimizer then built its join hash tables on 51 M samples
    instead of on the 76-row runs table (sample_lengths counted in 24 s instead of 2.9 s). An empty
    file adds no rows, so leaving it out changes no result.
    """
    rows = [f for f in parts if f.rows > 0]
    if len(rows) < 2:
        return rows
    mean = sum(f.rows for f in rows) / len(rows)
    i = min(range(len(rows)), key=lambda k: abs(rows[k].rows - mean))
    return [rows[i], *rows[:i], *rows[i + 1:]]


def all_ddl(root: Path, views: Iterable[DerivedView] = (), relative: bool = False,
            comments: bool = False) -> tuple[list[str], list[str]]:
    """DDL for the base tables, then ``views`` in the order given; and the data files they read.
    ``comments`` adds each table's, column's and view's description (:func:`comment_ddl`)."""
    ddl, files = base_table_ddl(root, relative)
    views = list(views)
    ddl += [f'CREATE OR REPLACE VIEW "{v.name}" AS {v.sql}' for v in views]
    return (ddl + comment_ddl(views) if comments else ddl), files


def comment_ddl(views: Iterable[DerivedView] = ()) -> list[str]:
    """``COMMENT ON`` every base table (its view) and column, and every derived view, with the
    descriptions Dagster shows (:mod:`analyses.schema`, each view's doc): ``duckdb_views()``,
    ``duckdb_columns()`` and SQL tools such as DBeaver list them. A derived view's columns are
    described in its view comment. ~0.5 ms a comment, so only the catalog file and the query
    sandbox carry them, not every in-memory connection."""
    out = []
    for name in TABLES:
        out.append(f'COMMENT ON VIEW "{name}" IS {_sql_str(table_description(name))}')
        out.extend(f'COMMENT ON COLUMN "{name}"."{c}" IS {_sql_str(doc)}' for c, doc in column_docs(name).items() if doc)
    out.extend(f'COMMENT ON VIEW "{v.name}" IS {_sql_str(v.doc)}' for v in views if v.doc)
    return out


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
    with _file_lock(root / ".catalog.lock"), reader_lease(root):  # binding the views reads the files
        for attempt in range(retries):
            try:
                con = duckdb.connect(str(path), config={"storage_compatibility_version": STORAGE_VERSION})
            except duckdb.IOException as exc:  # someone outside our lock (a user's CLI) holds it
                if on_retry:
                    on_retry(exc)
                time.sleep(min(0.05 * (attempt + 1), 1.0))
                continue
            try:
                # relative paths resolve against the warehouse while the views are created
                con.execute("SET file_search_path = $1", [str(root.resolve())])
                # one transaction: a commit per statement wrote (and synced) the file's log hundreds
                # of times, most of a small ingest's time; other readers of the file still see the
                # old views or all of the new ones
                con.execute("BEGIN TRANSACTION")
                for stmt in all_ddl(root, views, relative=True, comments=True)[0]:
                    con.execute(stmt)
                con.execute("COMMIT")
            finally:
                con.close()
            return path
    raise TimeoutError(f"could not open {path} for writing after {retries} attempts")


def connect(root: Path, views: Iterable[DerivedView] = (), sandbox: bool = False,
            limits: ResourceLimits | None = None, spill: Path | None = None,
            comments: bool | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every base table and ``views`` by name.

    The connection holds a reader lease (:class:`analyses.warehouse.ReaderLease`) from before it
    reads the manifests until the connection object is gone: a re-ingest meanwhile keeps the files
    of the versions it bound, so its queries never meet a deleted file. Its memory and spill space
    are bounded (:mod:`analyses.duckdb_limits`): ``limits``, by default those of the environment
    or the defaults; it spills to ``spill``, by default a fresh directory in the warehouse's
    scratch area that DuckDB removes when the connection closes. With ``sandbox`` the connection
    can read the warehouse's data files and nothing else, for good
    (:func:`analyses.sandbox.lock_down`, after the limits, so a query cannot raise them). ``comments``
    (default: with ``sandbox``, where a person queries) describes every table, column and view
    (:func:`comment_ddl`).
    """
    limits = limits or resource_limits()
    spill = spill or new_scratch_path(root)
    # a reader lease from before the manifests are read until the connection is gone: the files
    # of the versions it bound stay while it may read them, whatever re-ingests meanwhile
    lease = ReaderLease(root)
    try:
        con = duckdb.connect(":memory:")
        apply_limits(con, limits, spill)
        # no DuckDB progress bar: it would write over our own progress display, and under --quiet too
        try:
            con.execute("SET enable_progress_bar = false")
        except duckdb.Error:  # in a Jupyter kernel without ipywidgets DuckDB refuses to touch the setting at all
            pass
        ddl, files = all_ddl(root, views, comments=sandbox if comments is None else comments)
        for stmt in ddl:
            con.execute(stmt)
        if sandbox:
            lock_down(con, files)
    except BaseException:
        lease.release()
        raise
    weakref.finalize(con, lease.release)
    return con
