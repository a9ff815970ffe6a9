"""Assets by stage, one module per stage group (ingest, warehouse, characterize, fit, export).

To add a stage: write ``pipelines/assets/<stage>.py`` with module-level ``@asset`` /
``@multi_asset`` / ``@asset_check`` definitions and list its module name in ``STAGE_MODULES``;
``pipelines.definitions`` loads assets and checks from every listed module. Runs-partitioned
assets (``partitions_def=runs_partitions``) join the per-run job the sensor launches; the others
run in the cross-run job. The helpers below give every stage the same materialization metadata.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import polars as pl
from dagster import MetadataValue, TableColumn, TableSchema

from analyses.metadata import column_schema, frame_schema, markdown_preview
from analyses.schema import Table

STAGE_MODULES: tuple[str, ...] = (
    "pipelines.assets.ingest",  # groups "ingest" (per-run tables) and "warehouse" (the catalog)
    "pipelines.assets.characterize",  # group "characterize": one asset per view group, the HTML report
    "pipelines.assets.fit",  # group "fit": workload specs per run + fidelity scores
    "pipelines.assets.export",  # group "export": every export format per run
)


def stage_modules() -> list[ModuleType]:
    return [importlib.import_module(m) for m in STAGE_MODULES]


def contract_table_schema(table: Table | str) -> TableSchema:
    """The contract's columns as a Dagster TableSchema (shown on the asset before any run)."""
    return TableSchema(columns=[TableColumn(n, t, description=d) for n, t, d in column_schema(table)])


def frame_table_schema(schema: Mapping[str, pl.DataType]) -> TableSchema:
    return TableSchema(columns=[TableColumn(n, t) for n, t in frame_schema(schema)])


def frame_metadata(head: pl.DataFrame, rows: int | None = None) -> dict[str, Any]:
    """Row count, column schema and a markdown preview; ``head`` may be the first rows of a
    table of ``rows`` rows (so a big table is never collected just to describe it)."""
    return {
        "dagster/row_count": MetadataValue.int(head.height if rows is None else rows),
        "dagster/column_schema": frame_table_schema(head.schema),
        "preview": MetadataValue.md(markdown_preview(head, total_rows=rows)),
    }
