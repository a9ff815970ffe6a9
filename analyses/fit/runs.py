"""Fit the runs of a warehouse into one spec document: per run (and task), the workload with
its options chosen by rolling-origin validation inside the run's steps."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analyses.export.spec import build_spec, workload_key
from analyses.fit.cache import cached
from analyses.fit.data import load_run, runs_with_samples
from analyses.fit.fidelity import Progress
from analyses.fit.select import fit_workload_selected


def fit_runs(root: Path, runs: list[str] | None = None, seed: int = 0, progress: Progress | None = None,
             cache: bool = True) -> dict:
    """Fit every (selected) run of the warehouse into one spec document. With ``cache`` a run
    whose inputs, facts and fitting code are unchanged is not fitted again (:mod:`analyses.fit.cache`)."""
    chosen = runs if runs else runs_with_samples(root)
    if progress:
        progress("start", {"runs": len(chosen)})
    workloads: dict[str, dict] = {}
    for r in chosen:
        if progress:
            progress("run_start", {"run_id": r, "origins": 0})
        if cache:
            fitted, _hit = cached(root, r, "workloads", lambda r=r: fit_run(root, r, seed), seed=seed)
        else:
            fitted = fit_run(root, r, seed)
        workloads.update(fitted)
        if progress:
            progress("run_done", {"run_id": r})
    return build_spec(workloads, list(chosen), seed)


def fit_run(root: Path, run_id: str, seed: int = 0) -> dict[str, dict]:
    """One run's workloads by spec key: one per task when the run's samples carry several."""
    f = load_run(root, run_id)
    tasks = [t for t in f.samples["task"].unique().to_list() if t is not None] if "task" in f.samples.columns else []
    several = len(tasks) > 1
    out: dict[str, dict] = {}
    for t in tasks if several else [None]:
        s = f.samples if t is None else f.samples.filter(pl.col("task") == t)
        task = t or f.task or (tasks[0] if tasks else None)
        out[workload_key(run_id, task, several)] = fit_workload_selected(
            s, turns=f.turns, tool_calls=f.tool_calls, rank_times=f.rank_times, run_id=run_id, task=task,
            max_response_length=f.max_response_length, seed=seed,
        )
    return out
