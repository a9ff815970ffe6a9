"""The DuckDB catalog: views over the published Parquet of every run, never data.

Two forms of the same views:

- ``connect`` gives an in-memory connection (absolute paths), so queries never contend for a
  file; with ``sandbox`` it can read those files and nothing else. Given a ``snapshot``
  directory it starts from a private copy of the catalog file instead, when that file's derived
  views are exactly this code's (a stamp in the file says so): creating the views binds each
  one against the Parquet files, most of a query command's start-up.
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
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

import duckdb

from analyses import duckdb_instance
from analyses.duckdb_limits import ResourceLimits, apply_limits, new_scratch_path, resource_limits
from analyses.sandbox import lock_down
from analyses.schema import TABLES, column_docs, table_description
from analyses.warehouse import ReaderLease, TableFile, published_runs, reader_lease

CATALOG_NAME = "polytrace.duckdb"
STORAGE_VERSION = "v1.0.0"  # the catalog file opens in DuckDB 1.0 and later
# what the catalog file says about itself: the digest (:func:`views_digest`) of the derived views
# it was last written with; only a snapshot reads it, and removes it from its copy
STAMP_SCHEMA = "polytrace_catalog"
STAMP_TABLE = f"{STAMP_SCHEMA}.derived_views"
# the snapshot's file name: DuckDB names a database after its file, and the in-memory connection's
# database is "memory", so information_schema and duckdb_views() read the same either way
SNAPSHOT_NAME = "memory.duckdb"


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
        cols = ", ".join(f'"{c}"' for c in t.types)
        if rels:
            listed = ", ".join(_sql_str(p if relative else str(base / p)) for p in rels)
            body = (f"SELECT {cols} FROM read_parquet([{listed}], hive_partitioning = true, "
                    "hive_types = {'run_id': 'VARCHAR'})")
        else:
            typed = ", ".join(f'CAST(NULL AS {d}) AS "{c}"' for c, d in t.types.items())
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
    ddl += view_ddl(views)
    return (ddl + comment_ddl(views) if comments else ddl), files


def view_ddl(views: Iterable[DerivedView]) -> list[str]:
    """``CREATE OR REPLACE VIEW`` for each derived view, in the order given."""
    return [f'CREATE OR REPLACE VIEW "{v.name}" AS {v.sql}' for v in views]


def views_digest(views: Iterable[DerivedView]) -> str:
    """SHA-256 of the derived views' DDL and comments as this code writes them: equal digests,
    the same views (a catalog file written by another version of PolyTrace differs)."""
    views = list(views)
    stmts = view_ddl(views) + _view_comment_ddl(views)
    return hashlib.sha256("\n;\n".join(stmts).encode()).hexdigest()


def comment_ddl(views: Iterable[DerivedView] = ()) -> list[str]:
    """``COMMENT ON`` every base table (its view) and column, and every derived view, with the
    descriptions Dagster shows (:mod:`analyses.schema`, each view's doc): ``duckdb_views()``,
    ``duckdb_columns()`` and SQL tools such as DBeaver list them. A derived view's columns are
    described in its view comment. ~0.5 ms a comment, so only the catalog file and the query
    sandbox carry them, not every in-memory connection."""
    return [stmt for stmts in _comments_by_view(views).values() for stmt in stmts]


def _comments_by_view(views: Iterable[DerivedView] = ()) -> dict[str, list[str]]:
    """:func:`comment_ddl`'s statements per view (base tables first, then ``views``)."""
    out: dict[str, list[str]] = {}
    for name in TABLES:
        out[name] = [f'COMMENT ON VIEW "{name}" IS {_sql_str(table_description(name))}']
        out[name] += [f'COMMENT ON COLUMN "{name}"."{c}" IS {_sql_str(doc)}' for c, doc in column_docs(name).items()
                      if doc]
    for v in views:
        out[v.name] = [f'COMMENT ON VIEW "{v.name}" IS {_sql_str(v.doc)}'] if v.doc else []
    return out


def _view_comment_ddl(views: Iterable[DerivedView]) -> list[str]:
    return [f'COMMENT ON VIEW "{v.name}" IS {_sql_str(v.doc)}' for v in views if v.doc]


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


CATALOG_STATE = ".catalog.state.json"


def _view_statements(root: Path, views: Iterable[DerivedView]) -> dict[str, list[str]]:
    """Per view of the catalog file (base tables, then ``views``): its DDL and its comments."""
    views = list(views)
    ddl = all_ddl(root, views, relative=True)[0]
    names = [*TABLES, *(v.name for v in views)]
    comments = _comments_by_view(views)
    return {name: [stmt, *comments[name]] for name, stmt in zip(names, ddl, strict=True)}


def _digest(stmts: list[str]) -> str:
    return hashlib.sha256("\n".join(stmts).encode()).hexdigest()


def _file_identity(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _written_views(root: Path, path: Path) -> dict[str, str]:
    """The digest of each view's statements as the last :func:`refresh_catalog` wrote them, while
    the file is as it left it (same size and mtime, no write-ahead log: nobody wrote it since; a
    copied warehouse keeps both, and its views name files relative to it); else nothing (every
    view is written again)."""
    try:
        state = json.loads((root / CATALOG_STATE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(state, dict) or state.get("file") != _file_identity(path) or Path(f"{path}.wal").exists():
        return {}
    views = state.get("views")
    return views if isinstance(views, dict) else {}


def _remember_views(root: Path, path: Path, views: dict[str, str]) -> None:
    tmp = root / f"{CATALOG_STATE}.tmp"
    try:
        tmp.write_text(json.dumps({"file": _file_identity(path), "views": views}))
        os.replace(tmp, root / CATALOG_STATE)
    except OSError:  # the next refresh writes every view again (a full disk: nothing half-written left)
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        with suppress(OSError):
            (root / CATALOG_STATE).unlink()


ENV_TEMPLATES = "POLYTRACE_CATALOG_CACHE"


def _templates_dir() -> Path:
    return Path(os.environ.get(ENV_TEMPLATES) or Path.home() / ".cache" / "polytrace" / "catalogs")


def _start_from_template(root: Path, path: Path, views: list[DerivedView]) -> None:
    """Begin a new catalog file as a copy of an empty warehouse's (every view and comment written),
    cached per DDL, DuckDB version and storage format: a new warehouse's first refresh then writes
    only the base views of the tables that have rows (creating the ~50 derived views and ~300
    comments took 0.3-0.5 s, a third of a small ingest). Without a writable cache the file is
    written from scratch as before."""
    try:
        with tempfile.TemporaryDirectory(prefix="polytrace-catalog-") as tmp:
            empty = Path(tmp)
            stmts = _view_statements(empty, views)
            key = hashlib.sha256(json.dumps([duckdb.__version__, STORAGE_VERSION, stmts]).encode()).hexdigest()[:24]
            cached = _templates_dir() / f"catalog-{key}.duckdb"
            if not cached.exists():
                refresh_catalog(empty, views, template=False)
                cached.parent.mkdir(parents=True, exist_ok=True)
                part = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
                try:
                    shutil.copyfile(catalog_path(empty), part)
                    os.replace(part, cached)
                finally:
                    part.unlink(missing_ok=True)
                _prune_templates(cached.parent)
        shutil.copy2(cached, path)  # keeps the mtime: the state below names this very file
        _remember_views(root, path, {name: _digest(s) for name, s in stmts.items()})
    except (OSError, duckdb.Error):
        path.unlink(missing_ok=True)


_KEEP_TEMPLATES = 8  # one per version of the views in use; older ones go


def _prune_templates(d: Path) -> None:
    found = sorted(d.glob("catalog-*.duckdb"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in found[_KEEP_TEMPLATES:]:
        old.unlink(missing_ok=True)


def refresh_catalog(
    root: Path,
    views: Iterable[DerivedView] = (),
    retries: int = 50,
    on_retry: Callable[[Exception], None] | None = None,
    template: bool = True,
) -> Path:
    """Rewrite the catalog file's base-table views (and ``views``, when given, with their digest:
    :func:`connect` trusts a snapshot of the file only when it is its own views'). Safe to call
    from several processes at once. Derived views already in the file are kept: DuckDB binds a
    view's SQL when it is queried, so they read the new base tables.

    A view whose DDL and comments are those this function last wrote to the same file is left as
    it is (``.catalog.state.json`` holds their digests and the file's identity): an append-only
    refresh changes the file lists of a few base views, and re-creating all of them and their
    ~300 comments cost 0.2-0.6 s of each refresh; a file anyone else wrote since is rewritten whole.
    A new file with derived views starts as a cached copy of an empty warehouse's (``template``:
    :func:`_start_from_template`, kept under ``$POLYTRACE_CATALOG_CACHE``, by default
    ``~/.cache/polytrace/catalogs``)."""
    root.mkdir(parents=True, exist_ok=True)
    path = catalog_path(root)
    views = list(views)
    with _file_lock(root / ".catalog.lock"), reader_lease(root):  # binding the views reads the files
        if template and views and not path.exists() and not Path(f"{path}.wal").exists():
            _start_from_template(root, path, views)
        wanted = {name: (_digest(stmts), stmts) for name, stmts in _view_statements(root, views).items()}
        written = _written_views(root, path)
        todo = [stmt for name, (digest, stmts) in wanted.items() if written.get(name) != digest for stmt in stmts]
        if not todo and path.exists():
            return path
        for attempt in range(retries):
            try:
                _write_views(root, path, todo, views)
            except _Held as exc:  # someone outside our lock (a user's CLI) holds it
                if on_retry:
                    on_retry(exc.__cause__ or exc)
                time.sleep(min(0.05 * (attempt + 1), 1.0))
                continue
            _remember_views(root, path, {**written, **{name: digest for name, (digest, _) in wanted.items()}})
            return path
    raise TimeoutError(f"could not open {path} for writing after {retries} attempts")


class _Held(Exception):
    """The catalog file could not be attached: another process holds it."""


_ATTACHED = "polytrace_catalog_file"  # the file's name while attached to the process's DuckDB


def _write_views(root: Path, path: Path, todo: list[str], views: list[DerivedView]) -> None:
    """Run ``todo`` (and write the views' stamp) in the catalog file at ``path``, in one transaction.

    The file is attached to the process's DuckDB (:mod:`analyses.duckdb_instance`: opening a
    database of its own cost ~35 ms, a tenth of a small ingest) and detached (checkpointed and
    closed, as closing its own database did) before this returns; :class:`_Held` when it cannot
    be attached because another process has it open."""
    with duckdb_instance.SETTINGS:  # file_search_path is the database's, not the cursor's
        con = duckdb_instance.cursor()
        try:
            try:
                con.execute(f"ATTACH {_sql_str(str(path))} AS {_ATTACHED} (STORAGE_VERSION '{STORAGE_VERSION}')")
            except duckdb.IOException as exc:
                raise _Held(str(exc)) from exc
            con.execute(f"USE {_ATTACHED}")
            # relative paths resolve against the warehouse while the views are created
            con.execute("SET file_search_path = $1", [str(root.resolve())])
            # one transaction: a commit per statement wrote (and synced) the file's log hundreds
            # of times, most of a small ingest's time; other readers of the file still see the
            # old views or all of the new ones
            con.execute("BEGIN TRANSACTION")
            (root / CATALOG_STATE).unlink(missing_ok=True)  # stale from here until the file is closed
            if todo:  # one call: DuckDB parses them as one script (~0.1 ms less a statement than one call each);
                # each ";" on a line of its own, so a statement's trailing "-- comment" cannot swallow it
                con.execute("\n;\n".join(todo))
            if views:
                con.execute(f"CREATE SCHEMA IF NOT EXISTS {STAMP_SCHEMA}")
                con.execute(f"CREATE OR REPLACE TABLE {STAMP_TABLE} AS SELECT $1 AS sha256", [views_digest(views)])
            con.execute("COMMIT")
        finally:
            con.close()  # (rolls back what did not commit)
            _detach()


def _detach() -> None:
    try:
        con = duckdb_instance.cursor()
        try:
            con.execute("RESET file_search_path")
            con.execute(f"DETACH DATABASE IF EXISTS {_ATTACHED}")
        finally:
            con.close()
    except duckdb.Error:  # the database failed (fatal errors invalidate it): the next use opens another
        duckdb_instance.after_failure()
        raise


def connect(root: Path, views: Iterable[DerivedView] = (), sandbox: bool = False,
            limits: ResourceLimits | None = None, spill: Path | None = None,
            comments: bool | None = None, snapshot: Path | None = None,
            shared: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection of its own with every base table and ``views`` by name.

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

    ``snapshot`` (an existing directory the caller removes afterwards): when the catalog file's
    derived views are exactly ``views`` (its stamp, :func:`views_digest`) and it holds nothing
    else, the connection opens a copy of it there (:func:`_snapshot`) and creates only the base
    tables over the manifests it read, as the in-memory connection would: the derived views are
    bound when a query reads them, not all of them before the first query runs. Otherwise, and
    without ``snapshot``, it is an in-memory connection that creates every view.

    ``shared`` (for callers that only read, neither ``sandbox`` nor ``comments``): a cursor on an
    in-memory database this process keeps per warehouse while its manifests, ``views`` and
    ``limits`` stay as they were (:func:`_shared_cursor`): creating the views binds each one, 0.3-0.8 s
    a connection, and a Dagster job or a report opens a dozen. Its TEMP tables are its own; anything
    else it creates is seen by the next shared cursor, so a user's connection is never shared.
    """
    limits = limits or resource_limits()
    if shared and not sandbox and not comments and snapshot is None:
        return _shared_cursor(root, list(views), limits)
    spill = spill or new_scratch_path(root)
    views = list(views)
    comments = sandbox if comments is None else comments
    # a reader lease from before the manifests are read until the connection is gone: the files
    # of the versions it bound stay while it may read them, whatever re-ingests meanwhile
    lease = ReaderLease(root)
    try:
        con = _snapshot(root, views, comments, snapshot) if snapshot is not None else None
        if con is not None:
            ddl, files = base_table_ddl(root)
            ddl += comment_ddl(()) if comments else []
            # the base tables over the files read now, with absolute paths (the file's are relative
            # to the warehouse, and DuckDB would look for those in the working directory first)
            ddl = ["BEGIN TRANSACTION", *ddl, f"DROP SCHEMA {STAMP_SCHEMA} CASCADE", "COMMIT"]
        else:
            con = duckdb.connect(":memory:")
            ddl, files = all_ddl(root, views, comments=comments)
        apply_limits(con, limits, spill)
        _no_progress_bar(con)
        for stmt in ddl:
            con.execute(stmt)
        if sandbox:
            lock_down(con, files)
    except BaseException:
        lease.release()
        raise
    weakref.finalize(con, lease.release)
    return con


def _no_progress_bar(con: duckdb.DuckDBPyConnection) -> None:
    """No DuckDB progress bar: it would write over our own progress display, and under --quiet too."""
    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error:  # in a Jupyter kernel without ipywidgets DuckDB refuses to touch the setting at all
        pass


# per warehouse, the latest used last: (what its views were created from, the database holding them)
_SHARED: OrderedDict[str, tuple[tuple[object, ...], duckdb.DuckDBPyConnection]] = OrderedDict()
_SHARED_MAX = 4  # warehouses a process keeps a database for (a test session opens hundreds)
_SHARED_LOCK = threading.Lock()


def _shared_cursor(root: Path, views: list[DerivedView], limits: ResourceLimits) -> duckdb.DuckDBPyConnection:
    """:func:`connect` with ``shared``: a cursor (its own DuckDB connection: its own TEMP schema and
    transactions) on the database this process holds for ``root``, made again when the DDL the
    manifests give now, or the limits, differ from those it was made with. The cursor holds its
    own reader lease, taken before the manifests are read, as :func:`connect` does; a replaced
    database is dropped, not closed (closing it would close the cursors still in use)."""
    lease = ReaderLease(root)
    try:
        ddl, _ = all_ddl(root, views)
        # the pid: a forked child never touches its parent's database (DuckDB's threads stay behind)
        key = (tuple(ddl), limits, os.getpid())
        where = str(root.resolve())
        with _SHARED_LOCK:
            held = _SHARED.get(where)
            if held is None or held[0] != key:
                parent = duckdb.connect(":memory:")
                apply_limits(parent, limits, new_scratch_path(root))  # the database's: every cursor's
                for stmt in ddl:
                    parent.execute(stmt)
                held = _SHARED[where] = (key, parent)
            _SHARED.move_to_end(where)
            while len(_SHARED) > _SHARED_MAX:
                _SHARED.popitem(last=False)
            con = held[1].cursor()
        _no_progress_bar(con)
    except BaseException:
        lease.release()
        raise
    weakref.finalize(con, lease.release)
    return con


def _snapshot(root: Path, views: list[DerivedView], comments: bool, into: Path) -> duckdb.DuckDBPyConnection | None:
    """A connection to a private copy of the catalog file in ``into`` when the file holds exactly
    the derived views ``views`` (with their comments when ``comments``; its stamp says which) and
    the base tables, nothing else; None when it cannot be used as it stands (missing, written by
    another version of PolyTrace or with other views, being rewritten, held or unreadable).

    The copy is taken under the catalog lock, shared (an ingest rewriting the file holds it
    alone: then no snapshot), so it is never half-written. Its base-table views are replaced by
    the caller; its derived views are kept as the file has them, unbound until queried."""
    if not comments:  # the file has them: removing them would cost what the snapshot saves
        return None
    src = catalog_path(root)
    dest = into / SNAPSHOT_NAME
    try:
        fd = os.open(root / ".catalog.lock", os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        shutil.copyfile(src, dest)
    except OSError:
        return None
    finally:
        os.close(fd)
    con = None
    try:
        con = duckdb.connect(str(dest))
        # the copy is thrown away with the scratch directory: writing its changes back into it
        # when the connection closes (a checkpoint) took as long as opening it
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
        stamp = con.execute(f"SELECT sha256 FROM {STAMP_TABLE}").fetchall()
        # views and tables a user's own client added to the file would show in the sandbox: not
        # this snapshot then (duckdb_views() and duckdb_tables(): information_schema and
        # duckdb_functions() take longer than the whole snapshot)
        held = con.execute("SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal UNION ALL "
                           "SELECT schema_name, table_name FROM duckdb_tables()").fetchall()
        expected = [("main", n) for n in [*TABLES, *(v.name for v in views)]] + [tuple(STAMP_TABLE.split("."))]
        if stamp == [(views_digest(views),)] and sorted(held) == sorted(expected):
            return con
    except duckdb.Error:
        pass
    if con is not None:
        con.close()
    dest.unlink(missing_ok=True)
    return None
