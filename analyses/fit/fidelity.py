"""Fidelity: if I benchmark with the generated workload instead of the recorded one, how far
off, and how sure?

Protocol (:mod:`analyses.fit.rolling`; identical for our generator and for PolyTrace's 20-bin
histogram resampler, :mod:`analyses.fit.baseline`, both fitted on the same steps):

1. The run's full steps in order; partial (cut-off) steps are never fitted or scored. A run with
   fewer than 3 full steps is split by prompt groups instead: its groups, in order, are dealt
   into 8 pseudo-steps.
2. Every origin with at least 2 full steps up to it: both generators are fitted on those steps
   (ours chooses its options by rolling origin *inside* them, :mod:`analyses.fit.select`) and
   generate the next step and the one after with ``S`` seeds (``DEFAULT_SEEDS``: 200).
3. Per generated step and statistic (total tokens, longest and p99 response, rollout makespan;
   turns and tool time for multi-turn runs), :mod:`analyses.fit.scores`:

   * ``crps_skill = 1 - mean(CRPS_ours / real) / mean(CRPS_histogram / real)`` over every
     (origin, step, statistic): > 0 means our ensemble is closer to what happened;
   * ``coverage90`` / ``baseline_coverage90``: the share of real values inside each ensemble's
     central 90% interval (a calibrated generator: 0.90);
   * ``ks_mean`` / ``baseline_ks_mean``: the mean two-sample KS distance between the generated
     and the real per-sample values of each step (response lengths; turn counts and tool-call
     latencies too for multi-turn runs), the generated sample pooled over seeds -- the sample
     shape. ``ks_per_seed_mean`` (each seed's step alone) is reported beside it.
4. Context, not targets: per-step MAPE of the seed-mean prediction (``mape_accuracy_pct``), and the
   hindsight ceiling of the predicted steps (the best one constant prediction for all of them,
   chosen knowing the answers) -- the step-to-step variation no forecast of the level removes.

Nothing is tuned on the scored steps: at every origin the model choices use steps up to it only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from analyses.fit.baseline import HistogramBaseline
from analyses.fit.data import RunFrames, batch_shape, is_multi_turn, split_run, training_samples
from analyses.fit.rolling import RealSteps, origins, score_draws
from analyses.fit.sampler import draw_steps
from analyses.fit.scores import Scored, hindsight_ceiling, mape_accuracy, summary
from analyses.fit.select import SummaryFits, ValidationMemo, fit_summaries_selected, fit_workload_selected
from analyses.fit.stepmodel import step_time_fidelity
from analyses.fit.summaries import summaries_from_samples

DEFAULT_SEEDS = tuple(range(200))
Progress = Callable[[str, dict[str, Any]], None]


def _call_latency(tool_calls: pl.DataFrame | None) -> np.ndarray | None:
    return None if tool_calls is None else tool_calls["latency_s"].drop_nulls().to_numpy()


def fidelity(frames: RunFrames, seeds: tuple[int, ...] = DEFAULT_SEEDS, progress: Progress | None = None,
             from_summaries: bool = False) -> dict[str, Any]:
    """Score our generator and PolyTrace's histogram resampler by rolling origin over the run;
    ``from_summaries``: also the fit from the run's per-step summaries alone (``summary_fit``)."""
    sp = split_run(frames)
    fr = sp.frames
    s = training_samples(fr.samples).filter(pl.col("step").is_in(sp.steps))
    multi = is_multi_turn(s)
    real = RealSteps.build(s, fr.turns, fr.tool_calls, multi)
    plan = origins(sp.steps)
    if not plan:
        raise ValueError(f"{frames.run_id}: too few full steps to fit on 2 and predict one")
    if progress:
        progress("run_start", {"run_id": frames.run_id, "origins": len(plan)})
    ours: list[Scored] = []
    base: list[Scored] = []
    summ_scored: list[Scored] = []
    records = []
    summ = None
    summary_fits: SummaryFits = {}  # every origin's prefixes, each fitted once
    validations: ValidationMemo = {}  # ... and the prefixes its choice of options validates on
    if from_summaries:
        k = batch_shape(s)["samples_per_prompt"]
        summ = summaries_from_samples(s, fr.max_response_length, fr.tool_calls, k)
    for fitted, predicted in plan:
        fs, ft, fc = real.frames(fitted)
        wl = fit_workload_selected(fs, real=real, memo=validations, turns=ft, tool_calls=fc, run_id=fr.run_id,
                                   task=fr.task, max_response_length=fr.max_response_length, for_export=False)
        hb = HistogramBaseline(fs, batch_shape(training_samples(fs)) | {"multi_turn": multi}, _call_latency(fc))
        o = score_draws(draw_steps(wl, predicted, seeds), real)
        b = score_draws(hb.draw(predicted, seeds), real)
        ours.append(o)
        base.append(b)
        if summ is not None:
            sw = fit_summaries_selected(summ.filter(pl.col("step").is_in(fitted)), summary_fits, run_id=fr.run_id,
                                        task=fr.task, max_response_length=fr.max_response_length, samples_per_prompt=k)
            summ_scored.append(score_draws(draw_steps(sw, predicted, seeds), real))
        records.append({"fitted_steps": fitted, "predicted_steps": predicted, "selected": wl["selection"]["selected"],
                        "drift": {k: wl["drift"].get(k) for k in ("kind", "slope_per_step", "step_sd", "level_se")}})
        if progress:
            progress("origin_done", {"run_id": frames.run_id})
    ro = summary(ours, base)
    ro.update(_context(ours, base, real))
    ro["origins"] = len(plan)
    ro["seeds"] = len(seeds)
    ro["per_origin"] = records
    extra = {"summary_fit": summary_fit_block(summ_scored, ours, base)} if from_summaries else {}
    step_model = step_time_fidelity(frames.steps) if frames.steps is not None and frames.steps.height else None
    if progress:
        progress("run_done", {"run_id": frames.run_id})
    return {
        "run_id": frames.run_id,
        "task": fr.task,
        "split": sp.mode,
        "steps": sp.steps,
        "partial_steps_excluded": sp.partial_steps,
        "statistics": real.names,
        "rolling_origin": ro,
        "step_time_model": step_model,
        **extra,
    }


def _context(ours: list[Scored], base: list[Scored], real: RealSteps) -> dict[str, Any]:
    """Per-step MAPE of each ensemble's mean, and the hindsight ceiling of the predicted steps."""
    names = real.names
    y = np.concatenate([o.real for o in ours])
    mo = mape_accuracy(np.concatenate([o.mean for o in ours]), y, names)
    mb = mape_accuracy(np.concatenate([b.mean for b in base]), y, names)
    predicted = sorted({k for o in ours for k in o.steps})
    ceiling = hindsight_ceiling(np.stack([real.stats[k] for k in predicted]), names)
    return {"mape_accuracy_pct": mo["accuracy_pct"], "baseline_mape_accuracy_pct": mb["accuracy_pct"],
            "mape_errors_pct": mo["errors_pct"], "baseline_mape_errors_pct": mb["errors_pct"],
            "ceiling_accuracy_pct": ceiling["accuracy_pct"], "ceiling_errors_pct": ceiling["errors_pct"]}


def step_time_only(frames: RunFrames) -> dict[str, Any] | None:
    """For a run with a step log but no per-sample lengths: only the step-time model."""
    if frames.steps is None or frames.steps.height == 0:
        return None
    m = step_time_fidelity(frames.steps)
    return None if m is None else {"run_id": frames.run_id, "task": frames.task, "step_time_model": m}


def summary_fit_block(summ: list[Scored], ours: list[Scored], base: list[Scored]) -> dict[str, Any]:
    """The fit from summaries against the per-sample fit and the histogram, on the same origins and
    seeds: median KS of response lengths over predicted steps (both fits), the ratio of their
    relative CRPS, the skill over the histogram, and coverage."""
    def ks(xs: list[Scored]) -> list[float]:
        return [v for x in xs for v in x.ks.get("response_tokens", [])]

    def rel(xs: list[Scored]) -> float:
        c = np.concatenate([x.crps.ravel() for x in xs])
        y = np.concatenate([x.real.ravel() for x in xs])
        ok = y > 0
        return float(np.mean(c[ok] / y[ok])) if ok.any() else float("nan")

    def rel_by(xs: list[Scored], j: int) -> float:
        c = np.concatenate([x.crps[:, j] for x in xs])
        y = np.concatenate([x.real[:, j] for x in xs])
        ok = y > 0
        return float(np.mean(c[ok] / y[ok])) if ok.any() else float("nan")

    cov = np.concatenate([x.covered.ravel() for x in summ]) if summ else np.zeros(0)
    names = summ[0].names if summ else []
    by = {c: {"coverage90": float(np.concatenate([x.covered[:, j] for x in summ]).mean()),
              "crps_relative": rel_by(summ, j), "sample_fit_crps_relative": rel_by(ours, j)} for j, c in enumerate(names)}
    r_s, r_o, r_b = rel(summ), rel(ours), rel(base)
    return {
        "ks_median": float(np.nanmedian(ks(summ))) if ks(summ) else float("nan"),
        "ks_sample_fit": float(np.nanmedian(ks(ours))) if ks(ours) else float("nan"),
        "crps_ratio": r_s / r_o if r_o > 0 else float("nan"),
        "crps_skill": 1.0 - r_s / r_b if r_b > 0 else float("nan"),
        "coverage90": float(cov.mean()) if cov.size else float("nan"),
        "covered": int(cov.sum()),
        "cells": int(cov.size),
        "by_statistic": by,
        "crps_relative": r_s,
        "sample_fit_crps_relative": r_o,
        "origins": len(summ),
    }
