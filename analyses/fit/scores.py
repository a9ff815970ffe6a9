"""Scoring a generated workload against real steps -- the one module that model selection
(:mod:`analyses.fit.select`) and the fidelity check (:mod:`analyses.fit.fidelity`) both use.

Three layers, in the order a reader needs them:

1. **Per-step statistics** (:func:`step_statistics`, :func:`stat_matrix`): per training step the
   total tokens, the longest and p99 response, the rollout makespan in tokens (the most loaded DP
   rank's response tokens), and for multi-turn runs the turns and tool time.
2. **Proper scores of a seed ensemble** (the criterion): for a real value ``y`` and ``S``
   generated values ``X_1..X_S`` of the same statistic,

   - :func:`crps_ensemble`: the continuous ranked probability score of the ensemble's
     empirical distribution, ``mean_i |X_i - y| - 1/2 mean_{i,j} |X_i - X_j|`` (all ``S**2``
     pairs). 0 for a perfect point forecast; it rewards a forecast that is both centred and sharp,
     and it is in the statistic's unit (we divide by ``y`` to pool statistics and runs);
   - :func:`covered90`: whether ``y`` lies in the ensemble's central 90% interval
     ``[q05, q95]`` (linear interpolation of the sorted ensemble, both ends included);
   - :func:`ks_2samp` / :func:`ks_rows`: the two-sample Kolmogorov-Smirnov distance between
     per-sample values (response lengths, turns, tool latency) of one generated step and of the
     real step (right-continuous ECDFs, ties handled exactly).

   :func:`crps_skill` turns two generators' CRPS into the skill ``1 - mean(ours/y) /
   mean(reference/y)`` (> 0: ours is better).
3. **Over origins**: a generator's :class:`Scored` per origin, pooled into the criterion
   (:func:`relative_crps`, what model selection minimises; :func:`summary`, what fidelity reports).
4. **Context** (kept, not a target): per-step MAPE of the seed-averaged prediction
   (:func:`mape_accuracy`) and the hindsight ceiling (:func:`hindsight_ceiling`), the best one
   constant prediction for every scored step can reach with the answers known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

STATS_BASE = ("total_tokens", "longest_response", "p99_response", "makespan_tokens")
STATS_MULTI = ("turns", "tool_time_s")
KS_VARIABLES = ("response_tokens", "turns", "tool_latency_s")  # per-sample values compared by KS
COVERAGE_LEVEL = 0.90


# ----------------------------------------------------------------------------- per-step statistics


def statistic_names(multi: bool, has_ranks: bool) -> list[str]:
    """The per-step statistics scored for a run of this shape."""
    return list(STATS_BASE if has_ranks else STATS_BASE[:3]) + (list(STATS_MULTI) if multi else [])


def per_sample_tool_time(samples: pl.DataFrame, tool_calls: pl.DataFrame | None, keys: tuple[str, ...]) -> pl.DataFrame:
    """``samples`` with ``tool_time_s``: the summed latency of each sample's tool calls (0 without)."""
    if tool_calls is None or tool_calls.height == 0:
        return samples.with_columns(tool_time_s=pl.lit(0.0))
    tt = tool_calls.group_by(*keys).agg(tool_time_s=pl.col("latency_s").sum())
    return samples.join(tt, on=list(keys), how="left").with_columns(pl.col("tool_time_s").fill_null(0.0))


def step_statistics(samples: pl.DataFrame, multi: bool, has_ranks: bool) -> pl.DataFrame:
    """One row per step with the fidelity statistics (real steps; generated ones use :func:`stat_matrix`)."""
    s = samples.with_columns(pl.col("prompt_tokens").cast(pl.Float64), pl.col("response_tokens").cast(pl.Float64))
    aggs = [
        (pl.col("prompt_tokens") + pl.col("response_tokens")).sum().alias("total_tokens"),
        pl.col("response_tokens").max().alias("longest_response"),
        pl.col("response_tokens").quantile(0.99, "linear").alias("p99_response"),
    ]
    if multi:
        aggs += [pl.col("n_turns").sum().cast(pl.Float64).alias("turns"), pl.col("tool_time_s").sum().alias("tool_time_s")]
    out = s.group_by("step").agg(aggs)
    if has_ranks:
        mk = s.group_by("step", "dp_rank").agg(t=pl.col("response_tokens").sum()).group_by("step").agg(makespan_tokens=pl.col("t").max())
        out = out.join(mk, on="step")
    return out.sort("step")


def stat_matrix(prompt: np.ndarray, response: np.ndarray, dp_index: np.ndarray, n_dp: int, names: list[str],
                turns: np.ndarray | None = None, tool_time: np.ndarray | None = None) -> np.ndarray:
    """The statistics of many generated steps at once: arrays ``[rows, samples]`` (a row is one
    seed's step) -> ``[rows, len(names)]``, with the definitions of :func:`step_statistics`.
    ``dp_index[j]`` is sample ``j``'s DP rank position (the same for every row)."""
    prompt = np.asarray(prompt, dtype=float)
    response = np.asarray(response, dtype=float)
    out = np.empty((response.shape[0], len(names)))
    for j, c in enumerate(names):
        if c == "total_tokens":
            out[:, j] = prompt.sum(axis=1) + response.sum(axis=1)
        elif c == "longest_response":
            out[:, j] = response.max(axis=1)
        elif c == "p99_response":
            out[:, j] = np.quantile(response, 0.99, axis=1)
        elif c == "makespan_tokens":
            per_rank = np.stack([response[:, dp_index == d].sum(axis=1) for d in range(n_dp)], axis=1)
            out[:, j] = per_rank.max(axis=1)
        elif c == "turns":
            out[:, j] = np.asarray(turns, dtype=float).sum(axis=1)
        elif c == "tool_time_s":
            out[:, j] = np.asarray(tool_time, dtype=float).sum(axis=1)
        else:
            raise KeyError(f"unknown statistic {c!r}")
    return out


# ----------------------------------------------------------------------------- proper scores


def crps_ensemble(ens: np.ndarray, y: np.ndarray | float) -> np.ndarray:
    """CRPS of the ensemble ``ens`` (members along axis 0) for the real value(s) ``y``:
    ``mean|X - y| - 1/2 mean|X - X'|`` over all ``S**2`` member pairs.

    The pair term uses the sorted-ensemble identity ``sum_{i,j}|x_i - x_j| = 2 sum_i (2i - S - 1) x_(i)``
    (``i`` = 1..S), so it costs a sort, not ``S**2`` differences.
    """
    x = np.sort(np.asarray(ens, dtype=float), axis=0)
    s = x.shape[0]
    if s == 0:
        raise ValueError("an empty ensemble has no CRPS")
    y = np.asarray(y, dtype=float)
    w = (2 * np.arange(1, s + 1) - s - 1).reshape((s,) + (1,) * (x.ndim - 1))
    spread = np.sum(w * x, axis=0) / (s * s)
    return np.mean(np.abs(x - y), axis=0) - spread


def interval90(ens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ensemble's central 90% interval (members along axis 0)."""
    a = (1 - COVERAGE_LEVEL) / 2
    return np.quantile(ens, a, axis=0), np.quantile(ens, 1 - a, axis=0)


def covered90(ens: np.ndarray, y: np.ndarray | float) -> np.ndarray:
    """True where ``y`` lies inside the ensemble's central 90% interval (ends included)."""
    lo, hi = interval90(np.asarray(ens, dtype=float))
    y = np.asarray(y, dtype=float)
    return (lo <= y) & (y <= hi)


def ks_2samp(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample KS distance ``sup_x |F_a(x) - F_b(x)|`` (right-continuous ECDFs; ties exact)."""
    a = np.sort(np.asarray(a, dtype=float))
    b = np.sort(np.asarray(b, dtype=float))
    if a.size == 0 or b.size == 0:
        return float("nan")
    z = np.concatenate([a, b])
    fa = np.searchsorted(a, z, side="right") / a.size
    fb = np.searchsorted(b, z, side="right") / b.size
    return float(np.max(np.abs(fa - fb)))


def crps_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The CRPS (Cramer) distance between two samples, ``integral (F_a(x) - F_b(x))^2 dx``: how much
    worse ``a``'s empirical distribution forecasts ``b``'s values than ``b``'s own does, i.e.
    ``mean_y crps_ensemble(a, y) - mean_y crps_ensemble(b, y)`` over ``y`` in ``b`` (symmetric, in
    the values' unit, 0 only for equal distributions). Exact from the two ECDFs, which are constant
    between consecutive distinct values."""
    a = np.sort(np.asarray(a, dtype=float))
    b = np.sort(np.asarray(b, dtype=float))
    if a.size == 0 or b.size == 0:
        return float("nan")
    z = np.unique(np.concatenate([a, b]))
    diff = np.searchsorted(a, z, side="right") / a.size - np.searchsorted(b, z, side="right") / b.size
    return float(np.sum(diff[:-1] ** 2 * np.diff(z)))


def ks_rows(gen: np.ndarray, real: np.ndarray) -> np.ndarray:
    """:func:`ks_2samp` of every row of ``gen`` ``[rows, n]`` against ``real``, vectorised: rows
    are shifted into disjoint value ranges so one sorted array serves them all."""
    gen = np.asarray(gen, dtype=float)
    real = np.sort(np.asarray(real, dtype=float))
    rows, n = gen.shape
    if rows == 0:
        return np.zeros(0)
    lo = min(float(gen.min()), float(real[0]))
    span = max(float(gen.max()), float(real[-1])) - lo + 1.0
    off = (np.arange(rows) * span)[:, None]
    g = np.sort(gen - lo, axis=1) + off  # every row in its own band [r*span, (r+1)*span)
    flat = g.ravel()
    # at the row's own points: F_gen from the flattened rank, F_real from the real sample
    f_gen_at_g = (np.searchsorted(flat, flat, side="right") - np.repeat(np.arange(rows) * n, n)) / n
    f_real_at_g = np.searchsorted(real - lo, (g - off).ravel(), side="right") / real.size
    d1 = np.abs(f_gen_at_g - f_real_at_g).reshape(rows, n).max(axis=1)
    # at the real points: F_gen of each row there
    r = (real - lo)[None, :] + off
    f_gen_at_r = (np.searchsorted(flat, r.ravel(), side="right") - np.repeat(np.arange(rows) * n, real.size)) / n
    f_real_at_r = np.searchsorted(real, real, side="right") / real.size
    d2 = np.abs(f_gen_at_r.reshape(rows, real.size) - f_real_at_r[None, :]).max(axis=1)
    return np.maximum(d1, d2)


def crps_skill(ours: np.ndarray, reference: np.ndarray, real: np.ndarray) -> float:
    """``1 - mean(ours / real) / mean(reference / real)`` over the cells where ``real > 0``
    (NaN when the reference is perfect everywhere)."""
    ours, reference, real = (np.asarray(v, dtype=float).ravel() for v in (ours, reference, real))
    ok = real > 0
    den = float(np.mean(reference[ok] / real[ok])) if ok.any() else 0.0
    if den <= 0:
        return float("nan")
    return 1.0 - float(np.mean(ours[ok] / real[ok])) / den


# ----------------------------------------------------------------------------- context (not targets)


def accuracy_from_errors(errors: dict[str, float]) -> float:
    """100 - the mean of per-statistic relative errors (NaN ones, with no real value, left out)."""
    vals = [v for v in errors.values() if np.isfinite(v)]
    return 100.0 * (1 - float(np.mean(vals))) if vals else float("nan")


def mape_accuracy(pred: np.ndarray, real: np.ndarray, names: list[str]) -> dict[str, Any]:
    """100 - MAPE of predictions ``pred`` against ``real`` (both ``[cells, statistic]``; real
    values <= 0 skipped), with the per-statistic errors in percent."""
    pred, real = np.asarray(pred, dtype=float), np.asarray(real, dtype=float)
    errors: dict[str, float] = {}
    for j, c in enumerate(names):
        ok = real[:, j] > 0
        errors[c] = float(np.mean(np.abs(pred[ok, j] - real[ok, j]) / real[ok, j])) if ok.any() else float("nan")
    return {"accuracy_pct": accuracy_from_errors(errors), "errors_pct": {c: 100.0 * v for c, v in errors.items()}}


def hindsight_ceiling(real: np.ndarray, names: list[str]) -> dict[str, Any]:
    """Per statistic, the lowest MAPE one constant prediction for every scored step can reach,
    chosen knowing the answers (``real`` is ``[steps, statistic]``).

    MAPE over steps is piecewise linear and convex in the constant, with its kinks at the real
    values, so its minimum is at one of them: trying each is exact. What it misses is the
    step-to-step variation no forecast of the workload's level can remove.
    """
    real = np.asarray(real, dtype=float)
    errors: dict[str, float] = {}
    for j, c in enumerate(names):
        r = real[:, j][real[:, j] > 0]
        if r.size == 0:
            errors[c] = float("nan")
            continue
        errors[c] = float(np.min(np.mean(np.abs(r[:, None] - r[None, :]) / r[None, :], axis=1)))
    return {"accuracy_pct": accuracy_from_errors(errors), "errors_pct": {c: 100.0 * v for c, v in errors.items()}}


# ----------------------------------------------------------------------------- over origins


@dataclass
class Scored:
    """One generator's scores at one origin: per (predicted step, statistic) the CRPS, whether
    the real value is covered, and the ensemble mean; per (step, variable) the KS distances."""

    steps: list[int]
    names: list[str]
    real: np.ndarray  # [steps, statistics]
    crps: np.ndarray
    covered: np.ndarray
    mean: np.ndarray
    ks: dict[str, list[float]]  # variable -> pooled KS per step
    ks_per_seed: dict[str, list[float]]


def relative_crps(scored: Sequence[Scored]) -> float:
    """Mean of CRPS / real over every (origin, step, statistic) with a positive real value: the
    number model selection minimises."""
    c = np.concatenate([s.crps.ravel() for s in scored]) if scored else np.zeros(0)
    y = np.concatenate([s.real.ravel() for s in scored]) if scored else np.zeros(0)
    ok = y > 0
    return float(np.mean(c[ok] / y[ok])) if ok.any() else float("nan")


def summary(ours: Sequence[Scored], base: Sequence[Scored]) -> dict[str, Any]:
    """The criterion over all origins: CRPS skill, coverage, KS, ours beside the baseline."""
    names = ours[0].names if ours else []

    def cat(xs: Sequence[Scored], a: str) -> np.ndarray:
        return np.concatenate([getattr(x, a) for x in xs]) if xs else np.zeros((0, len(names)))

    y, co, cb = cat(ours, "real"), cat(ours, "crps"), cat(base, "crps")
    vo, vb = cat(ours, "covered"), cat(base, "covered")
    out: dict[str, Any] = {
        "crps_skill": crps_skill(co, cb, y),
        "crps_relative": _rel(co, y),
        "baseline_crps_relative": _rel(cb, y),
        "coverage90": float(vo.mean()) if vo.size else float("nan"),
        "baseline_coverage90": float(vb.mean()) if vb.size else float("nan"),
        "cells": int(y.size),
        "covered": int(vo.sum()),
        "baseline_covered": int(vb.sum()),
        "by_statistic": {c: {"crps_skill": crps_skill(co[:, j], cb[:, j], y[:, j]), "coverage90": float(vo[:, j].mean()),
                             "baseline_coverage90": float(vb[:, j].mean())} for j, c in enumerate(names)},
    }
    ks_o, ks_b = _ks_means(ours, "ks"), _ks_means(base, "ks")
    out["ks_mean"] = float(np.nanmean(list(ks_o["_all"]))) if ks_o["_all"] else float("nan")
    out["baseline_ks_mean"] = float(np.nanmean(list(ks_b["_all"]))) if ks_b["_all"] else float("nan")
    out["ks_by_variable"] = {v: {"ours": float(np.nanmean(ks_o[v])), "baseline": float(np.nanmean(ks_b[v]))}
                             for v in KS_VARIABLES if ks_o.get(v)}
    ps_o, ps_b = _ks_means(ours, "ks_per_seed"), _ks_means(base, "ks_per_seed")
    out["ks_per_seed_mean"] = float(np.nanmean(ps_o["_all"])) if ps_o["_all"] else float("nan")
    out["baseline_ks_per_seed_mean"] = float(np.nanmean(ps_b["_all"])) if ps_b["_all"] else float("nan")
    return out


def _rel(c: np.ndarray, y: np.ndarray) -> float:
    ok = y > 0
    return float(np.mean(c[ok] / y[ok])) if ok.any() else float("nan")


def _ks_means(scored: Sequence[Scored], attr: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"_all": []}
    for s in scored:
        for var, vals in getattr(s, attr).items():
            out.setdefault(var, []).extend(vals)
            out["_all"].extend(vals)
    return out
