"""Fit stage (group ``fit``): ``workload_specs`` fits every run that has per-sample lengths into
a PolyTrace spec (one file per run plus one for all runs) and scores each run's fidelity on its
held-out steps, ours beside PolyTrace's histogram resampler; runs with only a step log get the
step-time model. The scores are in the materialization metadata; the work is in ``analyses.fit``.

Cross-run (not partitioned): a spec is a product of the whole warehouse, and the definitions put
fits and exports in the cross-run job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dagster import AssetKey, MaterializeResult, MetadataValue, asset

from pipelines.resources import WarehouseResource

FIT_GROUP = "fit"
CATALOG = AssetKey("warehouse_catalog")
FIT_DIR = "fits"
FIDELITY_SEEDS = tuple(range(200))


def fit_dir(root: Path) -> Path:
    return root / FIT_DIR


def spec_path(root: Path, run_id: str | None = None) -> Path:
    return fit_dir(root) / (f"{run_id}.spec.json" if run_id else "all_runs.spec.json")


def fidelity_path(root: Path) -> Path:
    return fit_dir(root) / "fidelity.json"


def fidelity_markdown(results: list[dict[str, Any]]) -> str:
    if not results:
        return "_No run with per-sample lengths._"
    nan = float("nan")
    head = ("| run | split | held-out steps | ours % (± MC s.e.) | PolyTrace histogram % | ceiling % | recorded mean % "
            "| one replay ours/base % | level ours/base % | in-sample ours/base % |\n|---|---|---|---|---|---|---|---|---|---|")
    rows = [
        f"| {r['run_id']} | {r['split']} | {len(r['heldout_steps'])} | {r['accuracy_pct']:.1f} ± {r.get('monte_carlo_se_pct', nan):.1f} "
        f"| {r['baseline_accuracy_pct']:.1f} | {r.get('ceiling_accuracy_pct', nan):.1f} | {r.get('recorded_mean_accuracy_pct', nan):.1f} "
        f"| {r['single_replay_accuracy_pct']:.1f} / {r['baseline_single_replay_accuracy_pct']:.1f} "
        f"| {r['level_accuracy_pct']:.1f} / {r['baseline_level_accuracy_pct']:.1f} "
        f"| {r.get('in_sample_level_accuracy_pct', nan):.1f} / {r.get('baseline_in_sample_level_accuracy_pct', nan):.1f} |"
        for r in results
    ]
    note = ("\n\n_ceiling_: the best a prediction that is the same for every held-out step can score, chosen knowing "
            "the held-out answers (see `analyses/fit/score_refs.py`).")
    rows[-1] += note
    return "\n".join([head, *rows])


def step_model_markdown(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        m = r.get("step_time_model") or {}
        for t in ("gen_time_s", "step_time_s"):
            if t in m:
                rows.append(f"| {r['run_id']} | {t} | {m[t]['accuracy_from_real_workload_pct']:.1f} | "
                            f"{m[t]['accuracy_from_generated_workload_pct']:.1f} | {m[t]['baseline_mean_accuracy_pct']:.1f} |")
    if not rows:
        return "_No run with step times and token counts._"
    return "| run | target | from real workload % | from generated workload % | training-mean % |\n|---|---|---|---|---|\n" + "\n".join(rows)


def fit_warehouse(root: Path, seeds: tuple[int, ...] = FIDELITY_SEEDS) -> dict[str, Any]:
    """Specs and fidelity for every run; the plain function behind the asset (testable without Dagster)."""
    from analyses.fit.data import fit_runs, load_run, runs_with_samples, runs_with_steps
    from analyses.fit.fidelity import fidelity, step_time_only
    from analyses.fit.spec import write_spec

    fit_dir(root).mkdir(parents=True, exist_ok=True)
    specs: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    runs = []
    for r in runs_with_samples(root):
        try:  # a run too small to fit is reported, not fatal for the others
            specs[r] = write_spec(fit_runs(root, [r]), spec_path(root, r))
            runs.append(r)
        except ValueError as exc:
            skipped[r] = str(exc)
    if runs:
        specs["*"] = write_spec(fit_runs(root, runs), spec_path(root))
    results = []
    for r in runs:
        try:
            results.append(fidelity(load_run(root, r), seeds=seeds))
        except ValueError as exc:
            skipped[r] = f"fidelity: {exc}"
    timed = [t for t in (step_time_only(load_run(root, r)) for r in runs_with_steps(root) if r not in runs) if t]
    slim = [{k: v for k, v in r.items() if k != "real_per_step"} for r in [*results, *timed]]
    fidelity_path(root).write_text(json.dumps(slim, indent=1) + "\n")
    return {"runs": runs, "specs": specs, "fidelity": results, "step_models": timed, "skipped": skipped}


@asset(
    name="workload_specs",
    group_name=FIT_GROUP,
    deps=[CATALOG],
    kinds={"scipy", "json"},
    description="Per run x task: prompt/response lengths fitted by censored MLE over candidate families (AIC; KS, "
    "Wasserstein, p99/p99.9 errors per candidate), turns and tool calls as pmfs, tool latency as body + GPD tail, "
    "reward time, the prompt/response dependence (copula or mixture) and the response-length drift. Writes "
    "`fits/<run>.spec.json` and `fits/all_runs.spec.json` (schema: analyses/fit/spec.schema.json), and scores "
    "each run's fidelity on held-out steps, ours beside PolyTrace's 20-bin histogram resampler.",
)
def workload_specs(context, warehouse: WarehouseResource) -> MaterializeResult:
    out = fit_warehouse(warehouse.root_path)
    meta: dict[str, Any] = {
        "runs_fitted": MetadataValue.int(len(out["runs"])),
        "fidelity": MetadataValue.md(fidelity_markdown(out["fidelity"])),
        "step_time_model": MetadataValue.md(step_model_markdown(out["fidelity"] + out["step_models"])),
        "fidelity_json": MetadataValue.path(str(fidelity_path(warehouse.root_path))),
    }
    if out["skipped"]:
        meta["skipped"] = MetadataValue.md("\n".join(f"- `{r}`: {why}" for r, why in out["skipped"].items()))
    if "*" in out["specs"]:
        meta["spec"] = MetadataValue.path(str(out["specs"]["*"]))
    for r in out["fidelity"]:
        meta[f"accuracy_pct/{r['run_id']}"] = MetadataValue.float(round(r["accuracy_pct"], 2))
        meta[f"baseline_accuracy_pct/{r['run_id']}"] = MetadataValue.float(round(r["baseline_accuracy_pct"], 2))
        meta[f"ceiling_accuracy_pct/{r['run_id']}"] = MetadataValue.float(round(r["ceiling_accuracy_pct"], 2))
    if out["fidelity"]:
        n = len(out["fidelity"])
        meta["mean_accuracy_pct"] = MetadataValue.float(round(sum(r["accuracy_pct"] for r in out["fidelity"]) / n, 2))
        meta["mean_baseline_accuracy_pct"] = MetadataValue.float(round(sum(r["baseline_accuracy_pct"] for r in out["fidelity"]) / n, 2))
    return MaterializeResult(metadata=meta)


def score_lines(root: Path) -> list[str]:
    """The fidelity table as printed by ``make demo`` (read from the last materialization's file)."""
    p = fidelity_path(root)
    if not p.exists():
        return []
    from analyses.fit.commands import fidelity_table

    return ["workload fidelity (held-out steps; ours vs PolyTrace's histogram):", *fidelity_table(json.loads(p.read_text())).splitlines()]
