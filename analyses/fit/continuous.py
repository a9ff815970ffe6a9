"""Continuous marginals: candidate families fitted by maximum likelihood, right-censored at the
cap where responses hit the max length, chosen by AIC, with KS / Wasserstein / tail errors
recorded for every candidate.

Speed: every likelihood is over distinct (value, count) pairs (token counts are integers, so 10M
samples collapse to a few thousand pairs; other data are rounded to 4 significant digits first, a
relative change below 5e-4), written out analytically with its censored survival term for the
common families (lognorm, gamma, weibull_min, fisk; expon in closed form) and maximised by
L-BFGS-B from method-of-moments starts; mixtures by EM. A cheap first pass on a subsample prunes
the candidates, and only the best few are refitted on all the data. That keeps a 10M-sample fit
to seconds.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from analyses.fit.lnmix import LogNormalMixture, fit_lnmix
from analyses.run_facts import point_mass_cap

# Families with support on the positive reals, location fixed at 0 (lengths and latencies are
# positive; a free location makes censored MLE unstable and the parameters hard to read).
# invgauss is not a default: its scipy ppf is a root search per quantile, which makes the GoF
# quantile grid ~100x slower than for every other family; pass it in ``families`` if wanted.
DEFAULT_FAMILIES: tuple[str, ...] = (
    "lognorm", "gamma", "weibull_min", "fisk", "expon", "lognorm_mix2", "lognorm_mix3",
)
MIX_PREFIX = "lognorm_mix"  # lognorm_mix<k>: see analyses.fit.lnmix
SCREEN_N = 20_000  # the cheap first pass fits every family on at most this many values
KEEP = 3  # the first pass's best families refitted on all the data
_GRID = (np.arange(4096) + 0.5) / 4096  # quantile grid for the Wasserstein approximation


@dataclass
class CandidateFit:
    """One family's censored MLE and its goodness of fit."""

    family: str
    params: list[float]  # scipy order: shapes..., loc, scale
    param_names: list[str]
    k: int  # free parameters (for AIC)
    nll: float
    aic: float
    ks: float
    ks_p: float
    wasserstein: float
    p99_rel_err: float
    p999_rel_err: float
    converged: bool = True

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


@dataclass
class ContinuousFit:
    """The selected family (lowest AIC) plus every candidate's record."""

    family: str
    params: list[float]
    param_names: list[str]
    censor_at: float | None
    n: int
    n_censored: int
    integer: bool  # sampled values are rounded to integers (token counts)
    lower: float  # smallest value the variable takes (samples are clipped at it)
    gof: dict[str, float]
    candidates: list[CandidateFit] = field(default_factory=list)
    refit_on_all: bool = False

    def dist(self) -> stats.rv_continuous:
        """The frozen distribution, built once (a mixture builds its inverse-CDF grid once too)."""
        d = self.__dict__.get("_frozen")
        if d is None:
            d = self.__dict__["_frozen"] = frozen(self.family, self.params)
        return d

    def ppf_raw(self, u: np.ndarray) -> np.ndarray:
        """Quantiles of the fitted family itself (no bounds, no rounding)."""
        return self.dist().ppf(u)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """Quantiles of the fitted variable as observed: clipped to [lower, censor_at], rounded
        when integer. ``u`` in (0, 1)."""
        return apply_bounds(self.ppf_raw(u), self.lower, self.censor_at, self.integer)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "kind": "continuous",
                "family": self.family,
                "params": self.params,
                "param_names": self.param_names,
                "censor_at": self.censor_at,
                "n": self.n,
                "n_censored": self.n_censored,
                "integer": self.integer,
                "lower": self.lower,
                "gof": self.gof,
                "refit_on_all": self.refit_on_all,
                "candidates": [c.to_dict() for c in self.candidates],
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ContinuousFit:
        return cls(
            family=d["family"],
            params=[float(p) for p in d["params"]],
            param_names=list(d.get("param_names") or []),
            censor_at=d.get("censor_at"),
            n=int(d.get("n", 0)),
            n_censored=int(d.get("n_censored", 0)),
            integer=bool(d.get("integer", False)),
            lower=float(d.get("lower", 0.0)),
            gof=dict(d.get("gof") or {}),
            candidates=[],
            refit_on_all=bool(d.get("refit_on_all", False)),
        )


def frozen(family: str, params: list[float] | tuple[float, ...]) -> Any:
    if family.startswith(MIX_PREFIX):
        return LogNormalMixture(list(params))
    return getattr(stats, family)(*params)


def apply_bounds(v: np.ndarray, lower: float, upper: float | None, integer: bool) -> np.ndarray:
    v = np.asarray(v, dtype=float)
    v = np.nan_to_num(v, nan=lower, posinf=upper if upper is not None else np.finfo(float).max)
    if integer:
        v = np.rint(v)
    v = np.maximum(v, lower)
    if upper is not None:
        v = np.minimum(v, upper)
    return v


def param_names(family: str) -> list[str]:
    if family.startswith(MIX_PREFIX):
        k = int(family[len(MIX_PREFIX):])
        return [f"w{i}" for i in range(1, k + 1)] + [f"mu{i}" for i in range(1, k + 1)] + [f"sigma{i}" for i in range(1, k + 1)]
    dist = getattr(stats, family)
    shapes = [s.strip() for s in (dist.shapes or "").split(",") if s.strip()]
    return [*shapes, "loc", "scale"]


def infer_cap(x: np.ndarray, declared: float | None = None, truncated: np.ndarray | None = None) -> float | None:
    """The censoring point of a length variable.

    ``declared`` is the run's cap (``runs.max_response_length``: run.toml or what the ingest
    inferred, :mod:`analyses.run_facts`) and wins. Otherwise a `truncated` flag on some samples
    gives it; otherwise a point mass at the maximum (:func:`analyses.run_facts.point_mass_cap`,
    the rule the ingest applies), so a variable fitted alone gets the same cap the views use.
    """
    if declared is not None and declared > 0:
        return float(declared)
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return None
    if truncated is not None and np.any(truncated):
        return float(np.min(x[np.asarray(truncated, dtype=bool)]))
    m = float(np.max(x))
    return point_mass_cap(m, int(np.count_nonzero(x == m)), int(np.unique(x).size))


def _compress(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and their counts (values rounded to 4 significant digits unless integer)."""
    if not np.all(np.mod(x, 1.0) == 0):
        with np.errstate(divide="ignore"):
            mag = np.where(x > 0, np.floor(np.log10(np.abs(x))), 0.0)
        q = 10.0 ** (mag - 3)
        x = np.round(x / q) * q
    return np.unique(x, return_counts=True)


Censored = tuple[np.ndarray, np.ndarray]  # distinct censoring points and their counts


def _nll(dist: Any, vals: np.ndarray, w: np.ndarray, cens: Censored) -> float:
    with np.errstate(all="ignore"):
        ll = float(np.sum(w * dist.logpdf(vals)))
        if cens[0].size:
            ll += float(np.sum(cens[1] * dist.logsf(cens[0])))
    return -ll if math.isfinite(ll) else math.inf


def _weighted_refit(family: str, start: list[float], vals: np.ndarray, w: np.ndarray, cens: Censored) -> tuple[list[float], float, bool]:
    """Maximize the censored likelihood over (value, count) pairs, loc fixed at 0.

    Parameters are optimized on the log scale (all free ones are positive for our families).
    """
    dist = getattr(stats, family)
    free = [i for i, nm in enumerate(param_names(family)) if nm != "loc"]
    theta0 = np.log(np.maximum([start[i] for i in free], 1e-12))

    def full(theta: np.ndarray) -> list[float]:
        p = list(start)
        for i, t in zip(free, theta, strict=True):
            p[i] = float(np.exp(t))
        return p

    def f(theta: np.ndarray) -> float:
        return _nll(dist(*full(theta)), vals, w, cens)

    res = optimize.minimize(f, theta0, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-7, "maxiter": 4000})
    p = full(res.x)
    nll = f(res.x)
    return p, nll, bool(res.success)


def gof_stats(dist: Any, vals: np.ndarray, w: np.ndarray, n_cens: int, cap: float | None, lower: float = 0.0) -> dict[str, float]:
    """KS (over the uncensored range), its asymptotic p-value, W1 between the data and the model
    censored at the cap, and relative errors of the p99 / p99.9 quantiles."""
    n = int(w.sum()) + n_cens
    cum = np.cumsum(w) / n
    with np.errstate(all="ignore"):
        cdf = dist.cdf(vals)
    # ECDF just after and just before each distinct value
    ks = float(np.max(np.maximum(np.abs(cum - cdf), np.abs(cum - w / n - cdf)))) if vals.size else 0.0
    ks_p = float(stats.kstwo.sf(ks, n)) if n > 0 else float("nan")
    # empirical quantiles on the grid (censored values sit at the cap)
    all_vals = np.append(vals, cap) if n_cens and cap is not None else vals
    all_w = np.append(w, n_cens) if n_cens and cap is not None else w
    ecum = np.cumsum(all_w) / n
    idx = np.minimum(np.searchsorted(ecum, _GRID, side="left"), all_vals.size - 1)
    emp_q = all_vals[idx]
    with np.errstate(all="ignore"):
        mod_q = dist.ppf(_GRID)
    mod_q = np.nan_to_num(mod_q, nan=0.0, posinf=cap if cap is not None else 0.0)
    if cap is not None:
        mod_q = np.minimum(mod_q, cap)
    w1 = float(np.mean(np.abs(emp_q - mod_q)))

    def qerr(p: float) -> float:
        e = all_vals[min(int(np.searchsorted(ecum, p, side="left")), all_vals.size - 1)]
        with np.errstate(all="ignore"):
            m = float(dist.ppf(p))
        if cap is not None:
            m = min(m, cap)
        return float((m - e) / e) if e else float("nan")

    return {"ks": ks, "ks_p": ks_p, "wasserstein": w1, "p99_rel_err": qerr(0.99), "p999_rel_err": qerr(0.999)}


def fit_continuous(
    x: np.ndarray,
    censor_at: float | None = None,
    censored: np.ndarray | None = None,
    families: tuple[str, ...] = DEFAULT_FAMILIES,
    screen_n: int = SCREEN_N,
    seed: int = 0,
    integer: bool | None = None,
    lower: float | None = None,
) -> ContinuousFit:
    """Fit every family to ``x`` (values >= ``censor_at`` are right-censored there), pick by AIC.

    ``censored`` (a mask) marks values that are individually right-censored instead -- lower
    bounds, as after de-trending values that hit the cap at different steps.

    Two passes: every family is fitted on a seeded subsample of at most ``screen_n`` values (the
    cheap first pass); the ``KEEP`` best by AIC are refitted on all the data, starting from their
    first-pass parameters, and the winner is chosen by AIC there. Every fit maximises the censored
    likelihood over distinct (value, count) pairs (:func:`_compress`), analytically for the
    families in ``ANALYTIC`` (method-of-moments starts, L-BFGS-B), by EM for the mixtures.
    GoF statistics are computed on all the data for every candidate.
    """
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        raise ValueError(f"need at least 2 finite values to fit, got {x.size}")
    if integer is None:
        integer = bool(np.all(np.mod(x, 1.0) == 0))
    # non-positive values cannot enter positive families: shift them to the smallest positive unit
    eps = 1.0 if integer else max(float(np.min(x[x > 0])) / 2 if np.any(x > 0) else 1e-9, 1e-12)
    x = np.maximum(x, eps)
    if censored is not None:
        cens = np.asarray(censored, dtype=bool)
    else:
        cens = x >= censor_at if censor_at is not None else np.zeros(x.size, bool)
        if censor_at is not None:
            x = np.minimum(x, censor_at)
    n_cens_all = int(cens.sum())
    if n_cens_all == x.size:
        raise ValueError("every value is censored; nothing to fit")
    full = Data(*_compress(x[~cens]), *(_compress(x[cens]) if n_cens_all else (np.empty(0), np.empty(0))))
    lo = float(np.min(x)) if lower is None else float(lower)

    if x.size > screen_n:
        pick = np.random.default_rng(seed).choice(x.size, size=screen_n, replace=False)
        xs, cs = x[pick], cens[pick]
        first = Data(*_compress(xs[~cs]), *(_compress(xs[cs]) if cs.any() else (np.empty(0), np.empty(0))))
    else:
        first = full
    cands = [c for c in (_fit_family(f, first, seed) for f in families) if c is not None]
    if not cands:
        raise ValueError("no candidate family could be fitted")
    refit = first is not full
    if refit:
        cands.sort(key=lambda c: c.aic)
        for i, c in enumerate(cands):
            if i < KEEP:
                _refit(c, full, seed)
            else:  # pruned by the first pass: its first-pass parameters, scored on all the data
                c.nll = _nll(frozen(c.family, c.params), *full)
                c.aic = 2 * c.k + 2 * c.nll
                c.converged = False
    best = min(cands, key=lambda c: c.aic)
    for c in cands:
        g = gof_stats(frozen(c.family, c.params), full.vals, full.w, n_cens_all, censor_at if censored is None else None)
        for key, v in g.items():
            setattr(c, key, v)
    cands.sort(key=lambda c: c.aic)
    return ContinuousFit(
        family=best.family,
        params=best.params,
        param_names=best.param_names,
        censor_at=censor_at,
        n=int(x.size),
        n_censored=n_cens_all,
        integer=integer,
        lower=lo,
        gof={k: getattr(best, k) for k in ("aic", "nll", "ks", "ks_p", "wasserstein", "p99_rel_err", "p999_rel_err")},
        candidates=cands,
        refit_on_all=refit,
    )


# ----------------------------------------------------------------------------- analytic likelihoods


@dataclass
class Data:
    """Distinct uncensored values with counts, distinct censoring points with counts."""

    vals: np.ndarray
    w: np.ndarray
    cvals: np.ndarray
    cw: np.ndarray

    def __iter__(self):  # (vals, w, (cvals, cw)): the argument order of _nll
        return iter((self.vals, self.w, (self.cvals, self.cw)))


def _log_moments(d: Data) -> tuple[float, float, float, float]:
    """Weighted mean and sd of log x, mean and variance of x, over the uncensored values."""
    y = np.log(d.vals)
    m = float(np.average(y, weights=d.w))
    sd = float(np.sqrt(max(np.average((y - m) ** 2, weights=d.w), 1e-12)))
    mx = float(np.average(d.vals, weights=d.w))
    vx = float(max(np.average((d.vals - mx) ** 2, weights=d.w), 1e-12 * mx * mx + 1e-300))
    return m, sd, mx, vx


def _ll_lognorm(t: np.ndarray, d: Data) -> float:
    mu, s = t[0], math.exp(t[1])
    y = np.log(d.vals)
    ll = np.sum(d.w * (-y - math.log(s) - 0.5 * math.log(2 * math.pi) - 0.5 * ((y - mu) / s) ** 2))
    if d.cvals.size:
        ll += np.sum(d.cw * special.log_ndtr(-(np.log(d.cvals) - mu) / s))
    return float(ll)


def _ll_gamma(t: np.ndarray, d: Data) -> float:
    a, scale = math.exp(t[0]), math.exp(t[1])
    ll = np.sum(d.w * ((a - 1) * np.log(d.vals) - d.vals / scale)) - d.w.sum() * (a * math.log(scale) + special.gammaln(a))
    if d.cvals.size:
        with np.errstate(divide="ignore"):
            ll += np.sum(d.cw * np.log(np.maximum(special.gammaincc(a, d.cvals / scale), 1e-300)))
    return float(ll)


def _ll_weibull(t: np.ndarray, d: Data) -> float:
    c, scale = math.exp(t[0]), math.exp(t[1])
    lz = np.log(d.vals) - math.log(scale)
    ll = np.sum(d.w * (math.log(c) - math.log(scale) + (c - 1) * lz - np.exp(c * lz)))
    if d.cvals.size:
        ll -= np.sum(d.cw * np.exp(c * (np.log(d.cvals) - math.log(scale))))
    return float(ll)


def _ll_fisk(t: np.ndarray, d: Data) -> float:
    c, scale = math.exp(t[0]), math.exp(t[1])
    lz = np.log(d.vals) - math.log(scale)
    ll = np.sum(d.w * (math.log(c) - math.log(scale) + (c - 1) * lz - 2 * np.logaddexp(0.0, c * lz)))
    if d.cvals.size:
        ll -= np.sum(d.cw * np.logaddexp(0.0, c * (np.log(d.cvals) - math.log(scale))))
    return float(ll)


def _start_lognorm(d: Data) -> np.ndarray:
    m, sd, _, _ = _log_moments(d)
    return np.array([m, math.log(sd)])


def _start_gamma(d: Data) -> np.ndarray:
    _, _, mx, vx = _log_moments(d)
    return np.log([mx * mx / vx, vx / mx])  # method of moments


def _start_weibull(d: Data) -> np.ndarray:
    m, sd, _, _ = _log_moments(d)
    c = 1.2825 / sd  # log of a Weibull is Gumbel: sd = pi / (c sqrt 6), mean = log scale - gamma / c
    return np.array([math.log(c), m + 0.5772 / c])


def _start_fisk(d: Data) -> np.ndarray:
    m, sd, _, _ = _log_moments(d)
    return np.array([math.log(math.pi / (math.sqrt(3) * sd)), m])  # log of a log-logistic is logistic


# family -> (log-likelihood of unconstrained theta, method-of-moments start, theta -> scipy params)
ANALYTIC: dict[str, tuple[Any, Any, Any]] = {
    "lognorm": (_ll_lognorm, _start_lognorm, lambda t: [math.exp(t[1]), 0.0, math.exp(t[0])]),
    "gamma": (_ll_gamma, _start_gamma, lambda t: [math.exp(t[0]), 0.0, math.exp(t[1])]),
    "weibull_min": (_ll_weibull, _start_weibull, lambda t: [math.exp(t[0]), 0.0, math.exp(t[1])]),
    "fisk": (_ll_fisk, _start_fisk, lambda t: [math.exp(t[0]), 0.0, math.exp(t[1])]),
}


def _theta_of(family: str, params: list[float]) -> np.ndarray:
    if family == "lognorm":
        return np.array([math.log(params[2]), math.log(params[0])])
    return np.log([params[0], params[-1]])


def _mle(family: str, d: Data, theta0: np.ndarray) -> tuple[list[float], float, bool]:
    ll, _, to_params = ANALYTIC[family]

    def f(t: np.ndarray) -> float:
        with np.errstate(all="ignore"):
            v = -ll(t, d)
        return v if math.isfinite(v) else 1e300

    res = optimize.minimize(f, theta0, method="L-BFGS-B")
    return to_params(res.x), float(res.fun), bool(res.success)


def _expon(d: Data) -> list[float]:
    """Censored exponential MLE in closed form: total exposure / events."""
    return [0.0, float((np.dot(d.w, d.vals) + np.dot(d.cw, d.cvals)) / d.w.sum())]


def _candidate(family: str, params: list[float], d: Data, converged: bool = True) -> CandidateFit | None:
    nll = _nll(frozen(family, params), *d)
    if not math.isfinite(nll):
        return None
    k = 3 * int(family[len(MIX_PREFIX):]) - 1 if family.startswith(MIX_PREFIX) else len(params) - 1
    return CandidateFit(family, [float(p) for p in params], param_names(family), k, nll, 2 * k + 2 * nll, 0, 0, 0, 0, 0, converged)


def _fit_family(family: str, d: Data, seed: int) -> CandidateFit | None:
    """One family's censored MLE on ``d`` (None when it cannot be fitted)."""
    try:
        if family.startswith(MIX_PREFIX):
            k = int(family[len(MIX_PREFIX):])
            if d.vals.size < 10 * k:
                return None
            m, _ = fit_lnmix(d.vals, d.w, d.cvals, d.cw, k, seed=seed)
            return _candidate(family, m.params, d)
        if family == "expon":
            return _candidate(family, _expon(d), d)
        if family in ANALYTIC:
            p, _, ok = _mle(family, d, ANALYTIC[family][1](d))
            return _candidate(family, p, d, ok)
        # any other scipy family: its own start on the uncensored values, then the censored likelihood
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = [float(v) for v in getattr(stats, family).fit(np.repeat(d.vals, np.minimum(d.w, 50).astype(int)), floc=0)]
        p, _, ok = _weighted_refit(family, start, d.vals, d.w, (d.cvals, d.cw))
        return _candidate(family, p, d, ok)
    except (ValueError, FloatingPointError, np.linalg.LinAlgError, OverflowError):
        return None


def _refit(c: CandidateFit, d: Data, seed: int) -> None:
    """Refit a first-pass candidate on all the data, from its first-pass parameters."""
    if c.family.startswith(MIX_PREFIX):
        m, _ = fit_lnmix(d.vals, d.w, d.cvals, d.cw, int(c.family[len(MIX_PREFIX):]), seed=seed)
        c.params = m.params
    elif c.family == "expon":
        c.params = _expon(d)
    elif c.family in ANALYTIC:
        c.params, _, c.converged = _mle(c.family, d, _theta_of(c.family, c.params))
    else:
        c.params, _, c.converged = _weighted_refit(c.family, c.params, d.vals, d.w, (d.cvals, d.cw))
    c.nll = _nll(frozen(c.family, c.params), *d)
    c.aic = 2 * c.k + 2 * c.nll


def json_safe(o: Any) -> Any:
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [json_safe(v) for v in o]
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o
