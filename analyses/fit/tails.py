"""Heavy-tailed variables (tool latency): a fitted body plus a generalized Pareto tail.

The body is the AIC-best continuous family fitted with values above the threshold
right-censored at it -- exactly the likelihood of "below u, this density; above u, somewhere".
The tail is a GPD fitted by MLE to the exceedances. The threshold is chosen from the data:
among upper quantiles of the sample, the one whose GPD fits its exceedances best (smallest KS
distance), with at least ``min_exceed`` exceedances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from analyses.fit.continuous import ContinuousFit, fit_continuous, json_safe

THRESHOLD_QUANTILES = (0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.97)


def gpd_to_dict(xi: float, sigma: float) -> dict[str, Any]:
    """A location-0 generalized Pareto tail as the spec writes it (scipy ``genpareto`` parameter order)."""
    return {"family": "genpareto", "params": [xi, 0.0, sigma], "param_names": ["c", "loc", "scale"]}


def gpd_from_dict(d: dict[str, Any]) -> tuple[float, float]:
    """(xi, sigma) of a tail written by :func:`gpd_to_dict`."""
    c, _, s = d["params"]
    return float(c), float(s)


@dataclass
class BodyTailFit:
    body: ContinuousFit
    threshold: float
    tail_prob: float  # P(X > threshold)
    xi: float  # GPD shape
    sigma: float  # GPD scale
    n: int
    n_tail: int
    tail_ks: float
    gof: dict[str, float]

    def ppf(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        out = np.empty_like(u)
        below = u < 1 - self.tail_prob
        bd = self.body.dist()
        fu = float(bd.cdf(self.threshold))
        out[below] = bd.ppf(u[below] / (1 - self.tail_prob) * fu)
        ut = (u[~below] - (1 - self.tail_prob)) / self.tail_prob
        out[~below] = self.threshold + stats.genpareto.ppf(np.clip(ut, 0, 1 - 1e-12), self.xi, 0, self.sigma)
        return np.maximum(out, self.body.lower if self.body.lower > 0 else 0.0)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "kind": "body_tail",
                "body": self.body.to_dict(),
                "threshold": self.threshold,
                "tail_prob": self.tail_prob,
                "tail": gpd_to_dict(self.xi, self.sigma),
                "n": self.n,
                "n_tail": self.n_tail,
                "tail_ks": self.tail_ks,
                "gof": self.gof,
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BodyTailFit:
        c, s = gpd_from_dict(d["tail"])
        return cls(ContinuousFit.from_dict(d["body"]), float(d["threshold"]), float(d["tail_prob"]), float(c), float(s),
                   int(d.get("n", 0)), int(d.get("n_tail", 0)), float(d.get("tail_ks") or 0), dict(d.get("gof") or {}))


def choose_threshold(x: np.ndarray, min_exceed: int = 30) -> tuple[float, float, float, float]:
    """(threshold, xi, sigma, ks) of the best-fitting GPD over candidate upper quantiles."""
    best: tuple[float, float, float, float] | None = None
    for q in THRESHOLD_QUANTILES:
        u = float(np.quantile(x, q))
        exc = x[x > u] - u
        if exc.size < min_exceed:
            continue
        xi, _, sigma = stats.genpareto.fit(exc, floc=0)
        ks = float(stats.kstest(exc, "genpareto", args=(xi, 0, sigma)).statistic)
        if best is None or ks < best[3]:
            best = (u, float(xi), float(sigma), ks)
    if best is None:
        raise ValueError(f"too few values for a tail fit ({x.size}, need {min_exceed} above the 0.75 quantile)")
    return best


SCREEN_N = 50_000  # threshold screening sample
TAIL_FIT_MAX = 200_000  # exceedances used for the final GPD fit


def fit_body_tail(x: np.ndarray, min_exceed: int = 30, seed: int = 0) -> BodyTailFit:
    """Body + GPD tail. On large inputs the threshold is screened on a seeded subsample of
    ``SCREEN_N`` values and the GPD refitted on (at most ``TAIL_FIT_MAX``) exceedances of the
    whole sample; the body is fitted on all values (see :func:`fit_continuous`)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x) & (x >= 0)]
    rng = np.random.default_rng(seed)
    xs = x if x.size <= SCREEN_N else x[rng.choice(x.size, SCREEN_N, replace=False)]
    u, xi, sigma, ks = choose_threshold(xs, min_exceed)
    if x.size > SCREEN_N:
        exc = x[x > u] - u
        if exc.size > TAIL_FIT_MAX:
            exc = exc[rng.choice(exc.size, TAIL_FIT_MAX, replace=False)]
        xi, _, sigma = (float(v) for v in stats.genpareto.fit(exc, floc=0))
    body = fit_continuous(x, censor_at=u, seed=seed, integer=False, lower=0.0)
    tail_prob = float(np.mean(x > u))
    fit = BodyTailFit(body, u, tail_prob, xi, sigma, int(x.size), int(np.sum(x > u)), ks, {})
    # whole-distribution GoF of the spliced model, on a quantile grid
    grid = (np.arange(2000) + 0.5) / 2000
    mq = fit.ppf(grid)
    eq = np.quantile(x, grid)
    fit.gof = {
        "wasserstein": float(np.mean(np.abs(mq - eq))),
        "ks": float(stats.kstest(xs, lambda v: np.interp(v, mq, grid, left=0, right=1)).statistic),
        "p99_rel_err": float((fit.ppf(np.array([0.99]))[0] - np.quantile(x, 0.99)) / np.quantile(x, 0.99)),
        "p999_rel_err": float((fit.ppf(np.array([0.999]))[0] - np.quantile(x, 0.999)) / np.quantile(x, 0.999)),
    }
    return fit
