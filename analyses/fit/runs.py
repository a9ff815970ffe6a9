"""Fit the runs of a warehouse into one spec document: per run (and task), the workload with
its options chosen by rolling-origin validation inside the run's steps."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analyses.export.spec import build_spec, workload_key
from analyses.fit.data import load_run, runs_with_samples
from analyses.fit.fidelity import Progress
from analyses.fit.select import fit_workload_selected


def fit_runs(root: Path, runs: list[str] | None = None, seed: int = 0, progress: Progress | None = None) -> dict:
    """Fit every (selected) run of the warehouse into one spec document."""
    chosen = runs if runs else runs_with_samples(root)
    if progress:
        progress("start", {"runs": len(chosen)})
    workloads: dict[str, dict] = {}
    for r in chosen:
        if progress:
            progress("run_start", {"run_id": r, "origins": 0})
        f = load_run(root, r)
        tasks = [t for t in f.samples["task"].unique().to_list() if t is not None] if "task" in f.samples.columns else []
        several = len(tasks) > 1
        for t in tasks if several else [None]:
            s = f.samples if t is None else f.samples.filter(pl.col("task") == t)
            task = t or f.task or (tasks[0] if tasks else None)
            workloads[workload_key(r, task, several)] = fit_workload_selected(
                s, turns=f.turns, tool_calls=f.tool_calls, rank_times=f.rank_times, run_id=r, task=task,
                max_response_length=f.max_response_length, seed=seed,
            )
        if progress:
            progress("run_done", {"run_id": r})
    return build_spec(workloads, list(chosen), seed)
