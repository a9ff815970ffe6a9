"""Fit stage (group ``fit``): ``workload_specs`` fits every run that has per-sample lengths into
a PolyTrace spec (one file per run plus one for all runs) and scores each run's fidelity on its
held-out steps, ours beside PolyTrace's histogram resampler; runs with only a step log get the
step-time model. The work is :meth:`analyses.api.PolyTrace.fit_warehouse`; the scores go in the
materialization metadata.
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AutomationCondition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from analyses.fit.fidelity_table import fidelity_table
from pipelines.resources import WarehouseResource

FIT_GROUP = "fit"
CATALOG = AssetKey("warehouse_catalog")


def fidelity_markdown(results: list[dict[str, Any]]) -> str:
    """The CLI's fidelity table, as a block the UI shows in a fixed-width font."""
    if not results:
        return "_No run with per-sample lengths or step times._"
    return "```text\n" + fidelity_table(results) + "\n```"


@asset(
    name="workload_specs",
    group_name=FIT_GROUP,
    deps=[CATALOG],
    kinds={"scipy", "json"},
    automation_condition=AutomationCondition.eager(),
    description="Per run x task: prompt/response lengths fitted by censored MLE over candidate families (AIC; KS, "
    "Wasserstein, p99/p99.9 errors per candidate), turns and tool calls as pmfs, tool latency as body + GPD tail, "
    "reward time, the prompt/response dependence (copula or mixture) and the response-length drift. Writes "
    "`fits/<run>.spec.json` and `fits/all_runs.spec.json` (schema: analyses/export/spec.schema.json), and scores "
    "each run's fidelity on held-out steps, ours beside PolyTrace's 20-bin histogram resampler.",
)
def workload_specs(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    pt = warehouse.polytrace
    out = pt.fit_warehouse()
    meta: dict[str, Any] = {
        "runs_fitted": MetadataValue.int(len(out.runs)),
        "fidelity": MetadataValue.md(fidelity_markdown(out.fidelity + out.step_models)),
        "fidelity_json": MetadataValue.path(str(pt.layout.fidelity_path)),
    }
    if out.skipped:
        meta["skipped"] = MetadataValue.md("\n".join(f"- `{r}`: {why}" for r, why in out.skipped.items()))
    if "*" in out.specs:
        meta["spec"] = MetadataValue.path(str(out.specs["*"]))
    for r in out.fidelity:
        meta[f"accuracy_pct/{r['run_id']}"] = MetadataValue.float(round(r["accuracy_pct"], 2))
        meta[f"baseline_accuracy_pct/{r['run_id']}"] = MetadataValue.float(round(r["baseline_accuracy_pct"], 2))
        meta[f"ceiling_accuracy_pct/{r['run_id']}"] = MetadataValue.float(round(r["ceiling_accuracy_pct"], 2))
    if out.fidelity:
        n = len(out.fidelity)
        meta["mean_accuracy_pct"] = MetadataValue.float(round(sum(r["accuracy_pct"] for r in out.fidelity) / n, 2))
        meta["mean_baseline_accuracy_pct"] = MetadataValue.float(round(sum(r["baseline_accuracy_pct"] for r in out.fidelity) / n, 2))
    context.log.info(f"fitted {len(out.runs)} run(s); skipped {len(out.skipped)}")
    return MaterializeResult(metadata=meta)
