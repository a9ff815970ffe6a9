"""Descriptions of warehouse tables for humans: column schemas and row counts.

Plain values only (strings, tuples, dicts), so the Dagster layer can wrap them in its metadata
types and the CLI or a notebook can print them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import polars as pl

from analyses.schema import TABLES, Table, column_docs
from analyses.warehouse import published_runs, read_published


def dtype_name(dtype: pl.DataType) -> str:
    """A short, stable type name (``Datetime(us, UTC)`` rather than the repr)."""
    if isinstance(dtype, pl.Datetime):
        tz = f", {dtype.time_zone}" if dtype.time_zone else ""
        return f"Datetime({dtype.time_unit}{tz})"
    return str(dtype)


def column_schema(table: Table | str) -> list[tuple[str, str, str | None]]:
    """(name, type, description) per contract column, in contract order."""
    t = TABLES[table] if isinstance(table, str) else table
    docs = column_docs(t)
    return [(name, dtype_name(dtype), docs[name]) for name, dtype in t.columns.items()]


def frame_schema(schema: Mapping[str, pl.DataType]) -> list[tuple[str, str]]:
    """(name, type) for a frame's or a Parquet file's schema."""
    return [(name, dtype_name(dtype)) for name, dtype in schema.items()]


def partition_rows(root: Path, table: str, run_id: str) -> int:
    """Rows in one run's published ``table`` (from its manifest; no data is read)."""
    m = read_published(root, run_id)
    return m.rows(table) if m is not None else 0


def table_rows(root: Path, table: str) -> int:
    """Rows of ``table`` over every published run (from the manifests)."""
    return sum(m.rows(table) for m in published_runs(root).values())


def run_row_counts(root: Path, run_id: str, tables: Iterable[str] | None = None) -> dict[str, int]:
    """Rows per table for one run."""
    return {t: partition_rows(root, t, run_id) for t in (tables if tables is not None else TABLES)}
