"""Ingest and warehouse stages.

``ingest_run`` (group ``ingest``): one multi-asset per run partition whose outputs are the
warehouse tables, so the UI shows each table with its rows, schema and a preview per run.
``warehouse_catalog`` (group ``warehouse``): the DuckDB file of views over every run's Parquet.
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    AssetSpec,
    AutomationCondition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
    multi_asset,
)

from analyses.ingest import RunReport
from analyses.markdown import counts_markdown, markdown_table
from analyses.metadata import partition_rows, table_rows
from analyses.schema import TABLES, Table
from analyses.views import all_views
from analyses.warehouse import partition_files, scan_table
from pipelines.assets import contract_table_schema, frame_metadata
from pipelines.partitions import FINGERPRINT_META, RUNS_PARTITIONS_NAME, run_fingerprint, runs_partitions
from pipelines.resources import WarehouseResource

INGEST_GROUP = "ingest"
WAREHOUSE_GROUP = "warehouse"
PREVIEW_ROWS = 5
FILES_LISTED = 200  # source_files rows shown in full in the materialization metadata


def _table_spec(t: Table) -> AssetSpec:
    return AssetSpec(
        key=t.name,
        group_name=INGEST_GROUP,
        partitions_def=runs_partitions,
        description=(
            f"Warehouse table `{t.name}`: one row per {t.row}. Parquet under "
            f"`parquet/{t.name}/run_id=<run>/`; in SQL: `SELECT * FROM {t.name}`."
        ),
        kinds={"parquet"},
        metadata={
            "dagster/column_schema": contract_table_schema(t),
            "one_row_per": t.row,
            "key": ", ".join(t.key) or "(none)",
        },
    )


TABLE_SPECS: list[AssetSpec] = [_table_spec(t) for t in TABLES.values()]
TABLE_KEYS: list[AssetKey] = [s.key for s in TABLE_SPECS]


@multi_asset(
    specs=TABLE_SPECS,
    name="ingest_run",
    description="Ingest one run directory (the partition) into every warehouse table: sniff each file, "
    "stream it through its reader, reject bad lines with a reason, swap the run's partitions in.",
)
def ingest_run_tables(context: AssetExecutionContext, warehouse: WarehouseResource) -> Iterator[MaterializeResult]:
    run_id = context.partition_key
    try:
        plan = warehouse.run_plan(run_id)
    except FileNotFoundError as exc:
        raise _missing_run(context, run_id, exc) from None
    part = f" ({len(plan.only)} of its files: {plan.reason})" if plan.only is not None else ""
    context.log.info(f"ingesting {plan.path}{part} as run {run_id} into {warehouse.root}")

    def progress(kind: str, data: dict) -> None:
        if kind == "file_done":
            context.log.info(data["report"].line())

    # the catalog refresh is the warehouse_catalog asset's job, once per run of the job
    fingerprint = run_fingerprint(plan).key  # before reading: a change during the ingest re-triggers
    report = warehouse.polytrace.ingest_planned(plan, progress=progress, refresh=False)
    for note in report.refresh_notes:  # why a refresh of a growing run could not read only the appended lines
        context.log.info(note)
    root = warehouse.root_path  # after the ingest: for an s3:// warehouse, the mirror now holds the run
    for name in TABLES:
        meta = _table_metadata(root, name, run_id, report)
        if name == "runs":  # the sensor compares this with the directory to skip unchanged runs
            meta[FINGERPRINT_META] = fingerprint
        yield MaterializeResult(asset_key=name, metadata=meta)


def _missing_run(context: AssetExecutionContext, run_id: str, exc: FileNotFoundError) -> Failure:
    """The one-line failure of a partition with no run behind it (a key mistyped in the launch
    dialog, or a run directory removed). A key that was never ingested is removed from the
    partitions, so that it does not linger in the UI; a run once ingested keeps its partition (its
    tables and history stay). Nothing is read or written, and no other partition is touched."""
    instance = context.instance
    ingested = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("runs"), asset_partitions=[run_id]), limit=1
    ).records
    if not ingested and instance.has_dynamic_partition(RUNS_PARTITIONS_NAME, run_id):
        instance.delete_dynamic_partition(RUNS_PARTITIONS_NAME, run_id)
        what = "never ingested, so the partition was removed (a mistyped key?)"
    else:
        what = "its tables from the last ingest stay; remove the partition if the run is gone for good"
    return Failure(description=f"{exc}: {what}", allow_retries=False)


def _table_metadata(root: Path, table: str, run_id: str, report: RunReport) -> dict[str, Any]:
    rows = partition_rows(root, table, run_id)
    head = scan_table(root, table, [run_id]).head(PREVIEW_ROWS).collect()
    meta = frame_metadata(head, rows)
    # a materialization is one partition's: Dagster shows dagster/row_count beside that partition, so
    # it is the partition's rows; the whole table's (every run ingested so far) is beside it
    meta["dagster/row_count"] = MetadataValue.int(rows)
    meta["partition_row_count"] = MetadataValue.int(rows)
    meta["table_row_count"] = MetadataValue.int(table_rows(root, table))
    # the stored schema equals the contract (the blocking schema check saw to it); show the contract's
    # column descriptions rather than bare names
    meta["dagster/column_schema"] = contract_table_schema(table)
    meta["run_id"] = run_id
    files = partition_files(root, table, run_id)
    if files:  # the newest segment (an append-only refresh adds one to the previous version's)
        meta["partition_file"] = MetadataValue.path(str(files[-1]))
        meta["partition_segments"] = MetadataValue.int(len(files))
    if table == "source_files":
        sf = scan_table(root, "source_files", [run_id]).head(FILES_LISTED).collect()
        cols = [
            "path",
            "format",
            "status",
            "lines",
            "rows_ok",
            "rows_rejected",
            "rows_skipped",
            "rows_out",
            "rows_superseded",
            "error",
        ]
        meta["files"] = MetadataValue.md(markdown_table(sf.select(cols), n=FILES_LISTED, total_rows=rows))
        meta["ingest_seconds"] = MetadataValue.float(round(report.seconds, 3))
        meta["ingest_mode"] = MetadataValue.text(report.mode)  # "append": only the appended lines were read
        meta["rows_rejected"] = MetadataValue.int(report.rows_rejected)
    elif table == "runs":
        meta["source_dir"] = MetadataValue.path(report.source)
    return meta


@asset(
    group_name=WAREHOUSE_GROUP,
    deps=TABLE_KEYS,
    kinds={"duckdb"},
    automation_condition=AutomationCondition.eager(),
    description="The DuckDB catalog (`polytrace.duckdb`): views over every run's Parquet, plus the registered "
    "characterization views. Holds no data; any DuckDB client can open it read-only.",
)
def warehouse_catalog(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    pt = warehouse.polytrace
    path = pt.refresh_catalog()
    con = pt.connect(views=[])  # the tables' counts: no derived view needed
    try:
        counts = {
            t: con.execute(f'SELECT count(*), count(DISTINCT run_id) FROM "{t}"').fetchone() for t in TABLES
        }
    finally:
        con.close()
    rows = {t: int(c[0]) for t, c in counts.items()}
    runs = int(counts["runs"][1])
    context.log.info(f"catalog {path}: {runs} run(s); " + ", ".join(f"{t}={n}" for t, n in rows.items() if n))
    views = sorted(v.name for v in all_views())
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(path)),
            "runs": MetadataValue.int(runs),
            "table_rows": MetadataValue.md(counts_markdown(rows)),
            "views": MetadataValue.md(", ".join(f"`{v}`" for v in views) or "_(no registered views yet)_"),
        }
    )
