"""Training-health alerts in Dagster: one asset check per alert kind on each run's partition, and
a sensor that sends each new alert once (:mod:`analyses.alerts`, ``$POLYTRACE_NOTIFY``).

The checks sit on the run's ``steps`` partition, run in the per-run job right after the tables
land, and take their severity from :data:`analyses.views.training_health.ALERT_RULES`: ERROR for
collapses (response length, reward, entropy), WARN for the rest (clip ratio at the cap,
throughput drop). A run with an active alert is red or yellow in the UI, with the alert's first
step, value and earlier level in the check's metadata. The checks never block: a collapsing run's
data is still worth fitting and reading.

The sensor follows the ``steps`` materializations (a cursor on the event log), however they were
launched: the per-run job a logs-root sensor started, a materialization from the UI, the demo. It
reads the alerts of the partitions materialized since its last tick and sends those not sent
before. It does not wait for the job to end: the job goes on to check and fit the run (the fit
alone takes longer than an append-only ingest), while the tables, and so the alerts, are
published the moment ``steps`` materializes.
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    DefaultSensorStatus,
    MetadataValue,
    SensorEvaluationContext,
    SensorResult,
    multi_asset_check,
    sensor,
)

from analyses.alerts import (
    ALERTS_VIEW,
    ENV_NOTIFY,
    NotifyConfigError,
    deliver,
    notify_urls,
    run_alerts,
    state_path,
)
from analyses.views.training_health import ALERT_RULES
from pipelines.partitions import runs_partitions
from pipelines.resources import WarehouseResource

ALERT_ASSET = "steps"
NOTIFY_SENSOR = "health_alert_notifications"


def check_name(kind: str) -> str:
    return f"alert_{kind}"


_SEVERITY = {"error": AssetCheckSeverity.ERROR, "warn": AssetCheckSeverity.WARN}


@multi_asset_check(
    specs=[
        AssetCheckSpec(
            check_name(r.kind),
            asset=ALERT_ASSET,
            additional_deps=["step_metrics", "samples"],
            partitions_def=runs_partitions,
            description=f"{r.severity.upper()} when raised: {r.meaning} (health_alerts, docs/views.md).",
        )
        for r in ALERT_RULES
    ],
    name="health_alert_checks",
)
def health_alert_checks(context: AssetCheckExecutionContext, warehouse: WarehouseResource) -> Iterator[AssetCheckResult]:
    con = warehouse.connect([ALERTS_VIEW])  # binding every view took longer than the alerts
    try:
        raised = {a.kind: a for a in run_alerts(con, [context.partition_key])}
    finally:
        con.close()
    for r in ALERT_RULES:
        a = raised.get(r.kind)
        meta = {"rule": MetadataValue.text(r.meaning), "threshold": r.threshold, "sustain_steps": r.sustain}
        if a is not None:
            meta |= {
                "first_step": a.first_step,
                "last_step": a.last_step,
                "steps_affected": a.n_steps,
                "value_at_first_step": a.first_value,
                "earlier_level": a.earlier_level,
                "detail": MetadataValue.text(a.detail),
            }
        yield AssetCheckResult(
            asset_key=ALERT_ASSET,
            check_name=check_name(r.kind),
            passed=a is None,
            severity=_SEVERITY[r.severity],
            metadata=meta,
            description=a.detail if a is not None else f"not raised: {r.meaning}",
        )


NOTIFY_INTERVAL_S = 5
MATERIALIZATIONS_PER_TICK = 1000  # more wait for the next tick (the cursor keeps the place)


@sensor(
    name=NOTIFY_SENSOR,
    minimum_interval_seconds=NOTIFY_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description=f"Sends each new training-health alert once to the Apprise URLs in ${ENV_NOTIFY} "
    f"(Slack, e-mail, webhooks, ...) as soon as a run's `{ALERT_ASSET}` partition materializes.",
)
def health_alert_notifications(context: SensorEvaluationContext, warehouse: WarehouseResource) -> SensorResult:
    after = int(context.cursor) if context.cursor else None
    got = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(ALERT_ASSET), after_storage_id=after),
        limit=MATERIALIZATIONS_PER_TICK,
        ascending=True,
    ).records
    if not got:
        return SensorResult(skip_reason=f"no `{ALERT_ASSET}` materialized since the last tick", cursor=context.cursor)
    cursor = str(got[-1].storage_id)
    partitions = sorted({r.partition_key for r in got if r.partition_key})
    urls = notify_urls()
    if not urls:  # the alerts stay visible as asset checks; the cursor moves on so that none is sent late
        return SensorResult(skip_reason=f"${ENV_NOTIFY} is not set: alerts are shown as asset checks only",
                            cursor=cursor)
    con = warehouse.connect([ALERTS_VIEW])
    try:
        alerts = run_alerts(con, partitions)
    finally:
        con.close()
    try:
        done = deliver(alerts, urls, state_path(warehouse.root_path))
    except NotifyConfigError as exc:
        context.log.error(str(exc))
        return SensorResult(skip_reason=str(exc), cursor=cursor)
    for line in done.lines():
        (context.log.warning if line.startswith("notification failed") else context.log.info)(line)
    if not done.sent and not done.failed:
        why = f"no new alert in {', '.join(partitions)} ({len(alerts)} raised, {done.already} sent before)"
        return SensorResult(skip_reason=why, cursor=cursor)
    return SensorResult(cursor=cursor)
