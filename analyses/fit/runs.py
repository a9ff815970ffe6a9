"""Fit the runs of a warehouse into one spec document: per run (and task), the workload with
its options chosen by rolling-origin validation inside the run's steps."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analyses.export.spec import build_spec, workload_key
from analyses.fit.cache import cached
from analyses.fit.data import has_samples, load_run, load_summaries, runs_with_samples, runs_with_summaries
from analyses.fit.dynamic_filter import fit_filter
from analyses.fit.fidelity import Progress
from analyses.fit.select import fit_summaries_selected, fit_workload_selected


def fit_runs(root: Path, runs: list[str] | None = None, seed: int = 0, progress: Progress | None = None,
             cache: bool = True, skipped: dict[str, str] | None = None) -> dict:
    """Fit every (selected) run of the warehouse into one spec document: from its samples, or from
    its per-step summaries when it has none. With ``cache`` a run whose inputs, facts and fitting
    code are unchanged is not fitted again (:mod:`analyses.fit.cache`). ``skipped``: a run that
    cannot be fitted (too little data, no batch size) is recorded there instead of raising."""
    chosen = runs if runs else sorted(set(runs_with_samples(root)) | set(runs_with_summaries(root)))
    if progress:
        progress("start", {"runs": len(chosen)})
    workloads: dict[str, dict] = {}
    for r in chosen:
        if progress:
            progress("run_start", {"run_id": r, "origins": 0})
        try:
            if cache:
                fitted, _hit = cached(root, r, "workloads", lambda r=r: fit_run(root, r, seed), seed=seed)
            else:
                fitted = fit_run(root, r, seed)
        except ValueError as exc:
            if skipped is None:
                raise
            skipped[r] = str(exc)
            fitted = {}
        workloads.update(fitted)
        if progress:
            progress("run_done", {"run_id": r})
    return build_spec(workloads, [r for r in chosen if not skipped or r not in skipped], seed)


def fit_run(root: Path, run_id: str, seed: int = 0) -> dict[str, dict]:
    """One run's workloads by spec key: one per task when the run's samples carry several; a run
    without samples: one from its per-step summaries (:mod:`analyses.fit.summary_fit`)."""
    if not has_samples(root, run_id):
        return {run_id: fit_from_summaries(root, run_id)}
    f = load_run(root, run_id)
    tasks = [t for t in f.samples["task"].unique().to_list() if t is not None] if "task" in f.samples.columns else []
    several = len(tasks) > 1
    out: dict[str, dict] = {}
    for t in tasks if several else [None]:
        s = f.samples if t is None else f.samples.filter(pl.col("task") == t)
        task = t or f.task or (tasks[0] if tasks else None)
        wl = fit_workload_selected(
            s, turns=f.turns, tool_calls=f.tool_calls, rank_times=f.rank_times, run_id=run_id, task=task,
            max_response_length=f.max_response_length, seed=seed,
        )
        filt = fit_filter(f.filter_batches)
        if filt is not None:
            wl["filter"] = filt
        out[workload_key(run_id, task, several)] = wl
    return out


def fit_from_summaries(root: Path, run_id: str) -> dict:
    """A step-only run's workload, fitted from its per-step summaries with its options chosen by
    rolling origin inside its steps (:func:`~analyses.fit.select.fit_summaries_selected`)."""
    sf = load_summaries(root, run_id)
    return fit_summaries_selected(sf.summaries, run_id=run_id, task=sf.task, max_response_length=sf.max_response_length,
                                  samples_per_prompt=sf.facts.rollout_n)
