"""Frames as text for people: one cell formatter and one GitHub-markdown table writer.

Used for Dagster asset metadata, the report's tables and the CLI, so a number reads the same
everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

import polars as pl

PREVIEW_ROWS = 5
PREVIEW_CELL_CHARS = 48


def escape_text(s: str) -> str:
    """``s`` shown as written by a markdown renderer: ``<table>`` would otherwise be taken for an
    HTML tag and vanish (Dagster renders column and asset descriptions as markdown)."""
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def format_value(v: object, max_items: int = 20) -> str:
    """One cell as text: NULL empty, floats to 6 significant digits, lists cut at ``max_items``."""
    if v is None:
        return ""
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, list):
        return ", ".join(format_value(x) for x in v[:max_items]) + (" …" if len(v) > max_items else "")
    return str(v)


def _cell(v: object, max_chars: int) -> str:
    s = format_value(v).replace("\r", " ").replace("\n", " ")
    if len(s) > max_chars:
        s = s[: max_chars - 1] + "…"
    # a pipe would end the cell; backslash-escape it (and backslashes, so the escape stays one)
    return s.replace("\\", "\\\\").replace("|", "\\|")


def markdown_table(
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


def counts_markdown(counts: Mapping[str, int], key_header: str = "table", value_header: str = "rows") -> str:
    """A two-column markdown table of counts, in the mapping's order."""
    lines = [f"| {key_header} | {value_header} |", "| --- | ---: |"]
    lines.extend(f"| {_cell(k, 80)} | {v:,} |" for k, v in counts.items())
    return "\n".join(lines)
