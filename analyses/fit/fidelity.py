"""Fidelity: does a generated workload look like the real one on steps the fit never saw?

Protocol (identical for our fitted model and for PolyTrace's histogram resampler):

1. Split the run by training step: the first two thirds of its full steps are fitted, the rest
   are held out. A step with fewer than half the median step's samples is a partial (cut-off)
   step and is left out of both. A run with fewer than 3 full steps is split by prompt groups
   instead: its groups, in order, are dealt into 8 pseudo-steps, the first 5 fitted, the last
   3 held out.
2. Generate each held-out step (same step index, same batch shape as the training steps) with
   each of ``DEFAULT_SEEDS`` (200) seeds: enough that the seed average is the generator's
   expected statistic to within ``monte_carlo_se_pct`` (bootstrap over seeds, reported).
3. Per step compute: total tokens, longest response, p99 response, the rollout makespan in
   tokens (the most loaded DP rank's response tokens), and for multi-turn runs the turns and
   tool time of the step. Statistics whose real value is 0 are skipped (no relative error).
4. ``accuracy_pct``: for each held-out step the generated statistic is averaged over the seeds
   (the generator's prediction for that step); APE against the real step; accuracy = 100 - MAPE
   over (statistic, step). ``errors_pct`` are those APEs averaged per statistic.
   Two companion scores use the same generated steps: ``single_replay_accuracy_pct`` (the APE of
   each seed's own steps, averaged over seeds -- what one replay scores, generator noise
   included) and ``level_accuracy_pct`` (per statistic, the mean over held-out steps vs the mean
   over generated steps -- whether the workload's level is right, step-to-step noise aside).
5. References on the same held-out steps (:mod:`analyses.fit.score_refs`): ``ceiling_accuracy_pct``
   (the best constant prediction, chosen knowing the held-out answers: the step-to-step variation
   no forecast of the level removes), ``recorded_mean_accuracy_pct`` (the fitted steps' mean as
   the prediction), and ``in_sample_level_accuracy_pct`` for both generators (level score against
   the fitted steps themselves: goodness of fit, which a few held-out steps cannot swing).

Nothing is tuned on the held-out steps: the model choices (families, AIC, drift test, copula vs
mixture, and the response model and window chosen by rolling-origin validation inside the
fitted steps, :mod:`analyses.fit.select`) are made on the training steps only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from analyses.export.sampler import generate
from analyses.fit.baseline import HistogramBaseline
from analyses.fit.data import RunFrames
from analyses.fit.score_refs import hindsight_ceiling, monte_carlo_se, recorded_mean
from analyses.fit.scores import (
    STATS_BASE,
    STATS_MULTI,
    TRAIN_FRACTION,
    per_sample_tool_time,
    score_generated,
    step_statistics,
)
from analyses.fit.select import fit_workload_selected
from analyses.fit.stepmodel import step_time_fidelity
from analyses.fit.workload import training_samples

# The prediction for a step is the generator's mean over seeds; a per-step total over 16 prompts
# varies by ~20% between draws, so 5 seeds left ~8% Monte Carlo noise in the prediction itself.
DEFAULT_SEEDS = tuple(range(200))
IN_SAMPLE_BUDGET = 2_000_000  # generated samples for the fitted-steps check (fewer seeds on long runs)
PSEUDO_STEPS, PSEUDO_TRAIN = 8, 5


@dataclass
class Split:
    mode: str  # 'steps' | 'prompt_groups'
    train_steps: list[int]
    heldout_steps: list[int]
    partial_steps: list[int]
    frames: RunFrames  # with pseudo-steps relabelled when mode == 'prompt_groups'


def split_run(frames: RunFrames, train_fraction: float = TRAIN_FRACTION) -> Split:
    s = training_samples(frames.samples)
    counts = s.group_by("step").len().sort("step")
    med = float(counts["len"].median() or 0)
    full = [int(k) for k, c in zip(counts["step"], counts["len"], strict=True) if c >= 0.5 * med]
    partial = [int(k) for k in counts["step"] if int(k) not in full]
    if len(full) >= 3:
        n_train = min(max(int(round(len(full) * train_fraction)), 1), len(full) - 1)
        return Split("steps", full[:n_train], full[n_train:], partial, frames)
    # prompt-group split: groups in (step, group) order dealt into pseudo-steps
    s = s.filter(pl.col("step").is_in(full))
    groups = s.select("step", "group").unique().sort("step", "group").with_row_index("gi")
    ng = groups.height
    groups = groups.with_columns(pseudo=(pl.col("gi") * PSEUDO_STEPS // max(ng, 1)).cast(pl.Int64))
    s = s.join(groups.select("step", "group", "pseudo"), on=["step", "group"])
    key = s.select("step", "sample_id", "pseudo")

    def relabel(df: pl.DataFrame | None) -> pl.DataFrame | None:
        if df is None:
            return None
        return df.join(key, on=["step", "sample_id"]).with_columns(step=pl.col("pseudo")).drop("pseudo")

    samples = s.with_columns(step=pl.col("pseudo"), group_id=pl.concat_str([pl.col("step").cast(pl.String), pl.col("group_id")], separator="|")).drop("pseudo", "group")
    rf = RunFrames(frames.run_id, samples, relabel(frames.turns), relabel(frames.tool_calls), None, None, frames.task,
                   frames.max_response_length, dict(frames.info))
    return Split("prompt_groups", list(range(PSEUDO_TRAIN)), list(range(PSEUDO_TRAIN, PSEUDO_STEPS)), partial, rf)


def _generated_statistics(wl: dict[str, Any], base: HistogramBaseline, steps: list[int], seeds: tuple[int, ...],
                          multi: bool, has_ranks: bool) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Per seed, the step statistics of our generator's and of the baseline's ``steps``."""
    ours, bl = [], []
    for seed in seeds:
        g = generate(wl, steps, seed)
        ours.append(step_statistics(per_sample_tool_time(g.samples, g.tool_calls, ("step", "group", "sample_index")), multi, has_ranks))
        bl.append(step_statistics(base.generate(steps, seed), multi, has_ranks))
    return ours, bl


def _in_sample(wl: dict[str, Any], base: HistogramBaseline, fitted_real: pl.DataFrame, steps: list[int],
               seeds: tuple[int, ...], names: list[str], multi: bool, has_ranks: bool) -> dict[str, Any]:
    """Level scores of both generators against the fitted steps themselves (a goodness of fit that
    a few unlucky held-out steps cannot swing)."""
    per_seed = max(int(wl["batch"]["prompts_per_step"]) * int(wl["batch"]["samples_per_prompt"]) * len(steps), 1)
    use = seeds[: max(1, min(len(seeds), IN_SAMPLE_BUDGET // per_seed))]
    names = [c for c in names if c in fitted_real.columns and float(fitted_real[c].abs().sum()) > 0]
    ours, bl = _generated_statistics(wl, base, steps, use, multi, has_ranks)
    return {"ours": score_generated(fitted_real, ours, names), "baseline": score_generated(fitted_real, bl, names), "seeds": len(use)}


def fidelity(frames: RunFrames, seeds: tuple[int, ...] = DEFAULT_SEEDS, train_fraction: float = TRAIN_FRACTION) -> dict[str, Any]:
    """Score our fitted generator and PolyTrace's histogram baseline on held-out steps."""
    sp = split_run(frames, train_fraction)
    fr = sp.frames
    train = fr.restrict(sp.train_steps)
    held = fr.restrict(sp.heldout_steps)
    if training_samples(held.samples).height == 0 or training_samples(train.samples).height < 2:
        raise ValueError(f"{frames.run_id}: too few samples to split into fitted and held-out steps")
    wl = fit_workload_selected(train.samples, turns=train.turns, tool_calls=train.tool_calls, rank_times=train.rank_times,
                      run_id=fr.run_id, task=fr.task, max_response_length=fr.max_response_length)
    multi = bool(wl["batch"]["multi_turn"])
    has_ranks = bool(wl["batch"]["has_ranks"])
    names = list(STATS_BASE if has_ranks else STATS_BASE[:3]) + (list(STATS_MULTI) if multi else [])
    hs = training_samples(held.samples)
    hs = per_sample_tool_time(hs, held.tool_calls, ("step", "sample_id"))
    real = step_statistics(hs, multi, has_ranks)
    names = [c for c in names if float(real[c].abs().sum()) > 0]
    ts = per_sample_tool_time(training_samples(train.samples), train.tool_calls, ("step", "sample_id"))
    base = HistogramBaseline(ts, wl["batch"], per_sample_tool_time=ts)
    ours_stats, base_stats = _generated_statistics(wl, base, sp.heldout_steps, seeds, multi, has_ranks)
    ours = score_generated(real, ours_stats, names)
    bl = score_generated(real, base_stats, names)
    fitted_real = step_statistics(ts, multi, has_ranks)
    ceiling = hindsight_ceiling(real, names)
    rec = recorded_mean(real, fitted_real, names)
    in_sample = _in_sample(wl, base, fitted_real, sp.train_steps, seeds, names, multi, has_ranks)
    step_model = None
    if frames.steps is not None and frames.steps.height:
        step_model = step_time_fidelity(frames.steps, train_fraction)
    return {
        "run_id": frames.run_id,
        "task": wl["task"],
        "step_time_model": step_model,
        "split": sp.mode,
        "train_steps": sp.train_steps,
        "heldout_steps": sp.heldout_steps,
        "partial_steps_excluded": sp.partial_steps,
        "seeds": list(seeds),
        "statistics": names,
        "accuracy_pct": ours["accuracy_pct"],
        "baseline_accuracy_pct": bl["accuracy_pct"],
        "errors_pct": ours["errors_pct"],
        "baseline_errors_pct": bl["errors_pct"],
        "single_replay_accuracy_pct": ours["single_replay_accuracy_pct"],
        "baseline_single_replay_accuracy_pct": bl["single_replay_accuracy_pct"],
        # the spread over seeds: how much one replay's score is luck of the draw
        "single_replay_by_seed_pct": ours["single_replay_by_seed_pct"],
        "baseline_single_replay_by_seed_pct": bl["single_replay_by_seed_pct"],
        "level_accuracy_pct": ours["level_accuracy_pct"],
        "baseline_level_accuracy_pct": bl["level_accuracy_pct"],
        # how much of the score the seeds' Monte Carlo noise could move (bootstrap over seeds)
        "monte_carlo_se_pct": monte_carlo_se(real, ours_stats, names),
        "baseline_monte_carlo_se_pct": monte_carlo_se(real, base_stats, names),
        # what the held-out steps allow: see analyses.fit.score_refs
        "ceiling_accuracy_pct": ceiling["accuracy_pct"],
        "ceiling_errors_pct": ceiling["errors_pct"],
        "recorded_mean_accuracy_pct": rec["accuracy_pct"],
        "recorded_mean_errors_pct": rec["errors_pct"],
        # does each generator reproduce the steps it was fitted on? (level, per statistic)
        "in_sample_level_accuracy_pct": in_sample["ours"]["level_accuracy_pct"],
        "baseline_in_sample_level_accuracy_pct": in_sample["baseline"]["level_accuracy_pct"],
        "in_sample_level_errors_pct": in_sample["ours"]["level_errors_pct"],
        "baseline_in_sample_level_errors_pct": in_sample["baseline"]["level_errors_pct"],
        "in_sample_seeds": in_sample["seeds"],
        "level_errors_pct": ours["level_errors_pct"],
        "baseline_level_errors_pct": bl["level_errors_pct"],
        "real_mean": {c: float(real[c].mean()) for c in names},
        "generated_mean": ours["generated_mean"],
        "baseline_generated_mean": bl["generated_mean"],
        "real_per_step": real.to_dicts(),
        "model": {"response_family": wl["variables"]["response_tokens"].get("family") or wl["variables"]["response_tokens"]["kind"],
                  "joint": wl["joint"].get("selected"), "drift": wl["drift"]["kind"],
                  "selected": (wl.get("response_selection") or {}).get("selected"),
                  "validation_accuracy_pct": (wl.get("response_selection") or {}).get("mean_accuracy_pct"),
                  "multiturn_selected": (wl.get("multiturn_selection") or {}).get("selected"),
                  "multiturn_validation_accuracy_pct": (wl.get("multiturn_selection") or {}).get("mean_accuracy_pct"),
                  # the baseline at the same training-internal origins: a reference, not used to choose
                  "validation_baseline_accuracy_pct": (wl.get("multiturn_selection") or wl.get("response_selection") or {}).get(
                      "baseline_mean_accuracy_pct")},
    }


def step_time_only(frames: RunFrames, train_fraction: float = TRAIN_FRACTION) -> dict[str, Any] | None:
    """For a run with a step log but no per-sample lengths: only the step-time model."""
    if frames.steps is None or frames.steps.height == 0:
        return None
    m = step_time_fidelity(frames.steps, train_fraction)
    return None if m is None else {"run_id": frames.run_id, "task": frames.task, "step_time_model": m}
