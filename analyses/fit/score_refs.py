"""Reference points that say how much of a fidelity score a generator could ever earn.

The fidelity score (:mod:`analyses.fit.fidelity`) is 100 - MAPE of per-step predictions against a
handful of held-out steps. Read alone, a score of 82 says nothing about whether the generator or
the held-out steps are to blame. Three references put it in context, all computed on the same
held-out steps and statistics:

- ``ceiling``: the best any prediction that is the same for every held-out step can score, with
  the constant chosen *knowing the held-out answers* (per statistic, the minimiser of the mean
  absolute percentage error, which is a weighted median of the held-out values and so one of
  them). What it misses is the step-to-step variation inside the held-out window, which no
  forecast of the workload's level can remove. A generator that does not know which held-out
  step will spike cannot be expected to beat it.
- ``recorded_mean``: predict every held-out step by the mean of the fitted steps' own statistics
  (the naive forecast of a forecasting benchmark: the recorded workload, averaged).
- ``monte_carlo_se``: the standard error of a generator's score that comes from averaging a
  finite number of seeds (bootstrap over seeds). Differences between two generators smaller than
  a few of these are noise of the scoring, not of the generators.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

BOOTSTRAP_DRAWS = 200


def accuracy_from_errors(errors: dict[str, float]) -> float:
    """100 - the mean of per-statistic relative errors (NaN ones, with no real value, left out)."""
    vals = [v for v in errors.values() if np.isfinite(v)]
    return 100.0 * (1 - float(np.mean(vals))) if vals else float("nan")


def _real_matrix(real: pl.DataFrame, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, real values [step, stat]) with real values <= 0 as NaN (no relative error there)."""
    r = real.sort("step")
    vals = r.select(names).to_numpy().astype(float)
    return r["step"].to_numpy(), np.where(vals > 0, vals, np.nan)


def hindsight_ceiling(real: pl.DataFrame, names: list[str]) -> dict[str, Any]:
    """Per statistic, the lowest MAPE of one constant prediction for every held-out step, and the score.

    MAPE over steps is piecewise linear and convex in the constant, with its kinks at the real
    values, so its minimum is at one of them: trying each is exact.
    """
    _, rv = _real_matrix(real, names)
    errors: dict[str, float] = {}
    for j, c in enumerate(names):
        r = rv[:, j][np.isfinite(rv[:, j])]
        if r.size == 0:
            errors[c] = float("nan")
            continue
        cand = r[:, None]  # [candidate, step]
        errors[c] = float(np.min(np.mean(np.abs(cand - r[None, :]) / r[None, :], axis=1)))
    return {"accuracy_pct": accuracy_from_errors(errors), "errors_pct": {c: 100.0 * v for c, v in errors.items()}}


def recorded_mean(real: pl.DataFrame, fitted: pl.DataFrame, names: list[str]) -> dict[str, Any]:
    """Score of predicting every held-out step by the mean over the fitted steps' statistics."""
    _, rv = _real_matrix(real, names)
    pred = np.array([float(fitted[c].mean()) for c in names])
    ape = np.abs(pred[None, :] - rv) / rv
    errors = {c: float(np.nanmean(ape[:, j])) if np.isfinite(ape[:, j]).any() else float("nan") for j, c in enumerate(names)}
    return {"accuracy_pct": accuracy_from_errors(errors), "errors_pct": {c: 100.0 * v for c, v in errors.items()},
            "prediction": {c: float(p) for c, p in zip(names, pred, strict=True)}}


def seed_stack(real: pl.DataFrame, per_seed: list[pl.DataFrame], names: list[str]) -> np.ndarray:
    """Generated statistics as an array [seed, held-out step, statistic], aligned with ``real``."""
    steps = real.sort("step").select("step")
    out = []
    for g in per_seed:
        m = steps.join(g, on="step", how="left").select(names).to_numpy().astype(float)
        out.append(m)
    return np.stack(out) if out else np.zeros((0, steps.height, len(names)))


def monte_carlo_se(real: pl.DataFrame, per_seed: list[pl.DataFrame], names: list[str], draws: int = BOOTSTRAP_DRAWS,
                   seed: int = 0) -> float:
    """Bootstrap (over seeds) standard error of the seed-averaged accuracy, in percentage points."""
    stack = seed_stack(real, per_seed, names)
    n = stack.shape[0]
    if n < 2:
        return float("nan")
    _, rv = _real_matrix(real, names)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(draws, n))
    pred = stack[idx].mean(axis=1)  # [draw, step, stat]
    ape = np.abs(pred - rv[None]) / rv[None]
    with np.errstate(invalid="ignore"):
        per_stat = np.nanmean(ape, axis=1)  # [draw, stat]
    acc = 100.0 * (1 - np.nanmean(per_stat, axis=1))
    return float(np.std(acc, ddof=1))
