"""Descriptions of warehouse tables for humans: markdown previews, column schemas, row counts.

Plain values only (strings, tuples, dicts), so the Dagster layer can wrap them in its metadata
types and the CLI or a notebook can print them as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path

import polars as pl

from analyses.schema import TABLES, Table
from analyses.warehouse import partition_dir

PREVIEW_ROWS = 5
PREVIEW_CELL_CHARS = 48


def dtype_name(dtype: pl.DataType) -> str:
    """A short, stable type name (``Datetime(us, UTC)`` rather than the repr)."""
    if isinstance(dtype, pl.Datetime):
        tz = f", {dtype.time_zone}" if dtype.time_zone else ""
        return f"Datetime({dtype.time_unit}{tz})"
    return str(dtype)


def column_schema(table: Table | str) -> list[tuple[str, str, str | None]]:
    """(name, type, description) per contract column, in contract order."""
    t = TABLES[table] if isinstance(table, str) else table
    out = []
    for name, dtype in t.columns.items():
        doc = t.docs.get(name)
        if name == "run_id":
            doc = "run id; the hive partition key (parquet/<table>/run_id=<id>/)"
        elif name in t.key:
            doc = f"key column{'; ' + doc if doc else ''}"
        out.append((name, dtype_name(dtype), doc))
    return out


def frame_schema(schema: Mapping[str, pl.DataType]) -> list[tuple[str, str]]:
    """(name, type) for a frame's or a Parquet file's schema."""
    return [(name, dtype_name(dtype)) for name, dtype in schema.items()]


def _cell(v: object, max_chars: int) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        s = "NaN" if math.isnan(v) else f"{v:.6g}"
    elif isinstance(v, datetime):
        s = v.isoformat(sep=" ")
    else:
        s = str(v)
    s = s.replace("\r", " ").replace("\n", " ")
    if len(s) > max_chars:
        s = s[: max_chars - 1] + "…"
    # a pipe would end the cell; backslash-escape it (and backslashes, so the escape stays one)
    return s.replace("\\", "\\\\").replace("|", "\\|")


def markdown_preview(
    df: pl.DataFrame,
    n: int = PREVIEW_ROWS,
    max_chars: int = PREVIEW_CELL_CHARS,
    total_rows: int | None = None,
) -> str:
    """The first ``n`` rows of ``df`` as a GitHub markdown table, long cells shortened.

    Says how many rows were left out (of ``total_rows`` when ``df`` is already a head), so a
    preview is never mistaken for the whole table.
    """
    if not df.columns:
        return "_(no columns)_"
    head = df.head(n)
    lines = [
        "| " + " | ".join(_cell(c, max_chars) for c in df.columns) + " |",
        "| " + " | ".join("---" for _ in df.columns) + " |",
    ]
    lines.extend("| " + " | ".join(_cell(v, max_chars) for v in row) + " |" for row in head.iter_rows())
    total = df.height if total_rows is None else total_rows
    if total == 0:
        lines.append("\n_(no rows)_")
    elif total > head.height:
        lines.append(f"\n_first {head.height} of {total:,} rows_")
    return "\n".join(lines)


def partition_files(root: Path, table: str, run_id: str) -> list[Path]:
    """The Parquet part files of one run's partition of ``table`` (sorted)."""
    return sorted(partition_dir(root, table, run_id).glob("*.parquet"))


def partition_rows(root: Path, table: str, run_id: str) -> int:
    """Rows in one run's partition of ``table`` (from Parquet footers; no data is read)."""
    files = partition_files(root, table, run_id)
    if not files:
        return 0
    return int(pl.scan_parquet(files).select(pl.len()).collect().item())


def run_row_counts(root: Path, run_id: str, tables: Iterable[str] | None = None) -> dict[str, int]:
    """Rows per table for one run."""
    return {t: partition_rows(root, t, run_id) for t in (tables if tables is not None else TABLES)}


def counts_markdown(counts: Mapping[str, int], key_header: str = "table", value_header: str = "rows") -> str:
    """A two-column markdown table of counts, in the mapping's order."""
    lines = [f"| {key_header} | {value_header} |", "| --- | ---: |"]
    lines.extend(f"| {_cell(k, 80)} | {v:,} |" for k, v in counts.items())
    return "\n".join(lines)
