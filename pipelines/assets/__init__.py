"""Assets by stage, one module per stage group (ingest, warehouse, characterize, fit, export).

To add a stage: write ``pipelines/assets/<stage>.py`` with module-level ``@asset`` /
``@multi_asset`` / ``@asset_check`` definitions; ``pipelines.definitions`` loads assets and checks
from every module of this package. Runs-partitioned
assets (``partitions_def=runs_partitions``) join the per-run job the sensor launches; the others
run in the cross-run job. The helpers below give every stage the same materialization metadata.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import polars as pl
from dagster import MetadataValue, TableColumn, TableSchema

from analyses.markdown import escape_text, markdown_table
from analyses.metadata import column_schema, frame_schema
from analyses.schema import Table


def stage_modules() -> list[ModuleType]:
    """Every stage module of this package (ingest, characterize, fit, export, ...)."""
    return [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]


def contract_table_schema(table: Table | str) -> TableSchema:
    """The contract's columns, each with its description, as a Dagster TableSchema."""
    return TableSchema(columns=[TableColumn(n, t, description=escape_text(d) if d else None)
                                for n, t, d in column_schema(table)])


def frame_table_schema(schema: Mapping[str, pl.DataType]) -> TableSchema:
    return TableSchema(columns=[TableColumn(n, t) for n, t in frame_schema(schema)])


def frame_metadata(head: pl.DataFrame, rows: int | None = None) -> dict[str, Any]:
    """Row count, column schema and a markdown preview; ``head`` may be the first rows of a
    table of ``rows`` rows (so a big table is never collected just to describe it)."""
    return {
        "dagster/row_count": MetadataValue.int(head.height if rows is None else rows),
        "dagster/column_schema": frame_table_schema(head.schema),
        "preview": MetadataValue.md(markdown_table(head, total_rows=rows)),
    }
