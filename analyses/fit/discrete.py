"""Count variables (turns, tool calls per trajectory) as pmfs.

The empirical pmf with add-half smoothing over the observed range is always a candidate; a
fitted Poisson or negative binomial (shifted to the smallest observed count) replaces it when
its AIC is at least as good -- two parameters instead of one per support point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from analyses.fit.continuous import json_safe

SMOOTH_ALPHA = 0.5


@dataclass
class DiscreteFit:
    method: str  # empirical_smoothed | poisson | nbinom
    support: list[int]
    pmf: list[float]
    params: dict[str, float]
    shift: int
    n: int
    aic: float
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF over the (finite) support, so a copula's uniforms map to counts."""
        cdf = np.cumsum(self.pmf)
        cdf[-1] = 1.0
        idx = np.searchsorted(cdf, np.asarray(u), side="left")
        return np.asarray(self.support, dtype=np.int64)[np.minimum(idx, len(self.support) - 1)]

    def mean(self) -> float:
        return float(np.dot(self.support, self.pmf))

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "kind": "discrete",
                "method": self.method,
                "support": self.support,
                "pmf": self.pmf,
                "params": self.params,
                "shift": self.shift,
                "n": self.n,
                "aic": self.aic,
                "gof": {"tv_distance": next((c.get("tv_distance") for c in self.candidates if c["method"] == self.method), None)},
                "candidates": self.candidates,
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DiscreteFit:
        return cls(
            method=d["method"],
            support=[int(s) for s in d["support"]],
            pmf=[float(p) for p in d["pmf"]],
            params=dict(d.get("params") or {}),
            shift=int(d.get("shift", 0)),
            n=int(d.get("n", 0)),
            aic=float(d.get("aic") or 0.0),
        )


def nbinom_logpmf(y: np.ndarray, r: float, p: float, log_fact: np.ndarray | None = None) -> np.ndarray:
    """``stats.nbinom.logpmf(y, r, p)`` for non-negative integer counts ``y``, bit for bit: scipy's
    own formula without its argument checks and broadcasting (~20x the formula on a few hundred
    counts, and a Nelder-Mead fit evaluates it ~40 times); ``log_fact``: ``gammaln(y + 1)``."""
    if not (r > 0 and 0 < p <= 1):
        return stats.nbinom.logpmf(y, r, p)
    log_fact = special.gammaln(y + 1) if log_fact is None else log_fact
    return special.gammaln(r + y) - log_fact - special.gammaln(r) + r * np.log(p) + special.xlog1py(y, -p)


def fit_discrete(x: np.ndarray, tail_mass: float = 1e-6) -> DiscreteFit:
    """Fit a pmf to non-negative integer counts ``x``."""
    x = np.asarray(x)
    x = x[~np.isnan(x.astype(float))].astype(np.int64)
    if x.size == 0:
        raise ValueError("no counts to fit")
    if np.any(x < 0):
        raise ValueError("counts must be non-negative")
    n = int(x.size)
    lo, hi = int(x.min()), int(x.max())
    vals, cnt = np.unique(x, return_counts=True)
    support = np.arange(lo, hi + 1)
    counts = np.zeros(support.size)
    counts[vals - lo] = cnt
    # empirical, add-alpha smoothed over the observed range
    sm = (counts + SMOOTH_ALPHA) / (n + SMOOTH_ALPHA * support.size)
    ll_emp = float(np.sum(counts * np.log(sm)))
    cands: list[dict[str, Any]] = [
        {"method": "empirical_smoothed", "k": int(support.size - 1), "aic": 2 * (support.size - 1) - 2 * ll_emp}
    ]
    y = x - lo
    m = float(y.mean())
    v = float(y.var())
    # Poisson
    if m > 0:
        ll = float(np.sum(stats.poisson.logpmf(y, m)))
        cands.append({"method": "poisson", "k": 1, "aic": 2 - 2 * ll, "params": {"mu": m}})
    # negative binomial (over-dispersed counts)
    if m > 0 and v > m:

        log_fact = special.gammaln(y + 1)  # what the optimiser does not move

        def nll(t: np.ndarray) -> float:
            r, p = math.exp(t[0]), 1 / (1 + math.exp(-t[1]))
            return -float(np.sum(nbinom_logpmf(y, r, p, log_fact)))

        r0 = m * m / (v - m)
        p0 = r0 / (r0 + m)
        res = optimize.minimize(nll, [math.log(r0), math.log(p0 / (1 - p0))], method="Nelder-Mead")
        r, p = math.exp(res.x[0]), 1 / (1 + math.exp(-res.x[1]))
        cands.append({"method": "nbinom", "k": 2, "aic": 4 + 2 * float(res.fun), "params": {"n": r, "p": p}})
    emp = counts / n
    for c in cands:  # total-variation distance to the observed frequencies, for every candidate
        if c["method"] == "empirical_smoothed":
            c["tv_distance"] = 0.5 * float(np.abs(sm - emp).sum())
        else:
            d = stats.poisson(c["params"]["mu"]) if c["method"] == "poisson" else stats.nbinom(c["params"]["n"], c["params"]["p"])
            p_in = d.pmf(support - lo)
            c["tv_distance"] = 0.5 * float(np.abs(p_in - emp).sum() + max(0.0, 1 - p_in.sum()))
    best_param = min((c for c in cands if c["method"] != "empirical_smoothed"), key=lambda c: c["aic"], default=None)
    if best_param is not None and best_param["aic"] <= cands[0]["aic"]:
        dist = stats.poisson(best_param["params"]["mu"]) if best_param["method"] == "poisson" else stats.nbinom(best_param["params"]["n"], best_param["params"]["p"])
        top = int(dist.isf(tail_mass))
        sup = np.arange(0, max(top, hi - lo) + 1)
        pmf = dist.pmf(sup)
        pmf = pmf / pmf.sum()
        return DiscreteFit(best_param["method"], (sup + lo).tolist(), pmf.tolist(), best_param["params"], lo, n, best_param["aic"], cands)
    return DiscreteFit("empirical_smoothed", support.tolist(), sm.tolist(), {"alpha": SMOOTH_ALPHA}, lo, n, cands[0]["aic"], cands)


@dataclass
class CategoricalFit:
    """A length variable that takes few distinct values (e.g. video prompts: a handful of frame
    counts): the empirical distribution over the values seen. A continuous family would smear
    the atoms; add-alpha smoothing over a range of thousands of tokens would too."""

    values: list[float]
    probs: list[float]
    n: int

    def ppf(self, u: np.ndarray) -> np.ndarray:
        cdf = np.cumsum(self.probs)
        cdf[-1] = 1.0
        idx = np.searchsorted(cdf, np.asarray(u), side="left")
        return np.asarray(self.values, dtype=float)[np.minimum(idx, len(self.values) - 1)]

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"kind": "categorical", "values": self.values, "probs": self.probs, "n": self.n})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CategoricalFit:
        return cls([float(v) for v in d["values"]], [float(p) for p in d["probs"]], int(d.get("n", 0)))


def fit_categorical(x: np.ndarray) -> CategoricalFit:
    vals, cnt = np.unique(np.asarray(x, dtype=float), return_counts=True)
    return CategoricalFit(vals.tolist(), (cnt / cnt.sum()).tolist(), int(cnt.sum()))


def is_categorical(x: np.ndarray, max_values: int = 64, max_share: float = 0.2) -> bool:
    """Few distinct values relative to the sample: treat as atoms, not a continuum."""
    k = np.unique(np.asarray(x)).size
    return k <= max_values and k <= max_share * np.asarray(x).size
