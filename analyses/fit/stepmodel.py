"""Step-time model: generation (and whole-step) time against the step's tokens and its longest
response, fitted by least squares on a run's training steps -- the paper's kind of check that a
workload predicts step time.

``tokens`` is ``total_tokens`` when the log has it, else ``prompt_len_mean + response_len_mean``
(old verl logs carry no token totals; the batch size is fixed within a run, so the per-sample
mean is proportional to the total and the coefficient absorbs the batch size).

Scored on the held-out steps two ways: from the real held-out workload (the model alone), and
from a generated one -- what a replay of generated steps would feed the model: each regressor's
per-step level forecast the way the generator forecasts a level (:func:`analyses.fit.drift.fit_drift`
on its log: a trend only where the training steps support it, shrunk, and held at half a span
beyond them). A straight-line extrapolation of the raw regressor, as this used to do, runs below
zero on a run whose lengths fell early on (an agentic verl run whose responses collapsed to one
token: longest response -2057, gen time -10.9 s, "-630% accuracy"); a generated workload never
has negative tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from analyses.fit.drift import fit_drift

TRAIN_FRACTION = 2 / 3
TARGETS = ("gen_time_s", "step_time_s")
MIN_STEPS = 6


def _regressors(steps: pl.DataFrame) -> pl.DataFrame:
    tok = pl.coalesce(pl.col("total_tokens"), pl.col("prompt_len_mean").fill_null(0) + pl.col("response_len_mean"))
    return steps.select("step", *TARGETS, tokens=tok, longest=pl.col("response_len_max"))


def _lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    a = np.column_stack([np.ones(len(x)), x])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return coef


def _mape(pred: np.ndarray, real: np.ndarray) -> float:
    ok = real > 0
    return float(np.mean(np.abs(pred[ok] - real[ok]) / real[ok])) if ok.any() else float("nan")


def generated_regressor(steps: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """A per-step regressor at steps ``at`` as the generator would forecast its level from
    ``values`` at ``steps``: exp of the level model of its log (positive by construction)."""
    model, _ = fit_drift(np.asarray(steps), np.maximum(np.asarray(values, dtype=float), 1.0))
    return np.exp(model.reference + model.log_factor(np.asarray(at)))


def step_time_fidelity(steps: pl.DataFrame, train_fraction: float = TRAIN_FRACTION) -> dict[str, Any] | None:
    """Fit on the first part of the run's steps, score on the rest; None when the run's steps lack
    the needed columns or are too few."""
    d = _regressors(steps.sort("step")).drop_nulls(["tokens", "longest"])
    if d.height < MIN_STEPS:
        return None
    n_train = int(round(d.height * train_fraction))
    tr, ho = d.head(n_train), d.tail(d.height - n_train)
    out: dict[str, Any] = {"train_steps": [int(tr["step"][0]), int(tr["step"][-1])], "heldout_steps": [int(ho["step"][0]), int(ho["step"][-1])]}
    x_tr = tr.select("tokens", "longest").to_numpy().astype(float)
    x_ho = ho.select("tokens", "longest").to_numpy().astype(float)
    s_tr, s_ho = tr["step"].to_numpy(), ho["step"].to_numpy()
    x_gen = np.column_stack([generated_regressor(s_tr, x_tr[:, j], s_ho) for j in range(x_tr.shape[1])])
    for t in TARGETS:
        y_tr = tr[t].to_numpy().astype(float)
        y_ho = ho[t].to_numpy().astype(float)
        ok = np.isfinite(y_tr)
        if ok.sum() < 3 or not np.isfinite(y_ho).any():
            continue
        coef = _lstsq(x_tr[ok], y_tr[ok])
        pred_real = coef[0] + x_ho @ coef[1:]
        pred_gen = coef[0] + x_gen @ coef[1:]
        fin = np.isfinite(y_ho)
        out[t] = {
            "coef": {"intercept": float(coef[0]), "per_token": float(coef[1]), "per_longest_token": float(coef[2])},
            "accuracy_from_real_workload_pct": 100 * (1 - _mape(pred_real[fin], y_ho[fin])),
            "accuracy_from_generated_workload_pct": 100 * (1 - _mape(pred_gen[fin], y_ho[fin])),
            "baseline_mean_accuracy_pct": 100 * (1 - _mape(np.full(fin.sum(), float(np.nanmean(y_tr))), y_ho[fin])),
        }
    return out if any(t in out for t in TARGETS) else None
