"""Warehouse I/O: hive-partitioned Parquet per run, staged then swapped into place.

Layout: ``<root>/parquet/<table>/run_id=<id>/part-*.parquet``. A run's ingest writes every
table's part files into a private staging directory, then swaps each table's partition in
with two renames. Different runs never touch the same directory, so parallel ingests of
different runs need no lock; the DuckDB catalog (see :mod:`analyses.catalog`) only holds views.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analyses.schema import TABLES, Table, conform

ENV_WAREHOUSE = "POLYTRACE_WAREHOUSE"


def default_root() -> Path:
    return Path(os.environ.get(ENV_WAREHOUSE) or "warehouse")


def parquet_root(root: Path) -> Path:
    return root / "parquet"


def partition_dir(root: Path, table: str, run_id: str) -> Path:
    return parquet_root(root) / table / f"run_id={run_id}"


def table_files(root: Path, table: str) -> list[str]:
    """Every Parquet file of ``table`` (absolute paths, sorted)."""
    return sorted(str(p) for p in (parquet_root(root.resolve()) / table).glob("run_id=*/*.parquet"))


def write_part(df: pl.DataFrame, table: Table, path: Path) -> int:
    """Write ``df`` (already conformed, run_id included or not) as one Parquet file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = df.select([c for c in table.stored_columns if c in df.columns])
    out.write_parquet(path, compression="zstd", statistics=True)
    return out.height


@dataclass
class RunStaging:
    """A run's private staging area; :meth:`commit` swaps it into the warehouse."""

    root: Path
    run_id: str

    def __post_init__(self) -> None:
        self.dir = parquet_root(self.root) / ".staging" / f"{self.run_id}-{uuid.uuid4().hex[:12]}"
        self.dir.mkdir(parents=True, exist_ok=False)
        self._counters: dict[str, int] = {}

    def table_dir(self, table: str) -> Path:
        return self.dir / table

    def add(self, table: str, df: pl.DataFrame, prefix: str = "part") -> int:
        """Conform ``df`` to ``table`` and stage it as a new part file; returns rows written."""
        if df.height == 0:
            return 0
        t = TABLES[table]
        n = self._counters.get(table, 0)
        self._counters[table] = n + 1
        return write_part(conform(df, t), t, self.table_dir(table) / f"{prefix}-{n:06d}.parquet")

    def scan(self, table: str) -> pl.LazyFrame:
        """What is staged so far for ``table`` (empty frame with the contract schema if nothing)."""
        t = TABLES[table]
        files = sorted(self.table_dir(table).glob("*.parquet"))
        if not files:
            return pl.LazyFrame(schema=t.stored_columns)
        return pl.scan_parquet(files)

    def replace(self, table: str, df: pl.DataFrame) -> int:
        """Drop what is staged for ``table`` and stage ``df`` instead."""
        shutil.rmtree(self.table_dir(table), ignore_errors=True)
        self._counters.pop(table, None)
        return self.add(table, df)

    def commit(self) -> None:
        """Swap every table's partition for this run into place.

        Tables with nothing staged get an empty, typed part file, so a run's partition is
        replaced whole even when a re-ingest produces fewer tables than before.
        """
        for name, t in TABLES.items():
            d = self.table_dir(name)
            if not any(d.glob("*.parquet")):
                write_part(t.empty(), t, d / "part-empty.parquet")
        for name in TABLES:
            _swap_dir(self.table_dir(name), partition_dir(self.root, name, self.run_id))
        shutil.rmtree(self.dir, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _swap_dir(new: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    trash = final.parent / f".trash-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(final, trash)
    except FileNotFoundError:
        trash = None  # type: ignore[assignment]
    os.rename(new, final)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def run_ids(root: Path) -> list[str]:
    """Runs present in the warehouse (those with a `runs` partition)."""
    base = parquet_root(root) / "runs"
    if not base.exists():
        return []
    return sorted(p.name.split("=", 1)[1] for p in base.iterdir() if p.is_dir() and p.name.startswith("run_id="))


def delete_run(root: Path, run_id: str) -> None:
    for name in TABLES:
        shutil.rmtree(partition_dir(root, name, run_id), ignore_errors=True)


def scan_table(root: Path, table: str, runs: Iterable[str] | None = None) -> pl.LazyFrame:
    """A lazy scan of a warehouse table with ``run_id`` from the hive path, in contract order."""
    t = TABLES[table]
    wanted = list(runs) if runs is not None else run_ids(root)
    files: list[str] = []
    for r in wanted:
        files.extend(str(p) for p in sorted(partition_dir(root, table, r).glob("*.parquet")))
    if not files:
        return pl.LazyFrame(schema=t.columns)
    lf = pl.scan_parquet(
        files,
        hive_partitioning=True,
        hive_schema={"run_id": pl.String()},
        missing_columns="insert",
        extra_columns="ignore",
        schema=t.stored_columns,
    )
    return lf.select(list(t.columns))
