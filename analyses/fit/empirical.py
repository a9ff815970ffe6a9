"""A semi-parametric length marginal: empirical body, generalized Pareto tail, cap point mass.

Why: a parametric family fitted to the whole range trades body against tail (on a DAPO run the
AIC-best mixture put the per-step p99 16% above the data it was fitted on). Here

* responses that hit the cap (``censor_at``) are a point mass ``p_cap`` of their own -- the
  fraction of fitted samples at the cap, not whatever a continuous family puts beyond it;
* below the tail threshold the quantile function is the data's own (linear interpolation
  between ``len(knots)`` empirical quantiles);
* above it a GPD fitted to the exceedances (MLE, location 0) extrapolates beyond the largest
  value seen, truncated at the cap (or, with no cap known, at ``tail_limit`` times the largest
  value seen: an unbounded GPD would let one draw in a million be astronomically long; the run's
  unrecorded max length is at least the largest value seen, how much more is not known, so
  :mod:`analyses.fit.select` chooses ``tail_limit`` by validation).

``ppf(u)``: ``u >= 1 - p_cap`` is the cap; otherwise ``v = u / (1 - p_cap)`` is a quantile level
of the uncensored part: body knots up to ``1 - tail_prob``, the truncated GPD above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from analyses.fit.continuous import apply_bounds, json_safe
from analyses.fit.tails import gpd_from_dict, gpd_to_dict

N_KNOTS = 257
TAIL_QUANTILES = (0.9, 0.95, 0.97, 0.98)  # candidate thresholds; the best-fitting GPD (KS) wins
MIN_EXCEED = 20  # fewer exceedances than this: no GPD, the body runs to the largest value
TAIL_LIMIT = 2.0  # default tail_limit


@dataclass
class EmpiricalTailFit:
    knots: list[float]  # quantiles at levels linspace(0, 1 - tail_prob, len(knots)) of uncensored values
    tail_prob: float  # P(uncensored value > threshold); 0 = no GPD tail
    xi: float
    sigma: float
    upper: float  # the GPD is truncated here (the cap, or TAIL_LIMIT x the largest value seen)
    censor_at: float | None
    p_cap: float  # P(value at the cap)
    n: int
    n_censored: int
    integer: bool = True
    lower: float = 1.0

    @property
    def threshold(self) -> float:
        return float(self.knots[-1])

    def ppf(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        out = np.empty_like(u)
        cap = u >= 1 - self.p_cap
        v = np.clip(u / max(1 - self.p_cap, 1e-300), 0.0, 1.0)
        body = ~cap & (v <= 1 - self.tail_prob)
        levels = np.linspace(0.0, 1.0 - self.tail_prob, len(self.knots))
        out[body] = np.interp(v[body], levels, self.knots)
        tail = ~cap & ~body
        if tail.any():
            # truncated GPD: level t in (0, 1) maps into [0, F(upper - threshold)]
            top = float(stats.genpareto.cdf(self.upper - self.threshold, self.xi, 0, self.sigma))
            t = (v[tail] - (1 - self.tail_prob)) / self.tail_prob * top
            out[tail] = self.threshold + stats.genpareto.ppf(np.clip(t, 0, 1 - 1e-12), self.xi, 0, self.sigma)
        out[cap] = self.censor_at if self.censor_at is not None else self.upper
        return apply_bounds(out, self.lower, self.censor_at, self.integer)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "kind": "empirical_tail",
                "knots": self.knots,
                "tail_prob": self.tail_prob,
                "tail": gpd_to_dict(self.xi, self.sigma),
                "upper": self.upper,
                "censor_at": self.censor_at,
                "p_cap": self.p_cap,
                "n": self.n,
                "n_censored": self.n_censored,
                "integer": self.integer,
                "lower": self.lower,
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EmpiricalTailFit:
        c, s = gpd_from_dict(d["tail"])
        return cls([float(k) for k in d["knots"]], float(d["tail_prob"]), float(c), float(s), float(d["upper"]),
                   d.get("censor_at"), float(d.get("p_cap") or 0.0), int(d.get("n", 0)), int(d.get("n_censored", 0)),
                   bool(d.get("integer", True)), float(d.get("lower", 1.0)))


def fit_empirical_tail(x: np.ndarray, censor_at: float | None, *, integer: bool = True, lower: float = 1.0,
                       n_knots: int = N_KNOTS, tail_limit: float = TAIL_LIMIT) -> EmpiricalTailFit:
    """Fit the marginal to values ``x`` (those ``>= censor_at`` are the cap mass)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    cens = x >= censor_at if censor_at is not None else np.zeros(x.size, bool)
    unc = np.sort(x[~cens])
    if unc.size < 2:
        raise ValueError(f"need at least 2 uncensored values, got {unc.size}")
    p_cap = float(cens.mean())
    upper = float(censor_at) if censor_at is not None else tail_limit * float(unc[-1])
    best: tuple[float, float, float, float] | None = None  # (ks, q, xi, sigma)
    for q in TAIL_QUANTILES:
        u = float(np.quantile(unc, q))
        exc = unc[unc > u] - u
        if exc.size < MIN_EXCEED:
            continue
        xi, _, sigma = stats.genpareto.fit(exc, floc=0)
        ks = float(stats.kstest(exc, "genpareto", args=(xi, 0, sigma)).statistic)
        if best is None or ks < best[0]:
            best = (ks, q, float(xi), float(sigma))
    if best is None:
        tail_prob, xi, sigma = 0.0, 0.0, 1.0
    else:
        _, q, xi, sigma = best
        tail_prob = float(np.mean(unc > np.quantile(unc, q)))
    levels = np.linspace(0.0, 1.0 - tail_prob, n_knots)
    knots = np.quantile(unc, levels).tolist()
    return EmpiricalTailFit(knots, tail_prob, xi, sigma, upper, float(censor_at) if censor_at is not None else None,
                            p_cap, int(x.size), int(cens.sum()), integer, lower)
