"""The warehouse resource: where Parquet lands and where run directories are watched.

Not ``dagster-duckdb``'s ``DuckDBResource``: that resource opens one database file per use,
and a writer holds DuckDB's single-writer lock on it. Our DuckDB file holds only views over
the Parquet (``analyses.catalog``); it is rewritten under an OS file lock by one asset, and
every reader gets an in-memory connection with the same views (``connect``), so parallel
per-run writes and queries never contend for a database file.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import polars as pl
from dagster import ConfigurableResource

from analyses.api import PolyTrace
from analyses.objectstore import is_object_url
from analyses.run_split import PlannedRun
from analyses.warehouse import ENV_WAREHOUSE, default_root, scan_table
from pipelines.partitions import find_run

ENV_LOGS_ROOT = "POLYTRACE_LOGS_ROOT"
DEFAULT_LOGS_ROOT = "sample_logs"


class WarehouseResource(ConfigurableResource):
    """The warehouse root (Parquet + DuckDB catalog) and the logs root (one directory per run)."""

    root: str
    logs_root: str

    @classmethod
    def from_env(cls) -> WarehouseResource:
        """``$POLYTRACE_WAREHOUSE`` (default ``warehouse/``) and ``$POLYTRACE_LOGS_ROOT``
        (default ``sample_logs/``), made absolute here so that run workers started from another
        directory write to the same place."""
        logs = Path(os.environ.get(ENV_LOGS_ROOT) or DEFAULT_LOGS_ROOT)
        where = os.environ.get(ENV_WAREHOUSE) or ""
        root = where if is_object_url(where) else str(default_root().resolve())
        return cls(root=root, logs_root=str(logs.resolve()))

    @property
    def root_path(self) -> Path:
        """The local directory readers use: the warehouse, or an ``s3://`` warehouse's mirror
        brought up to date (read it after a write, not before)."""
        return self.polytrace.read_root()

    @property
    def logs_path(self) -> Path:
        return Path(self.logs_root)

    def run_plan(self, run_id: str) -> PlannedRun:
        """The run behind a partition key (a directory, or its files of one log); FileNotFoundError
        when it is gone."""
        found = find_run(self.logs_path, run_id)
        if found is None:
            raise FileNotFoundError(f"no run with run id {run_id!r} under {self.logs_path}")
        return found

    def scan(self, table: str, run_ids: list[str] | None = None) -> pl.LazyFrame:
        return scan_table(self.root_path, table, run_ids)

    @property
    def polytrace(self) -> PolyTrace:
        """The facade over this warehouse: what every asset calls."""
        return PolyTrace(self.root)

    def connect(self, views: list[str] | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with every table and view by name, a cursor on the views
        this process holds for the warehouse as it is now; with ``views``, a connection of its own
        with only those views and the ones they read (:meth:`analyses.api.PolyTrace.connect`)."""
        return self.polytrace.connect(shared=True) if views is None else self.polytrace.connect(views=views)
