"""Asset checks on the warehouse tables, per run partition. The logic lives in
``analyses.table_checks``; this module says which asset each check is on and whether it blocks.

Blocking (downstream assets of the run do not execute when they fail): the schema check, since
every view and fit reads columns by name and type; unique ordered steps, since a duplicate
step double-counts in every per-step aggregate; and that the run has data (a run of nothing is no
run). The others report without blocking.
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    MetadataValue,
    asset_check,
    multi_asset_check,
)

from analyses import table_checks as tc
from analyses.schema import TABLES
from pipelines.partitions import runs_partitions
from pipelines.resources import WarehouseResource

SCHEMA_CHECK = "schema_matches_contract"
TIMES_CHECK = "non_negative_times"


def _result(outcome: tc.CheckOutcome, **kw: Any) -> AssetCheckResult:
    passed, meta = outcome
    return AssetCheckResult(passed=passed, metadata={k: _meta_value(v) for k, v in meta.items()}, **kw)


def _meta_value(v: Any) -> Any:
    # lists and dicts of plain values would render as JSON; a short markdown list reads better
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return (
            MetadataValue.md("\n".join(f"- {x}" for x in v) or "_(none)_")
            if v
            else MetadataValue.text("(none)")
        )
    return v


@multi_asset_check(
    specs=[
        AssetCheckSpec(
            SCHEMA_CHECK,
            asset=name,
            blocking=True,
            partitions_def=runs_partitions,
            description=f"Every Parquet file of the run's `{name}` partition has exactly the contract's "
            "columns, dtypes and order (analyses/schema.py).",
        )
        for name in TABLES
    ],
    name="table_schemas",
)
def table_schemas(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> Iterator[AssetCheckResult]:
    for name in TABLES:
        yield _result(
            tc.check_schema_partition(warehouse.root_path, name, context.partition_key),
            asset_key=name,
            check_name=SCHEMA_CHECK,
        )


@asset_check(asset="steps", blocking=True, partitions_def=runs_partitions)
def unique_ordered_steps(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> AssetCheckResult:
    """One row per training step, no null step, ascending step order within the run."""
    return _result(tc.check_steps_partition(warehouse.root_path, context.partition_key))


@multi_asset_check(
    specs=[
        AssetCheckSpec(
            TIMES_CHECK,
            asset=name,
            partitions_def=runs_partitions,
            description=f"No negative or NaN duration in {', '.join(f'`{c}`' for c in tc.time_columns(name))}.",
        )
        for name in tc.TIME_TABLES
    ],
    name="table_times",
)
def table_times(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> Iterator[AssetCheckResult]:
    for name in tc.TIME_TABLES:
        yield _result(
            tc.check_non_negative_partition(warehouse.root_path, name, context.partition_key),
            asset_key=name,
            check_name=TIMES_CHECK,
        )


@asset_check(
    asset="rejects",
    additional_deps=["source_files"],
    partitions_def=runs_partitions,
    description=f"Rejected lines are at most {tc.MAX_REJECT_SHARE:.0%} of the run's candidate lines "
    "(parsed + rejected; skipped noise left out). Warns; lists the worst files and top reasons.",
)
def reject_share(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> AssetCheckResult:
    return _result(
        tc.check_rejects_partition(warehouse.root_path, context.partition_key),
        severity=AssetCheckSeverity.WARN,
    )


@asset_check(asset="steps", additional_deps=["source_files"], blocking=True, partitions_def=runs_partitions)
def run_has_data(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> AssetCheckResult:
    """Some file of the run gave a parsed line; a run of nothing (junk, binary files, logs of no known
    format) fails here with each file's reason (source_files), and nothing downstream of the run
    executes (on `steps`, which the run's fit and the catalog depend on)."""
    return _result(tc.check_run_has_data_partition(warehouse.root_path, context.partition_key))


@asset_check(asset="source_files", partitions_def=runs_partitions)
def lines_accounted(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> AssetCheckResult:
    """Every input line of every readable file is parsed, rejected or skipped: ok + rejected + skipped == lines."""
    return _result(tc.check_lines_accounted_partition(warehouse.root_path, context.partition_key))


@asset_check(
    asset="step_metrics",
    additional_deps=["source_files"],
    partitions_def=runs_partitions,
    description=f"Step metrics logged again later in the same file (a log concatenated to itself, a run restarted "
    f"into its log; stored once, the later occurrence kept) are at most {tc.MAX_REPEATED_SHARE:.0%} of the run's "
    "step metrics. Warns; lists the files.",
)
def repeated_steps(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> AssetCheckResult:
    return _result(
        tc.check_repeated_partition(warehouse.root_path, context.partition_key),
        severity=AssetCheckSeverity.WARN,
    )
