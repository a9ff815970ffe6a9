"""One in-memory DuckDB database per process for the work that needs *a* DuckDB and no settings
of its own: the readers' JSON decodes (a cursor per thread) and the refresh of the catalog file,
which ATTACHes the file to it instead of opening a database of its own.

Opening a DuckDB database costs ~30-40 ms of CPU however little it then does (each instance loads
DuckDB's built-in extensions); a cursor of an open one, well under a millisecond. An ingest of a
few hundred small step files opened two (the decode's, then the catalog file's): a tenth of its
fixed cost (issue 29). Work with settings of its own (the dedupe's memory limit and spill
directory, a query's sandbox and limits) keeps its own database.

A cursor's ``USE`` and registered frames are its own; the database's global settings are shared,
so a user that changes one (the catalog refresh's ``file_search_path``) holds :data:`SETTINGS` and
sets it back before letting go.
"""

from __future__ import annotations

import threading

import duckdb

THREADS = 2  # the readers run beside other work; a batch of small files is small enough for two

# held while a cursor's user changes a global setting (and until it has set it back)
SETTINGS = threading.RLock()
_open = threading.Lock()
_db: list[duckdb.DuckDBPyConnection | None] = [None]


def cursor() -> duckdb.DuckDBPyConnection:
    """A new connection to the process's in-memory database (opened on first use); close it after."""
    with _open:
        if _db[0] is None:
            _db[0] = duckdb.connect(config={"threads": THREADS})
        return _db[0].cursor()


def open_early() -> threading.Thread:
    """Open the process's database on a thread of its own, now, for a caller that will need it
    after more imports: opening costs ~25-40 ms, nearly all of it without the GIL (py-spy --gil
    finds it holding the GIL in under 1% of its samples), so it overlaps an import of Polars
    (~0.15 s, all of it holding the GIL) on the other core. A :func:`cursor` asked
    for meanwhile waits for it. A failure here is left for the first :func:`cursor`, which opens
    the database again in its caller and raises there, as without this."""

    def open_it() -> None:
        try:
            cursor().close()
        except Exception:  # noqa: BLE001 - the caller's own cursor() opens it and raises
            pass

    # not a daemon: a process that ends before it (a usage error) waits for it instead of tearing
    # DuckDB down under it
    t = threading.Thread(target=open_it, name="duckdb-open")
    t.start()
    return t


def after_failure() -> None:
    """After a failed query: when the database itself no longer answers (a fatal error invalidates
    a DuckDB database), the next :func:`cursor` opens a new one."""
    with _open:
        db = _db[0]
        if db is None:
            return
        try:
            probe = db.cursor()
            try:
                probe.execute("SELECT 1").fetchall()
            finally:
                probe.close()
        except duckdb.Error:
            _db[0] = None
