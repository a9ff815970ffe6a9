"""The code location: ``dagster dev -m pipelines.definitions`` loads ``defs``.

Assets and checks come from every stage module of ``pipelines.assets``
(plus ``pipelines.checks``). Three jobs cover everything:

- ``ingest_run_job`` (one run per ``runs`` partition; the logs-root sensor launches it): the
  run's tables (group ``ingest``) with their checks and health alerts, then ``warehouse_catalog``
  so that a run's tables are queryable as soon as its job ends;
- ``fit_run_job`` (one run per partition): the run's own fit (``run_workload``). It is not part
  of the ingest job because it takes longer than an append-only refresh of a live run, and the
  sensor starts one ingest per run id at a time: an alert must not wait for a fit;
- ``cross_run_job``: every asset that is not runs-partitioned (cross-run views, fits, exports).

Everything after the ingest carries ``AutomationCondition.eager()``; the ``cross_run_automation``
sensor fits a run after its ingest and refreshes the cross-run assets once a burst of ingests has
finished, however those were launched.

Steps run in the run's process unless ``$POLYTRACE_EXECUTOR=ray`` sends them to a Ray cluster
(:mod:`pipelines.executors`). Dagster's DuckDBResource (dagster-duckdb) is deliberately not used:
see ``pipelines.resources``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dagster import (
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    Definitions,
    ExecutorDefinition,
    define_asset_job,
    load_asset_checks_from_modules,
    load_assets_from_modules,
)

from pipelines import alerts, checks, report_server
from pipelines.assets import stage_modules
from pipelines.assets.ingest import INGEST_GROUP
from pipelines.executors import executor_from_env
from pipelines.partitions import RUNS_PARTITIONS_NAME
from pipelines.resources import WarehouseResource
from pipelines.sensors import (
    CROSS_RUN_JOB_NAME,
    FIT_RUN_JOB_NAME,
    INGEST_JOB_NAME,
    cross_run_automation,
    run_dirs_sensor,
)

CATALOG_KEY = AssetKey("warehouse_catalog")


def per_run_keys(assets: Sequence[object], group: str | None = None) -> list[AssetKey]:
    """Keys of the assets partitioned by run (of ``group`` only, when given)."""
    out: list[AssetKey] = []
    for a in assets:
        pd = getattr(a, "partitions_def", None)
        if (
            isinstance(a, AssetsDefinition)
            and pd is not None
            and getattr(pd, "name", None) == RUNS_PARTITIONS_NAME
        ):
            out.extend(k for k in a.keys if group is None or a.group_names_by_key[k] == group)
    return sorted(out, key=lambda k: k.to_user_string())


def build_defs(warehouse: WarehouseResource | None = None, executor: ExecutorDefinition | None = None) -> Definitions:
    """The definitions, with ``warehouse`` and ``executor`` (default: each from the environment)."""
    modules = stage_modules()
    assets = list(load_assets_from_modules(modules))
    asset_checks = list(load_asset_checks_from_modules([*modules, checks, alerts]))
    per_run = per_run_keys(assets)
    tables = per_run_keys(assets, INGEST_GROUP)
    ingest_job = define_asset_job(
        INGEST_JOB_NAME,
        selection=AssetSelection.assets(*tables) | AssetSelection.assets(CATALOG_KEY),
        description="Ingest one run (partition) into every table, check the tables and the run's health, "
        "refresh the catalog.",
    )
    per_run_after = AssetSelection.assets(*[k for k in per_run if k not in tables])
    fit_job = define_asset_job(
        FIT_RUN_JOB_NAME,
        selection=per_run_after,
        description="Fit one run (partition) after its ingest; the cross_run_automation sensor starts it.",
    )
    cross_run = AssetSelection.all() - AssetSelection.assets(*per_run)
    cross_run_job = define_asset_job(
        CROSS_RUN_JOB_NAME,
        selection=cross_run,
        description="Everything that reads across runs: the catalog, characterization views, fits, exports.",
    )
    return Definitions(
        assets=assets,
        asset_checks=asset_checks,
        jobs=[ingest_job, fit_job, cross_run_job],
        sensors=[run_dirs_sensor, cross_run_automation(cross_run | per_run_after),
                 alerts.health_alert_notifications],
        resources={"warehouse": warehouse if warehouse is not None else WarehouseResource.from_env()},
        # Runs (= run partitions) are the unit of parallelism: the UI and the sensor launch one
        # process per run; where its steps run is pipelines.executors' choice
        executor=executor if executor is not None else executor_from_env(),
    )


defs = build_defs()
# reports, PNGs and comparisons on http://127.0.0.1:3001 under `dagster dev` (pipelines.report_server)
report_server.start(defs.resources["warehouse"].polytrace.layout.reports)
