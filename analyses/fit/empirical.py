"""A semi-parametric length marginal: the data's own body, a censored generalized Pareto tail.

Why: PolyTrace's histogram resampler *is* the empirical distribution, and no single parametric
family matches it on sample shape (a family fitted to the whole range trades body against tail).
Here

* below the tail threshold the quantile function is the data's own: the Kaplan-Meier estimate
  (the empirical distribution when nothing is censored), linearly interpolated between
  ``len(knots)`` quantiles -- a continuous version of the empirical CDF;
* above it a GPD fitted to the exceedances by maximum likelihood *with right-censoring*:
  a response cut at the max length (``censor_at``) says only "at least this long", and its
  likelihood term is the GPD survival function there (:func:`fit_gpd_censored`, analytic
  log-likelihood, L-BFGS-B from probability-weighted-moment starts). Each value may carry its own
  censoring point (after de-levelling, a step's cap sits at ``cap / level``).
* generation draws the *latent* (uncensored) length and cuts it at the cap, so the share at the
  cap follows the level of the step instead of being a fixed point mass; with no cap known the
  GPD is truncated at ``tail_limit`` times the largest value seen;
* **trimming** (bounded influence): the largest ``trim`` share of the exceedances enter the GPD
  fit only as "at least the trim point" -- values already cut at the cap count towards that
  share -- so two or three runaway responses (a repetition loop running to thousands of tokens)
  cannot set the shape of everyone else's tail. They are kept as ``extremes``;
* **heavy steps**: real steps differ in how heavy their tail is (a few runaways in one step,
  none in the next). With probability ``heavy_prob`` (:func:`heavy_step_share`) a generated step
  draws its levels above the trim point from the recorded ``extremes`` instead of the GPD. Heavy
  steps come in runs, so a forecast of the steps after the fitted ones starts from the last fitted
  step's state and forgets it at the rate the fitted steps do (a two-state chain,
  :func:`heavy_chain`, :meth:`EmpiricalTailFit.heavy_prob_at`);
* **tail scale per step**: in quiet steps too, the longest response varies from step to step more
  than the longest of i.i.d. draws from one tail; each step's GPD excesses are scaled by
  ``exp(tail_sd * z)``, ``z ~ N(0, 1)`` per step, ``tail_sd`` estimated from the fitted steps'
  longest values (:func:`tail_scale_sd`).

Old specs (version 1.0) hold a point mass ``p_cap`` at the cap; ``ppf`` still honours it
(new fits have ``p_cap = 0``).

``ppf(u)``: ``u >= 1 - p_cap`` is the cap; otherwise ``v = u / (1 - p_cap)`` is a quantile level
of the latent length: body knots up to ``1 - tail_prob``, the (truncated) GPD above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize

from analyses.fit.continuous import apply_bounds, json_safe
from analyses.fit.tails import gpd_from_dict, gpd_to_dict

MAX_KNOTS = 513
TAIL_PROB = 0.10  # share of the (latent) distribution modelled by the GPD
TRIM = 0.10  # share of the largest exceedances that count only as "at least this large" in the GPD fit
MIN_EXCEED = 20  # fewer exceedances (censored ones included) than this: no GPD, the body runs to the largest value
TAIL_LIMIT = 2.0  # default tail_limit
XI_BOUNDS = (-0.5, 1.5)
MAX_EXTREMES = 257  # quantiles kept of the values above the trim point
HEAVY_QUANTILE = 0.99  # GPD shapes a length distribution can plausibly have
MAX_LEVELS = 2048  # quadrature levels of the distribution of a step's longest value
MIN_QUIET_STEPS = 3  # fewer quiet steps than this: no tail-scale effect (one residual is no variance)


# ----------------------------------------------------------------------------- Kaplan-Meier


def kaplan_meier(x: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct event values, CDF just after each) of right-censored data: ``x[i]`` is the value,
    or a lower bound of it where ``censored[i]``. Without censoring: the empirical CDF."""
    x = np.asarray(x, dtype=float)
    c = np.asarray(censored, dtype=bool)
    vals, inv = np.unique(x, return_inverse=True)
    d = np.bincount(inv, weights=(~c).astype(float), minlength=vals.size)  # events at each value
    n = np.bincount(inv, minlength=vals.size).astype(float)
    at_risk = x.size - np.concatenate([[0.0], np.cumsum(n)[:-1]])
    ev = d > 0
    surv = np.cumprod(1.0 - d[ev] / at_risk[ev])
    return vals[ev], 1.0 - surv


def km_quantile(vals: np.ndarray, cdf: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Quantiles of a Kaplan-Meier CDF at levels ``p``: event value ``v_i`` sits at the middle of
    its jump, level ``(F(v_i-) + F(v_i)) / 2`` (Hazen's plotting position; ``(i - 1/2) / n`` without
    censoring), linear in between, the extreme event values beyond."""
    p = np.asarray(p, dtype=float)
    if vals.size == 1:
        return np.full(p.shape, float(vals[0]))
    mid = (np.concatenate([[0.0], cdf[:-1]]) + cdf) / 2
    return np.interp(p, mid, vals)


# ----------------------------------------------------------------------------- censored GPD


def gpd_loglik(xi: float, sigma: float, y: np.ndarray, yc: np.ndarray) -> float:
    """Log-likelihood of GPD(xi, sigma) for exceedances ``y`` and censored exceedances ``yc``
    (each only known to be at least that large): density terms for ``y``, survival terms for ``yc``."""
    if abs(xi) < 1e-7:  # the exponential limit
        return float(-y.size * math.log(sigma) - (y.sum() + yc.sum()) / sigma)
    zy, zc = 1 + xi * y / sigma, 1 + xi * yc / sigma
    if (zy.size and zy.min() <= 0) or (zc.size and zc.min() <= 0):
        return -math.inf
    return float(-y.size * math.log(sigma) - (1 + 1 / xi) * np.log(zy).sum() - (1 / xi) * np.log(zc).sum())


def fit_gpd_censored(y: np.ndarray, yc: np.ndarray | None = None) -> tuple[float, float]:
    """(xi, sigma) maximising the censored GPD likelihood of exceedances ``y`` (and lower bounds
    ``yc``).

    Start: Hosking's probability-weighted moments of ``y``. Then Nelder-Mead over ``(xi, s)`` with
    ``sigma = exp(s) + max(0, -xi) * top`` (``top`` the largest exceedance): every such point lies
    inside the GPD's support, so the likelihood is finite and smooth everywhere the optimiser
    looks; ``xi`` is kept in ``XI_BOUNDS``. (Two parameters: Nelder-Mead needs ~100 likelihood
    evaluations, a quarter of L-BFGS-B's time with numerical gradients here.)
    """
    y = np.sort(np.asarray(y, dtype=float))
    yc = np.zeros(0) if yc is None else np.asarray(yc, dtype=float)
    n = y.size
    top = max(float(y[-1]) if n else 0.0, float(yc.max()) if yc.size else 0.0) * (1 + 1e-9) + 1e-12
    m = float(y.mean()) if n else float(yc.mean())
    if n > 2:
        b1 = float(np.sum(y * np.arange(n)) / (n * (n - 1)))  # unbiased PWM estimate of E[X F(X)]
        xi0 = 2 - m / max(2 * b1 - m, 1e-12)
        sig0 = 2 * m * (m - b1) / max(2 * b1 - m, 1e-12)
    else:
        xi0, sig0 = 0.0, m
    xi0 = float(np.clip(xi0, XI_BOUNDS[0] + 0.01, XI_BOUNDS[1] - 0.01))

    def sigma_of(t: np.ndarray) -> float:
        return math.exp(min(max(float(t[1]), -30.0), 30.0)) + max(0.0, -float(t[0])) * top

    def f(t: np.ndarray) -> float:
        if not XI_BOUNDS[0] <= t[0] <= XI_BOUNDS[1]:
            return 1e300
        ll = gpd_loglik(float(t[0]), sigma_of(t), y, yc)
        return -ll if math.isfinite(ll) else 1e300

    s0 = math.log(max(sig0 - max(0.0, -xi0) * top, max(m, 1e-12) * 1e-3))
    opts = {"xatol": 1e-5, "fatol": 1e-8, "maxiter": 2000}
    best = optimize.minimize(f, np.array([xi0, s0]), method="Nelder-Mead", options=opts)
    if best.fun >= 1e299 or not best.success:  # a second start, from the exponential tail
        other = optimize.minimize(f, np.array([0.0, math.log(max(m, 1e-12))]), method="Nelder-Mead", options=opts)
        best = other if other.fun < best.fun else best
    return float(best.x[0]), sigma_of(best.x)


def gpd_ppf(q: np.ndarray, xi: float, sigma: float) -> np.ndarray:
    q = np.asarray(q, dtype=float)
    if abs(xi) < 1e-6:
        return -sigma * np.log1p(-q)
    return sigma / xi * ((1 - q) ** (-xi) - 1)


def gpd_cdf(y: np.ndarray | float, xi: float, sigma: float) -> np.ndarray:
    y = np.maximum(np.asarray(y, dtype=float), 0.0)
    if abs(xi) < 1e-6:
        return -np.expm1(-y / sigma)
    with np.errstate(divide="ignore", over="ignore"):
        z = np.maximum(1 + xi * y / sigma, 0.0)
        return 1 - np.where(z > 0, z ** (-1 / xi), 0.0)


# ----------------------------------------------------------------------------- the marginal


@dataclass
class EmpiricalTailFit:
    knots: list[float]  # latent quantiles at levels linspace(0, 1 - tail_prob, len(knots))
    tail_prob: float  # P(latent value > threshold); 0 = no GPD tail
    xi: float
    sigma: float
    upper: float  # the GPD is truncated here (the cap, or tail_limit x the largest value seen)
    censor_at: float | None
    p_cap: float  # P(value at the cap) as a point mass (spec 1.0); 0 for latent-tail fits
    n: int
    n_censored: int
    integer: bool = True
    lower: float = 1.0
    # the recorded extremes: quantiles of the values above the trim point (level cut_level),
    # drawn instead of the GPD in a heavy step (probability heavy_prob, see :func:`heavy_step_share`)
    extremes: list[float] = field(default_factory=list)
    cut_level: float = 1.0
    heavy_prob: float = 0.0
    # heavy steps come in runs: the chain's persistence and the state of the last fitted step
    # (:func:`heavy_chain`), for forecasting the steps after it
    heavy_persistence: float = 0.0
    heavy_last: bool = False
    last_step: int | None = None
    # sd of a step's log tail scale (:func:`tail_scale_sd`): the GPD excesses of one step are
    # multiplied by exp(tail_sd * z_k), z_k ~ N(0, 1) per step
    tail_sd: float = 0.0
    # the knots' quantile levels when they are not evenly spaced (a fit from summaries places them
    # densely in both tails, where its contamination components live); None: evenly spaced
    levels: list[float] | None = None
    # how well the spread of the lengths is known (a fit from summaries): a forecast's replay scales
    # every length's log-distance from the median by exp(spread_se * z), z ~ N(0, 1) per replay
    spread_se: float = 0.0

    def __post_init__(self) -> None:
        # built once: ppf is called per generated step
        self._knots = np.asarray(self.knots, dtype=float)
        self._levels = (np.asarray(self.levels, dtype=float) if self.levels is not None
                        else np.linspace(0.0, 1.0 - self.tail_prob, self._knots.size))
        trunc = self.censor_at is None or self.p_cap > 0
        self._top = float(gpd_cdf(self.upper - self.threshold, self.xi, self.sigma)) if trunc and self.tail_prob > 0 else 1.0
        self._extremes = np.asarray(self.extremes, dtype=float)

    @property
    def threshold(self) -> float:
        return float(self.knots[-1])

    def heavy_prob_at(self, step: int, forecast: bool = True) -> float:
        """P(step ``step`` is heavy). Steps up to the last fitted one (or ``forecast=False``, an
        export): the share of heavy steps. A step ``d`` steps after it: the two-state chain's
        forecast from the last fitted step's state, ``p + (h_last - p) * persistence**d``, which
        decays to the share ``p`` as the last state is forgotten."""
        p = self.heavy_prob
        if not forecast or p <= 0 or self.heavy_persistence <= 0 or self.last_step is None or step <= self.last_step:
            return p
        return p + (float(self.heavy_last) - p) * self.heavy_persistence ** (step - self.last_step)

    def latent_ppf(self, v: np.ndarray, heavy: np.ndarray | bool = False,
                   tail_scale: np.ndarray | float = 1.0) -> np.ndarray:
        """Quantiles of the latent (uncensored) length at levels ``v`` in [0, 1); where ``heavy``
        (broadcast against ``v``), levels above ``cut_level`` are the recorded extremes;
        ``tail_scale`` (broadcast against ``v``) multiplies the GPD excesses (a step's tail scale)."""
        v = np.asarray(v, dtype=float)
        out = np.interp(v, self._levels, self._knots)
        if self.tail_prob > 0:
            tail = v > 1 - self.tail_prob
            if tail.any():
                t = (v[tail] - (1 - self.tail_prob)) / self.tail_prob * self._top
                scale = np.broadcast_to(np.asarray(tail_scale, dtype=float), v.shape)[tail]
                out[tail] = self.threshold + gpd_ppf(np.clip(t, 0, 1 - 1e-12), self.xi, self.sigma) * scale
        if self._extremes.size and np.any(heavy):
            ext = np.broadcast_to(np.asarray(heavy, dtype=bool), v.shape) & (v > self.cut_level)
            if ext.any():
                w = (v[ext] - self.cut_level) / max(1 - self.cut_level, 1e-300)
                out[ext] = np.interp(w, np.linspace(0.0, 1.0, self._extremes.size), self._extremes)
        return out

    def latent_cdf(self, x: np.ndarray) -> np.ndarray:
        """P(latent length <= x) of the smooth model (body and GPD, no heavy steps)."""
        x = np.asarray(x, dtype=float)
        body = np.interp(x, self._knots, self._levels, left=0.0, right=1.0 - self.tail_prob)
        if self.tail_prob <= 0:
            return np.where(x >= self._knots[-1], 1.0, body)
        g = np.minimum(gpd_cdf(x - self.threshold, self.xi, self.sigma) / self._top, 1.0)
        return np.where(x > self.threshold, 1 - self.tail_prob + self.tail_prob * g, body)

    def ppf(self, u: np.ndarray, factor: np.ndarray | float = 1.0, heavy: np.ndarray | bool = False,
            tail_scale: np.ndarray | float = 1.0, spread: np.ndarray | float = 1.0) -> np.ndarray:
        """Lengths at levels ``u``: the latent quantile (its GPD excess times ``tail_scale``)
        times ``factor`` (a step's level), cut at the cap; a spec-1.0 cap mass stays at the cap
        whatever the factor."""
        u = np.asarray(u, dtype=float)
        cap = u >= 1 - self.p_cap
        v = np.clip(u / max(1 - self.p_cap, 1e-300), 0.0, 1.0)
        out = self.latent_ppf(v, heavy, tail_scale)
        if np.any(np.asarray(spread) != 1.0):  # a replay's spread: log-distances from the median scaled
            med = float(np.interp(0.5, self._levels, self._knots))
            out = med * (np.maximum(out, 1e-9) / med) ** spread
        out = out * factor
        if self.p_cap > 0:
            out = np.where(cap, self.censor_at if self.censor_at is not None else self.upper, out)
        # with no cap known, never beyond the GPD's truncation point, whatever the step's level
        return apply_bounds(out, self.lower, self.censor_at if self.censor_at is not None else self.upper, self.integer)

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
                "extremes": self.extremes,
                "cut_level": self.cut_level,
                "heavy_prob": self.heavy_prob,
                "heavy_persistence": self.heavy_persistence,
                "heavy_last": self.heavy_last,
                "last_step": self.last_step,
                "tail_sd": self.tail_sd,
                **({"levels": self.levels} if self.levels is not None else {}),
                **({"spread_se": self.spread_se} if self.spread_se > 0 else {}),
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EmpiricalTailFit:
        c, s = gpd_from_dict(d["tail"])
        return cls([float(k) for k in d["knots"]], float(d["tail_prob"]), float(c), float(s), float(d["upper"]),
                   d.get("censor_at"), float(d.get("p_cap") or 0.0), int(d.get("n", 0)), int(d.get("n_censored", 0)),
                   bool(d.get("integer", True)), float(d.get("lower", 1.0)), [float(v) for v in d.get("extremes") or []],
                   float(d.get("cut_level", 1.0)), float(d.get("heavy_prob") or 0.0),
                   float(d.get("heavy_persistence") or 0.0), bool(d.get("heavy_last")),
                   int(d["last_step"]) if d.get("last_step") is not None else None, float(d.get("tail_sd") or 0.0),
                   [float(v) for v in d["levels"]] if d.get("levels") is not None else None,
                   float(d.get("spread_se") or 0.0))


def fit_empirical_tail(x: np.ndarray, censor_at: float | None, *, censored: np.ndarray | None = None, integer: bool = True,
                       lower: float = 1.0, max_knots: int = MAX_KNOTS, tail_limit: float = TAIL_LIMIT,
                       tail_prob: float | None = TAIL_PROB, trim: float = TRIM) -> EmpiricalTailFit:
    """Fit the marginal to values ``x``. Censoring: ``censored[i]`` marks ``x[i]`` as a lower
    bound; by default the values ``>= censor_at`` are the censored ones. ``tail_prob`` (default
    ``TAIL_PROB``; 0 = no tail): the uncensored share above the GPD threshold. ``trim``: the share
    of the largest exceedances entered as censored at the next one (see the module text)."""
    tail_prob = TAIL_PROB if tail_prob is None else tail_prob
    x = np.asarray(x, dtype=float)
    fin = np.isfinite(x)
    x = x[fin]
    if censored is None:
        cens = x >= censor_at if censor_at is not None else np.zeros(x.size, bool)
    else:
        cens = np.asarray(censored, dtype=bool)[fin]
    n_unc = int((~cens).sum())
    if n_unc < 2:
        raise ValueError(f"need at least 2 uncensored values, got {n_unc}")
    vals, cdf = kaplan_meier(x, cens)
    upper = float(censor_at) if censor_at is not None else tail_limit * float(x.max())
    tp, xi, sigma = 0.0, 0.0, 1.0
    # the threshold leaves ``tail_prob`` of uncensored mass above it, plus whatever KM leaves
    # unresolved beyond the last event (the censored mass at the cap)
    level = float(cdf[-1]) - tail_prob
    u = float(km_quantile(vals, cdf, np.array([level]))[0]) if level > 0 else float(vals[0])
    y, yc = x[(x > u) & ~cens] - u, x[(x > u) & cens] - u
    extremes, cut_level = np.zeros(0), 1.0
    if trim > 0 and y.size > 2:
        # bounded influence: the largest exceedances count only as "at least the trim point";
        # those cut at the cap already do, so only the rest of the trimmed share is trimmed
        k_trim = int(np.floor(trim * (y.size + yc.size))) - yc.size
        if k_trim > 0:
            ys = np.sort(y)
            cut = ys[-k_trim - 1]
            above = np.sort(np.concatenate([ys[-k_trim:], yc[yc > cut]])) + u
            extremes = np.quantile(above, np.linspace(0, 1, min(above.size, MAX_EXTREMES))) if above.size else above
            cut_level = 1.0 - float(above.size) / x.size
            yc = np.concatenate([yc, np.full(k_trim, cut)])
            y = ys[:-k_trim]
    if tail_prob > 0 and level > 0 and y.size + yc.size >= MIN_EXCEED and y.size >= 2:
        xi, sigma = fit_gpd_censored(y, yc)
        tp = 1.0 - level
    k = int(min(max_knots, max(n_unc, 2)))
    knots = km_quantile(vals, cdf, np.linspace(0.0, 1.0 - tp, k) if tp > 0 else np.linspace(0.0, float(cdf[-1]), k))
    # too few exceedances for a tail: what KM leaves beyond the last event is a point mass at the cap
    p_cap = float(1.0 - cdf[-1]) if tp == 0 and censor_at is not None else 0.0
    if tp == 0:
        extremes, cut_level = np.zeros(0), 1.0
    return EmpiricalTailFit(knots.tolist(), tp, xi, sigma, upper, float(censor_at) if censor_at is not None else None,
                            p_cap, int(x.size), int(cens.sum()), integer, lower, extremes.tolist(), cut_level)


def step_maxima(steps: np.ndarray, x: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct steps in order, samples per step, each step's longest value; +inf where one is
    cut at the cap, so only "at least the cap" is known)."""
    uniq, inv = np.unique(steps, return_inverse=True)
    top = np.full(uniq.size, -np.inf)
    np.maximum.at(top, inv, np.where(censored, np.inf, x))
    return uniq, np.bincount(inv).astype(float), top


def heavy_steps(m: EmpiricalTailFit, steps: np.ndarray, x: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct steps in order, whether each is heavy): a step is *heavy* when its longest
    (latent) value lies beyond the 99% quantile of the longest of that many draws from ``m`` (a
    response cut at the cap counts as beyond when the cap is). ``m`` is the *untrimmed* fit (its
    GPD fitted to every exceedance, runaways included, so as heavy as the data make it)."""
    uniq, n_k, top = step_maxima(steps, x, censored)
    if m.tail_prob <= 0:
        return uniq, np.zeros(uniq.size, bool)
    f = m.latent_cdf(np.minimum(top, np.finfo(float).max))
    return uniq, f**n_k > HEAVY_QUANTILE


def heavy_step_share(m: EmpiricalTailFit, steps: np.ndarray, x: np.ndarray, censored: np.ndarray) -> float:
    """The share of steps whose extremes no smooth tail explains (:func:`heavy_steps`). With
    ``h`` heavy steps of ``n``: ``(h + 1/2) / (n + 1)``, the posterior mean under Jeffreys' prior
    -- on a run with no heavy step the recorded extremes are ordinary values, so a heavy step
    changes little."""
    if m.tail_prob <= 0:
        return 0.0
    uniq, heavy = heavy_steps(m, steps, x, censored)
    return float((heavy.sum() + 0.5) / (uniq.size + 1))


def heavy_chain(heavy: np.ndarray) -> float:
    """The persistence of heavy steps, ``P(heavy | heavy before) - P(heavy | quiet before)``, from
    the transitions between consecutive fitted steps (each row's probability the posterior mean
    under Jeffreys' prior, ``(count + 1/2) / (transitions + 1)``); 0 when heavy steps do not
    cluster. Why: runaway responses come in runs (a policy stuck in a repetition loop stays stuck
    for a few steps: verl-video's steps 16-21), so whether the last fitted step was heavy says
    something about the next one that the share of heavy steps alone does not."""
    h = np.asarray(heavy, dtype=bool)
    prev, nxt = h[:-1], h[1:]
    p_hh = (float(np.sum(prev & nxt)) + 0.5) / (float(prev.sum()) + 1.0)
    p_qh = (float(np.sum(~prev & nxt)) + 0.5) / (float((~prev).sum()) + 1.0)
    return max(0.0, p_hh - p_qh)


def iid_log_excess_var(m: EmpiricalTailFit, n: float) -> float:
    """Variance of ``log(longest - threshold)`` over the steps of ``n`` i.i.d. draws from ``m``'s
    smooth model: the longest of ``n`` sits at level ``w ** (1/n)``, ``w`` uniform (midpoint rule,
    ``MAX_LEVELS`` levels; an excess below 1 counts as 1)."""
    w = (np.arange(MAX_LEVELS) + 0.5) / MAX_LEVELS
    e = np.log(np.maximum(m.latent_ppf(w ** (1.0 / n)) - m.threshold, 1.0))
    return float(np.var(e))


def tail_scale_sd(m: EmpiricalTailFit, n_k: np.ndarray, top: np.ndarray, quiet: np.ndarray) -> float:
    """The sd of a per-step random effect on the tail scale, by the method of moments.

    Why: the longest response of a quiet step varies from step to step more than the longest of
    i.i.d. draws from one tail does (verl-video: 324 to 962 tokens where one tail gives ~330-480),
    so an ensemble of i.i.d. steps is too sure of it. If step ``k``'s GPD excesses are scaled by
    ``exp(zeta_k)``, ``zeta_k ~ N(0, tau^2)``, then ``log(longest_k - threshold) = zeta_k + log(an
    i.i.d. step's longest excess)``: the two variances add, and
    ``tau^2 = max(0, var over quiet steps - mean i.i.d. variance)`` (:func:`iid_log_excess_var`
    at each step's sample count). Only the ``quiet`` steps (not heavy, :func:`heavy_steps`) count:
    a heavy step's runaway is the heavy-step chain's business, not the tail scale's."""
    keep = np.asarray(quiet, dtype=bool) & np.isfinite(top)
    if m.tail_prob <= 0 or keep.sum() < MIN_QUIET_STEPS:
        return 0.0
    e = np.log(np.maximum(top[keep] - m.threshold, 1.0))
    v_iid = {n: iid_log_excess_var(m, n) for n in np.unique(n_k[keep])}
    excess = float(np.var(e, ddof=1)) - float(np.mean([v_iid[n] for n in n_k[keep]]))
    return math.sqrt(max(0.0, excess))
