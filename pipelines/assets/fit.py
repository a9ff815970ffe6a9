"""Fit stage (group ``fit``): ``workload_specs`` fits every run that has per-sample lengths into
a PolyTrace spec (one file per run plus one for all runs) and scores each run's fidelity on its
steps by rolling origin, ours beside PolyTrace's histogram resampler (CRPS skill, coverage, KS);
runs with only a step log get the step-time model. The work is
:meth:`analyses.api.PolyTrace.fit_warehouse`; the scores go in the materialization metadata.
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

from analyses.api import RunFit
from analyses.fit.fidelity_table import criterion, fidelity_table
from pipelines.partitions import runs_partitions
from pipelines.resources import WarehouseResource

FIT_GROUP = "fit"
CATALOG = AssetKey("warehouse_catalog")


def fidelity_markdown(results: list[dict[str, Any]]) -> str:
    """The CLI's fidelity table, as a block the UI shows in a fixed-width font."""
    if not results:
        return "_No run with per-sample lengths or step times._"
    return "```text\n" + fidelity_table(results) + "\n```"


def fidelity_metadata(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The criterion's numbers per run and pooled, as the CLI prints them (``polytrace fidelity --all``)."""
    meta: dict[str, Any] = {}
    scored = [r for r in results if "rolling_origin" in r]
    for r in scored:
        x, run = r["rolling_origin"], r["run_id"]
        for k in ("crps_skill", "coverage90", "baseline_coverage90", "ks_mean", "baseline_ks_mean", "ceiling_accuracy_pct"):
            if x.get(k) is not None and x[k] == x[k]:
                meta[f"{k}/{run}"] = MetadataValue.float(round(float(x[k]), 4))
        meta[f"origins/{run}"] = MetadataValue.int(int(x["origins"]))
    c = criterion(scored)
    if c:
        for k in ("mean_crps_skill", "min_crps_skill", "pooled_coverage90", "pooled_baseline_coverage90", "max_ks_margin"):
            meta[k] = MetadataValue.float(round(float(c[k]), 4))
        meta["targets"] = MetadataValue.json(c["targets"])
    return meta


def summary_check_markdown(check: Any) -> str:
    """The fitted per-step quantiles beside the logged min / mean / max, as a Markdown table."""
    cols = ["step", "n", "logged_min", "expected_min", "fitted_p01", "fitted_p50", "logged_mean", "fitted_mean",
            "fitted_p99", "expected_max", "logged_max"]
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)
    body = "\n".join("| " + " | ".join("-" if r[c] is None else f"{r[c]:.0f}" for c in cols) + " |"
                     for r in check.head(MAX_CHECK_ROWS).iter_rows(named=True))
    more = f"\n\n_{check.height - MAX_CHECK_ROWS} more steps (the report has every step)_" if check.height > MAX_CHECK_ROWS else ""
    return head + "\n" + body + more


MAX_CHECK_ROWS = 40


def run_fit_metadata(f: RunFit) -> dict[str, Any]:
    """One run's fit as the UI shows it: what was done, the chosen options and its scores; for a
    run fitted from its per-step summaries, the fitted per-step quantiles against the logged ones."""
    meta: dict[str, Any] = {"computed": MetadataValue.bool(f.computed)}
    if f.spec is not None:
        meta["fitted_from"] = MetadataValue.text("fitted from summaries" if f.from_summaries else "fitted from samples")
    if f.summary_check is not None and f.summary_check.height:
        meta["summary_check"] = MetadataValue.md(summary_check_markdown(f.summary_check))
    if f.skipped:
        meta["skipped"] = MetadataValue.text(f.skipped)
    if f.spec_path is not None:
        meta["spec"] = MetadataValue.path(str(f.spec_path))
    if f.spec is not None:
        meta["selected"] = MetadataValue.json({k: (w.get("selection") or {}).get("selected")
                                               for k, w in f.spec["workloads"].items()})
    results = [x for x in (f.fidelity, f.step_model) if x is not None]
    if results:
        meta["fidelity"] = MetadataValue.md(fidelity_markdown(results))
    if f.fidelity is not None and "rolling_origin" in f.fidelity:
        x = f.fidelity["rolling_origin"]
        for k in ("crps_skill", "coverage90", "baseline_coverage90", "ks_mean", "baseline_ks_mean"):
            if x.get(k) is not None and x[k] == x[k]:
                meta[k] = MetadataValue.float(round(float(x[k]), 4))
        meta["origins"] = MetadataValue.int(int(x["origins"]))
    return meta


@asset(
    name="run_workload",
    group_name=FIT_GROUP,
    partitions_def=runs_partitions,
    deps=[AssetKey(t) for t in ("samples", "turns", "tool_calls", "rank_times", "steps", "step_metrics", "runs")],
    kinds={"scipy", "json"},
    automation_condition=AutomationCondition.eager(),
    description="One run's fit, after its ingest (its own job, `fit_run_job`, so a live run's next refresh and "
    "alerts never wait for it): its PolyTrace spec (`fits/<run>.spec.json`) and its "
    "rolling-origin fidelity, ours beside PolyTrace's histogram resampler; a run that logged only per-step "
    "summaries is fitted from those (metadata `fitted_from`, and `summary_check`: the fitted per-step quantiles "
    "against the logged min / mean / max), with its step-time model where it has step times. Kept in `fits/cache/<run>/` keyed by the run's input files, run.toml facts, fitting "
    "code and seeds, so `workload_specs` only combines and an unchanged run is never fitted again.",
)
def run_workload(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    f = warehouse.polytrace.fit_run(context.partition_key)
    context.log.info(f"{f.run_id}: {'fitted' if f.computed else 'from the cache'}" + (f"; {f.skipped}" if f.skipped else ""))
    return MaterializeResult(metadata=run_fit_metadata(f))


@asset(
    name="workload_specs",
    group_name=FIT_GROUP,
    deps=[CATALOG, AssetKey("run_workload")],
    kinds={"scipy", "json"},
    automation_condition=AutomationCondition.eager(),
    description="Per run x task: prompt/response lengths and latencies as the data's own body with a censored GPD "
    "tail (plus plain scipy families for PolyTrace's parameter file), turns and tool calls as pmfs, tool failures, "
    "reward time, the group copula and the step-to-step level of response lengths (shrunk trend, step random "
    "effect). Writes `fits/<run>.spec.json` and `fits/all_runs.spec.json` (schema: analyses/export/spec.schema.json), "
    "and scores each run by rolling origin, ours beside PolyTrace's 20-bin histogram resampler: CRPS skill, 90% "
    "interval coverage and KS of sample shape, the numbers `polytrace fidelity --all` prints. A run whose input "
    "files, run.toml facts and fitting code are unchanged since its last fit comes from `fits/cache/` (adding a run "
    "costs one run's fit).",
)
def workload_specs(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    pt = warehouse.polytrace
    out = pt.fit_warehouse()
    meta: dict[str, Any] = {
        "runs_fitted": MetadataValue.int(len(out.runs)),
        "runs_computed": MetadataValue.int(len(out.computed)),
        "fidelity": MetadataValue.md(fidelity_markdown(out.fidelity + out.step_models)),
        "fidelity_json": MetadataValue.path(str(pt.layout.fidelity_path)),
        **fidelity_metadata(out.fidelity),
    }
    if out.skipped:
        meta["skipped"] = MetadataValue.md("\n".join(f"- `{r}`: {why}" for r, why in out.skipped.items()))
    if "*" in out.specs:
        meta["spec"] = MetadataValue.path(str(out.specs["*"]))
    context.log.info(f"fitted {len(out.runs)} run(s); skipped {len(out.skipped)}")
    return MaterializeResult(metadata=meta)
