"""Choose the response-length model by rolling-origin validation inside the fitted steps.

Candidates: the response marginal is ``parametric`` (censored MLE families, AIC) or
``empirical_tail`` (empirical body + GPD tail + cap mass; with no cap known its tail is truncated
at 1x or 2x the largest value seen), fitted on ``all`` fitted steps or on the ``recent`` half of
them (later steps weigh more when the workload drifts).

Validation never sees the steps it is asked to choose for: given fitted steps ``t_0 < ... <
t_{m-1}``, each origin ``j`` fits every candidate on ``t_0..t_{j-1}`` and scores it on
``t_j..t_{m-1}`` (at most ``MAX_VALIDATED`` of them, evenly spaced) with the fidelity score
itself (per-step total tokens, longest and p99 response, makespan; seed-averaged over
``CV_SEEDS``, fewer for big steps (:func:`cv_seeds`); 100 - MAPE). The origins are the
protocol's own two-thirds point of the fitted steps and the last fitted step. The candidate with the best mean score wins; the parametric all-steps
model wins ties and is used when there are fewer than 3 fitted steps or the task is multi-turn
(its responses are built from turns, not from the response marginal). For a multi-turn task the
same validation (with turns and tool time among the statistics) chooses instead whether turn
completions and tool results are ``pooled`` or conditional on the trajectory's turn count
(``by_turns``, :func:`analyses.fit.workload.fit_by_turns`); pooled wins ties.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from analyses.export.sampler import generate
from analyses.fit.baseline import HistogramBaseline
from analyses.fit.continuous import fit_continuous
from analyses.fit.scores import per_sample_tool_time, score_generated, step_statistics
from analyses.fit.workload import fit_by_turns, fit_response, fit_workload, training_samples

# (model, window); "empirical_tail<x>" = empirical_tail with tail_limit x
CANDIDATES: tuple[tuple[str, str], ...] = tuple(
    (m, w) for m in ("parametric", "empirical_tail1", "empirical_tail2") for w in ("all", "recent")
)
CV_SEEDS = tuple(range(30))  # the per-step maximum is heavy-tailed: few seeds make the choice a coin toss
MIN_CV_SEEDS = 5
CV_SAMPLE_BUDGET = 2_000_000  # generated samples per (candidate, origin): fewer seeds for big steps
MIN_STEPS = 3
MAX_VALIDATED = 6  # validated steps per origin (evenly spaced, last included): bounds the cost on long runs


def recent_window(steps: list[int]) -> list[int]:
    """The later half of the steps (at least 2, rounded up)."""
    k = max(2, (len(steps) + 1) // 2)
    return list(steps[-k:])


def origins(m: int) -> list[int]:
    """Rolling origins (number of steps fitted) for ``m`` fitted steps: two thirds, and m - 1."""
    if m < MIN_STEPS:
        return []
    j = min(max(int(round(m * 2 / 3)), 2), m - 1)
    return sorted({j, m - 1})


def validated_steps(steps: list[int], j: int) -> list[int]:
    """The steps after origin ``j`` that are scored: all, or ``MAX_VALIDATED`` evenly spaced."""
    rest = steps[j:]
    if len(rest) <= MAX_VALIDATED:
        return list(rest)
    idx = np.unique(np.round(np.linspace(0, len(rest) - 1, MAX_VALIDATED)).astype(int))
    return [rest[i] for i in idx]


def _fit(samples: pl.DataFrame, model: str, window: str, kw: dict[str, Any]) -> dict[str, Any]:
    steps = sorted(int(v) for v in samples["step"].unique())
    win = recent_window(steps) if window == "recent" else None
    if model.startswith("empirical_tail"):
        return fit_workload(samples, response_model="empirical_tail", response_steps=win,
                            response_tail_limit=float(model[len("empirical_tail"):]), **kw)
    return fit_workload(samples, response_model=model, response_steps=win, **kw)


def _swap_response(base: dict[str, Any], samples: pl.DataFrame, steps: list[int], model: str, window: str,
                   seed: int = 0) -> dict[str, Any]:
    """``base`` (the parametric all-steps fit) with another candidate's response variable: what
    :func:`_fit` gives for that candidate, without refitting prompts and dependence."""
    s = training_samples(samples)
    cap = base["variables"]["response_tokens"].get("censor_at")
    emp = model.startswith("empirical_tail")
    rvar, drift = fit_response(s["step"].to_numpy(), s["response_tokens"].cast(pl.Float64).to_numpy(), cap, seed=seed,
                               response_model="empirical_tail" if emp else model,
                               response_steps=recent_window(steps) if window == "recent" else None,
                               response_tail_limit=float(model[len("empirical_tail"):]) if emp else 2.0)
    joint = {k: v for k, v in base["joint"].items() if k not in ("gaussian_mixture", "selection")}
    joint["selected"] = "gaussian_copula"  # as fit_workload does for every non-default response model
    return {**base, "variables": {**base["variables"], "response_tokens": rvar}, "joint": joint, "drift": drift.to_dict()}


def cv_seeds(samples_per_step: int, n_validated: int) -> tuple[int, ...]:
    """``CV_SEEDS``, cut so that one candidate at one origin generates at most ``CV_SAMPLE_BUDGET``
    samples (but never fewer than ``MIN_CV_SEEDS`` seeds)."""
    k = CV_SAMPLE_BUDGET // max(samples_per_step * max(n_validated, 1), 1)
    return CV_SEEDS[: int(min(max(k, MIN_CV_SEEDS), len(CV_SEEDS)))]


def _seeds_for(s: pl.DataFrame, steps: list[int], js: list[int], seeds: tuple[int, ...] | None) -> tuple[int, ...]:
    if seeds is not None:
        return seeds
    per_step = int(s.group_by("step").len()["len"].max() or 1)
    return cv_seeds(per_step, max((len(validated_steps(steps, j)) for j in js), default=1))


def validate_candidates(samples: pl.DataFrame, kw: dict[str, Any], seeds: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Rolling-origin scores of every candidate on ``samples`` (the fitted steps only)."""
    s = training_samples(samples)
    steps = sorted(int(v) for v in s["step"].unique())
    js = origins(len(steps))
    seeds = _seeds_for(s, steps, js, seeds)
    has_ranks = bool(s["dp_rank"].drop_nulls().len())
    names = ["total_tokens", "longest_response", "p99_response"] + (["makespan_tokens"] if has_ranks else [])
    scores: dict[str, list[float | None]] = {f"{m}/{w}": [] for m, w in CANDIDATES}
    ref: list[float] = []
    for j in js:
        fit_s = samples.filter(pl.col("step").is_in(steps[:j]))
        val = validated_steps(steps, j)
        real = step_statistics(s.filter(pl.col("step").is_in(val)), False, has_ranks)
        # the candidates differ only in the response variable and its drift: fit the rest once
        try:
            base = fit_workload(fit_s, raw_joint=False, **kw)
        except ValueError:  # too little to fit at this origin: it scores no candidate
            continue
        for m, w in CANDIDATES:
            try:
                wl = base if (m, w) == CANDIDATES[0] else _swap_response(base, fit_s, steps[:j], m, w, int(kw.get("seed", 0)))
            except ValueError:  # e.g. every value of a window at the cap: this candidate cannot be fitted here
                scores[f"{m}/{w}"].append(None)
                continue
            gen = [step_statistics(generate(wl, val, sd).samples, False, has_ranks) for sd in seeds]
            scores[f"{m}/{w}"].append(score_generated(real, gen, names)["accuracy_pct"])
        ref.append(_baseline_score(fit_s, base["batch"], val, real, names, seeds, False, has_ranks, None))
    # a candidate that failed at any origin is not eligible
    mean = {k: float(np.mean(v)) for k, v in scores.items() if v and all(x is not None for x in v)}
    return {"origins": [{"fitted_steps": steps[:j], "validated_steps": validated_steps(steps, j)} for j in js], "seeds": list(seeds),
            "scores": scores, "mean_accuracy_pct": mean, **_reference(ref)}


def _baseline_score(fit_s: pl.DataFrame, batch: dict[str, Any], val: list[int], real: pl.DataFrame, names: list[str],
                    seeds: tuple[int, ...], multi: bool, has_ranks: bool, calls: pl.DataFrame | None) -> float:
    """PolyTrace's histogram resampler scored at the same origin: a reference, never selected."""
    ts = per_sample_tool_time(training_samples(fit_s), calls, ("step", "sample_id"))
    hb = HistogramBaseline(ts, batch, per_sample_tool_time=ts)
    gen = [step_statistics(hb.generate(val, sd), multi, has_ranks) for sd in seeds]
    return float(score_generated(real, gen, names)["accuracy_pct"])


def _reference(ref: list[float]) -> dict[str, Any]:
    return {"baseline_scores": ref, "baseline_mean_accuracy_pct": float(np.mean(ref)) if ref else None}


MT_CANDIDATES = ("pooled", "by_turns")


def validate_multiturn(samples: pl.DataFrame, kw: dict[str, Any], seeds: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Rolling-origin scores of the multi-turn composition: turn completions and tool results
    ``pooled`` over trajectories, or conditional on the turn count (``by_turns``). Scored like
    the fidelity protocol for a multi-turn run (total tokens, longest / p99 response, turns,
    tool time per step; plus makespan with DP ranks)."""
    s = training_samples(samples)
    steps = sorted(int(v) for v in s["step"].unique())
    js = origins(len(steps))
    seeds = _seeds_for(s, steps, js, seeds)
    has_ranks = bool(s["dp_rank"].drop_nulls().len())
    turns, calls = kw.get("turns"), kw.get("tool_calls")
    names = ["total_tokens", "longest_response", "p99_response"] + (["makespan_tokens"] if has_ranks else []) + ["turns", "tool_time_s"]
    scores: dict[str, list[float]] = {c: [] for c in MT_CANDIDATES}
    ref: list[float] = []
    for j in js:
        fit_s = samples.filter(pl.col("step").is_in(steps[:j]))
        val = validated_steps(steps, j)
        real = step_statistics(per_sample_tool_time(s.filter(pl.col("step").is_in(val)), calls, ("step", "sample_id")), True, has_ranks)
        used = [c for c in names if float(real[c].abs().sum()) > 0]
        try:
            base = fit_workload(fit_s, raw_joint=False, **kw)
        except ValueError:
            continue
        ts = training_samples(fit_s)
        cond = {**base, "variables": {**base["variables"], **fit_by_turns(ts, turns, calls)}}
        for c, wl in zip(MT_CANDIDATES, (base, cond), strict=True):
            gen = []
            for sd in seeds:
                g = generate(wl, val, sd)
                gen.append(step_statistics(per_sample_tool_time(g.samples, g.tool_calls, ("step", "group", "sample_index")), True, has_ranks))
            scores[c].append(score_generated(real, gen, used)["accuracy_pct"])
        ref.append(_baseline_score(fit_s, base["batch"], val, real, used, seeds, True, has_ranks, calls))
    mean = {k: float(np.mean(v)) for k, v in scores.items() if v}
    return {"origins": [{"fitted_steps": steps[:j], "validated_steps": validated_steps(steps, j)} for j in js], "seeds": list(seeds),
            "scores": scores, "mean_accuracy_pct": mean, **_reference(ref)}


def fit_workload_selected(samples: pl.DataFrame, **kw: Any) -> dict[str, Any]:
    """:func:`fit_workload` with the response model chosen by rolling-origin validation."""
    s = training_samples(samples)
    multi = bool(s["n_turns"].drop_nulls().len() and (s["n_turns"].fill_null(1) > 1).any())
    n_steps = s["step"].n_unique()
    if n_steps < MIN_STEPS:
        wl = fit_workload(samples, **kw)
        wl["response_selection"] = {"selected": "parametric/all", "reason": f"{n_steps} fitted steps"}
        return wl
    if multi:
        # responses are built from turns: the choice is how turns are composed, not the marginal
        cv = validate_multiturn(samples, kw)
        m = cv["mean_accuracy_pct"]
        best = max(m, key=lambda k: (m[k], k == MT_CANDIDATES[0])) if m else MT_CANDIDATES[0]
        wl = fit_workload(samples, by_turns=best == "by_turns", **kw)
        wl["response_selection"] = {"selected": "parametric/all", "reason": "multi-turn"}
        wl["multiturn_selection"] = {"selected": best, **cv}
        return wl
    cv = validate_candidates(samples, kw)
    default = "parametric/all"
    ranked = sorted(cv["mean_accuracy_pct"], key=lambda k: (cv["mean_accuracy_pct"][k], k == default), reverse=True)
    best = ranked[0] if ranked else default
    model, window = best.split("/")
    try:
        wl = _fit(samples, model, window, kw)
    except ValueError:  # fitted at every origin but not on all steps: fall back to the default
        best, model, window = default, "parametric", "all"
        wl = _fit(samples, model, window, kw)
    if model.startswith("empirical_tail"):
        # a scipy family beside it, for consumers that only read scipy marginals (PolyTrace params)
        r = wl["variables"]["response_tokens"]
        steps = sorted(int(v) for v in s["step"].unique())
        win = s.filter(pl.col("step").is_in(recent_window(steps))) if window == "recent" else s
        x = win["response_tokens"].cast(pl.Float64).to_numpy()
        r["scipy_fallback"] = fit_continuous(x, censor_at=r.get("censor_at"), seed=int(kw.get("seed", 0)), integer=True,
                                             families=("lognorm", "gamma", "weibull_min")).to_dict()
    wl["response_selection"] = {"selected": best, **cv}
    return wl
