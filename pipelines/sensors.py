"""The logs-root sensor: a partition per run directory, a run per new or changed directory.

Each tick stats the immediate subdirectories of the logs root (no file is opened), adds a
dynamic partition for every run id not yet known, and requests the per-run job for every
directory whose fingerprint (files, bytes, newest mtime) differs from the cursor. A run the
cursor has not seen (first tick, or a reset cursor) is compared with the fingerprint recorded by
its last ingest, so restarting the UI does not re-ingest unchanged runs.

Live runs are followed as they grow: a run is requested at the first tick that sees it changed,
without waiting for it to go quiet (the next ingest reads only the appended lines:
analyses.append_ingest; a run still being copied in is ingested as far as it got, and again at
the next tick). Two limits keep that cheap: one ingest per run id at a time (a run whose ingest
is queued or in progress waits for a later tick) and one tick per ``MIN_INTERVAL_SECONDS``.
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from pipelines.partitions import (
    FINGERPRINT_META,
    RUNS_PARTITIONS_NAME,
    is_valid_key,
    run_fingerprint,
    runs_partitions,
    scan_runs,
)
from pipelines.resources import WarehouseResource

INGEST_JOB_NAME = "ingest_run_job"  # defined in pipelines.definitions (the per-run selection)
FIT_RUN_JOB_NAME = "fit_run_job"  # defined in pipelines.definitions (the run's fit, after its ingest)
CROSS_RUN_JOB_NAME = "cross_run_job"  # defined in pipelines.definitions (everything else)
CROSS_RUN_AUTOMATION = "cross_run_automation"
MIN_INTERVAL_SECONDS = 30
FINGERPRINT_ASSET = AssetKey("runs")
PARTITION_NAME_TAG = "dagster/partition"  # the tag Dagster puts on a partitioned run (dagster._core.storage.tags)
_UNFINISHED = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
               DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class RunDirState:
    run_id: str
    path: str
    fingerprint: str
    newest_mtime_s: float


def scan_logs_root(logs_root_path: str) -> tuple[dict[str, RunDirState], dict[str, str]]:
    """Every usable run directory under the logs root, by run id, with its fingerprint; and the
    unusable ones (by directory name) with why."""
    runs, problems = scan_runs(Path(logs_root_path))
    out = {}
    for rid, plan in runs.items():
        try:
            fp = run_fingerprint(plan)
        except OSError as exc:  # vanished or unreadable mid-scan
            problems[plan.path.name] = f"cannot stat: {exc}"
            continue
        out[rid] = RunDirState(rid, str(plan.path), fp.key, fp.newest_mtime_ns / 1e9)
    return out, problems


@dataclass
class TickPlan:
    new_partitions: list[str] = field(default_factory=list)
    requests: list[RunDirState] = field(default_factory=list)
    cursor: dict[str, str] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)  # an ingest of the run is queued or in progress
    invalid: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)  # partitions with no run behind them, never ingested


def plan_tick(
    states: Mapping[str, RunDirState],
    cursor: Mapping[str, str],
    existing_partitions: set[str],
    last_ingested: Callable[[str], str | None] = lambda _rid: None,
    busy: Callable[[str], bool] = lambda _rid: False,
) -> TickPlan:
    """What one tick does, as data: partitions to add, runs to request, the next cursor.

    ``cursor`` maps run id -> fingerprint last requested; ``last_ingested(run_id)`` gives the
    fingerprint recorded by the run's last ingest, consulted only for runs the cursor lacks;
    ``busy(run_id)``: an ingest of the run is queued or running (the change waits for it).
    Directories that disappeared drop out of the cursor (a re-appearing one is ingested again).
    A partition with no run under the logs root that was never ingested (a key mistyped in the
    UI's launch dialog) is a phantom: it is removed. One once ingested stays (its tables do).
    """
    plan = TickPlan()
    plan.phantoms = sorted(rid for rid in existing_partitions if rid not in states and last_ingested(rid) is None)
    for rid, st in sorted(states.items()):
        if not is_valid_key(rid):
            plan.invalid.append(rid)
            continue
        if rid not in existing_partitions:
            plan.new_partitions.append(rid)
        known = cursor.get(rid)
        if known is None and rid in existing_partitions:
            known = last_ingested(rid)
        if known == st.fingerprint:
            plan.cursor[rid] = st.fingerprint
            continue
        if busy(rid):
            plan.busy.append(rid)
            if known is not None:
                plan.cursor[rid] = known
            continue
        plan.requests.append(st)
        plan.cursor[rid] = st.fingerprint
    return plan


def _load_cursor(raw: str | None) -> dict[str, str]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


@sensor(
    job_name=INGEST_JOB_NAME,
    minimum_interval_seconds=MIN_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description="Watches $POLYTRACE_LOGS_ROOT (default sample_logs/): adds a `runs` partition per run "
    "directory and ingests new or changed ones.",
)
def run_dirs_sensor(context: SensorEvaluationContext, warehouse: WarehouseResource) -> SensorResult:
    instance = context.instance

    def last_ingested(rid: str) -> str | None:
        res = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=FINGERPRINT_ASSET, asset_partitions=[rid]), limit=1
        )
        if not res.records:
            return None
        mat = res.records[0].asset_materialization
        val = mat.metadata.get(FINGERPRINT_META) if mat is not None else None
        return str(val.value) if val is not None else None

    def busy(rid: str) -> bool:
        return bool(instance.get_run_ids(RunsFilter(job_name=INGEST_JOB_NAME, statuses=_UNFINISHED,
                                                    tags={PARTITION_NAME_TAG: rid}), limit=1))

    states, problems = scan_logs_root(warehouse.logs_root)
    for name, why in sorted(problems.items()):
        context.log.warning(f"run directory {name!r} skipped: {why}")
    existing = set(instance.get_dynamic_partitions(RUNS_PARTITIONS_NAME))
    plan = plan_tick(
        states, _load_cursor(context.cursor), existing, last_ingested, busy
    )
    for rid in plan.invalid:
        context.log.warning(f"run id {rid!r} cannot be a Dagster partition key; rename its directory")
    if plan.busy:
        context.log.info(f"changed while their ingest runs, next tick: {', '.join(plan.busy)}")
    if plan.phantoms:
        context.log.warning(f"removing partition(s) with no run directory, never ingested: {', '.join(plan.phantoms)}")
    cursor = json.dumps(plan.cursor, sort_keys=True)
    removals = [runs_partitions.build_delete_request(plan.phantoms)] if plan.phantoms else []
    if not plan.new_partitions and not plan.requests and not plan.phantoms:
        waiting = f", {len(plan.busy)} changed while being ingested" if plan.busy else ""
        return SensorResult(
            skip_reason=f"{len(states)} run dir(s) under {warehouse.logs_root}, none new or changed{waiting}",
            cursor=cursor,
        )
    return SensorResult(
        run_requests=[
            RunRequest(
                partition_key=st.run_id,
                run_key=f"{st.run_id}@{st.fingerprint}",
                tags={"polytrace/run_dir": st.path},
            )
            for st in plan.requests
        ],
        dynamic_partitions_requests=([runs_partitions.build_add_request(plan.new_partitions)]
                                     if plan.new_partitions else []) + removals,
        cursor=cursor,
    )


def cross_run_automation(target: AssetSelection) -> AutomationConditionSensorDefinition:
    """Evaluates the ``AutomationCondition.eager()`` of everything after the ingest: once the
    per-run tables of some run were materialized (by the run-directory sensor, the UI, the demo or
    a backfill) and no upstream is still in progress, that run's fit runs, and the catalog, views,
    report, fits and exports refresh once."""
    return AutomationConditionSensorDefinition(
        CROSS_RUN_AUTOMATION,
        target=target,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=MIN_INTERVAL_SECONDS,
        description="Fits each run after its ingest, and refreshes the cross-run assets (catalog, "
        "characterization, fits, exports) after ingests.",
    )
