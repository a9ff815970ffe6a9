"""Cheaper writes to a local (SQLite) Dagster instance, for a process that writes many events.

Dagster's SQLite storage opens a connection per event (run shard, then the cross-run index for
asset and check events) and closes it again; SQLite's default ``synchronous=FULL`` then syncs the
write-ahead log on every commit and the database on every close. The demo's 11 runs store ~1,000
events, ~1,600 ``fdatasync`` calls per ingest run: on a busy disk an empty job of one 10-asset,
30-check step took 8-10 s against 2-4 s on tmpfs (measured on the 2-core build machine).

:func:`relax_instance_durability` sets ``synchronous=OFF`` on the SQLite files under the
instance's directory for this process only: SQLite still hands every write to the operating
system before it returns, so a crash of the process loses nothing; only a crash of the machine
mid-write may leave the instance's SQLite files damaged (delete ``.dagster_home`` and rerun
``make demo``). The warehouse is untouched (DuckDB and Parquet, published atomically), and the
UI, the daemon and a Postgres-backed instance keep their own settings.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

_homes: set[Path] = set()


def _under_a_home(con: sqlite3.Connection) -> bool:
    row = con.execute("PRAGMA database_list").fetchone()
    if not row or not row[2]:
        return False
    path = Path(row[2]).resolve()
    return any(path.is_relative_to(h) for h in _homes)


def _on_connect(dbapi_con: Any, _record: Any) -> None:
    if isinstance(dbapi_con, sqlite3.Connection) and _under_a_home(dbapi_con):
        dbapi_con.execute("PRAGMA synchronous=OFF")


def relax_instance_durability(home: Path) -> None:
    """From now on in this process, connections to SQLite files under ``home`` (the instance's
    ``$DAGSTER_HOME``) do not wait for the disk on commit (``PRAGMA synchronous=OFF``)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not _homes:
        event.listen(Engine, "connect", _on_connect)
    _homes.add(home.resolve())
