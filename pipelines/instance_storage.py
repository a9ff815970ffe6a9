"""The local Dagster instance's SQLite storage, with its connections kept open for the process.

Dagster's default SQLite storage creates an SQLAlchemy engine, opens a connection, runs one
statement and closes everything again for every event it stores (a run's shard, then the
cross-run index for asset and check events), for every run-storage access and for every
``has_table`` probe: the demo's ~1,000 events cost ~3,600 connections, ~17 ms per event on the
2-core build machine, more than the demo's ingest itself.

:class:`PooledSqliteStorage` writes the very same files in the very same layout (``history/runs.db``,
``history/runs/<run>.db``, ``history/runs/index.db``, ``schedules/``), so ``dagster dev`` with its
default storage on the same ``$DAGSTER_HOME`` reads them as usual; it only keeps one engine per
file (a few run shards at a time) and remembers which tables exist. :func:`open_instance` uses it
for an instance whose ``dagster.yaml`` asks for the default SQLite storage and leaves any other
(Postgres, a user's own) as configured.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sql import create_engine
from dagster._core.storage.sqlite import create_db_conn_string
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage, DagsterStorage, SqliteStorageConfig
from dagster._serdes import ConfigurableClassData
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

DEFAULT_STORAGE = ("dagster._core.storage.sqlite_storage", "DagsterSqliteStorage")
OPEN_SHARDS = 8  # run shards kept open at once (a run writes only its own; the index stays open)
BUSY_TIMEOUT_S = 30  # another process (the UI, the daemon) holding the write lock: wait, as Dagster does


# DagsterSqliteStorage's layout under base_dir (its module's private helpers, written out here):
# `make ui` reads these very paths with the default storage; tests/test_instance_storage.py compares
# the files with those Dagster writes itself
def _runs_directory(base: str) -> str:
    return os.path.join(base, "history", "")


def _event_logs_directory(base: str) -> str:
    return os.path.join(base, "history", "runs", "")


def _schedule_directory(base: str) -> str:
    return os.path.join(base, "schedules")


def _pooled_engine(conn_string: str) -> Engine:
    # one connection may serve several threads in turn: each use is inside a checkout (and, for the
    # event log, under the storage's own lock), never shared at the same time
    return create_engine(conn_string, connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False})


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """:class:`SqliteEventLogStorage` (one SQLite file per run plus the cross-run index) with an
    engine per file kept open: the index's, and the last :data:`OPEN_SHARDS` runs'."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._tables: set[str] = set()
        self._template: Path | None = None
        super().__init__(base_dir, inst_data)

    def _initdb(self, engine: Engine, for_index_shard: bool = False) -> None:
        # A new run's shard is a copy of an empty shard Dagster initialized once for this process:
        # its initialization (the schema, then alembic reading its ~60 migration scripts twice to
        # stamp the revision) took 0.1-0.5 s per run. An existing file is checked as Dagster does.
        path = engine.url.database
        if for_index_shard or not path or os.path.exists(path) or not self._copy_empty_shard(Path(path)):
            super()._initdb(engine, for_index_shard)

    def _copy_empty_shard(self, dest: Path) -> bool:
        if self._template is None:
            tmp = Path(tempfile.mkdtemp(prefix="polytrace-dagster-shard-"))
            weakref.finalize(self, shutil.rmtree, tmp, True)
            engine = create_engine(create_db_conn_string(str(tmp), "empty"), poolclass=NullPool)
            super()._initdb(engine)
            engine.dispose()  # the last connection closed: the file holds everything, no -wal beside it
            self._template = tmp / "empty.db"
        part = dest.with_name(f".{dest.name}.{os.getpid()}.part")  # not *.db: not taken for a run's shard
        shutil.copyfile(self._template, part)
        try:
            os.link(part, dest)  # never over a shard another process created meanwhile
        except FileExistsError:
            return False
        finally:
            part.unlink(missing_ok=True)
        return True

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engines.get(shard)
            if engine is None:
                engine = _pooled_engine(self.conn_string_for_shard(shard))
                if shard not in self._initialized_dbs:
                    self._initdb(engine)
                    self._initialized_dbs.add(shard)
                self._engines[shard] = engine
                self._close_old_shards()
            else:
                self._engines.move_to_end(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _close_old_shards(self) -> None:
        runs = [s for s in self._engines if s != "index"]
        for shard in runs[: max(0, len(runs) - OPEN_SHARDS)]:
            self._engines.pop(shard).dispose()

    def has_table(self, table_name: str) -> bool:
        # a table once there stays there (migrations add, never drop): asked ~700 times by the demo
        # (on a connection of its own: it is asked inside index transactions, under the lock)
        if table_name in self._tables:
            return True
        found = super().has_table(table_name)
        if found:
            self._tables.add(table_name)
        return found

    def dispose(self) -> None:
        with self._db_lock:
            while self._engines:
                self._engines.popitem()[1].dispose()
        super().dispose()


class PooledSqliteRunStorage(SqliteRunStorage):
    """:class:`SqliteRunStorage` (``runs.db``) with its engine kept open."""

    def __init__(self, conn_string: str, inst_data: ConfigurableClassData | None = None):
        super().__init__(conn_string, inst_data)
        self._engine = _pooled_engine(conn_string)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with self._engine.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        self._engine.dispose()
        super().dispose()


class PooledSqliteStorage(DagsterSqliteStorage):
    """:class:`DagsterSqliteStorage` (Dagster's default: everything in SQLite files under
    ``base_dir``) with pooled run and event-log storage; the same files as the default."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        # DagsterSqliteStorage.__init__ with the pooled storages (PooledSqliteRunStorage.from_local
        # creates and migrates runs.db exactly as the default does)
        self.base_dir = base_dir
        self._run_storage = PooledSqliteRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = PooledSqliteEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = SqliteScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        DagsterStorage.__init__(self)

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData, config_value: SqliteStorageConfig
    ) -> PooledSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)


def open_instance(home: Path) -> DagsterInstance:
    """The Dagster instance of ``home`` (its ``dagster.yaml``), with :class:`PooledSqliteStorage`
    in place of the default SQLite storage; any other configured storage is used as it is."""
    ref = InstanceRef.from_dir(str(home))
    data = ref.storage_data
    if data is not None and (data.module_name, data.class_name) == DEFAULT_STORAGE:
        ref = ref._replace(storage_data=ConfigurableClassData(__name__, PooledSqliteStorage.__name__,
                                                              data.config_yaml))
    return DagsterInstance.from_ref(ref)

