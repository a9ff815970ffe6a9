"""Fit a workload from per-step summaries (:mod:`analyses.fit.summaries`): the statistics every
framework prints, for runs that never logged a sample.

The summaries are turned into **per-step distributions** -- one shape shared by the run's steps
(:class:`~analyses.fit.stepshape.StepShape`: a log-logistic body and thin contamination components
for extremes that are not the body's), each step at its own level ``mu_k`` -- and those feed what
the per-sample fit feeds: the step-level model (:func:`~analyses.fit.drift.drift_from_levels` on the
levels and their sampling variances), the generator's marginal (an
:class:`~analyses.fit.empirical.EmpiricalTailFit` holding the shape's quantile function at the
reference level) and the group copula; so the spec entry, the sampler, the rolling-origin scores
and every export are the per-sample fit's.

What each statistic is, and how it enters (one step, ``n`` responses, verl prints it each step):

* ``min`` and ``max`` are extreme order statistics of ``n`` draws. With ``c`` responses at the
  cap (the clip ratio times ``n``: a censored mass), the joint likelihood of (min, max, c) is
  ``n(n-1) p(min) p(max) [F(max) - F(min)]^(n-2)`` when nothing is cut, and
  ``n!/(c!(n-c-1)!) S(cap)^c p(min) [F(cap) - F(min)]^(n-c-1)`` when ``c > 0`` (``p`` the
  probability of the integer length, ``S`` the survival at the cap). It is maximised over the
  shape's scale ``s`` and contamination weights, every step sharing them;
* the **mean** is exact information about the level: given the min and the max (and the ``c``
  responses at the cap), the other responses are i.i.d. draws between them, so
  ``(n mean - min - max) / (n - 2)`` estimates ``E[length | min < length < max]`` -- a mean the
  runaway that made the max cannot move -- and the step's level ``mu_k`` is solved from it;
* transformers' ``Trainer`` (TRL, Unsloth) averages every metric over the steps since its previous
  log (``averaged_steps``): a row's min and max are then means of per-step extremes, entered as
  normal with the moments of the n-draw extremes, and the level is solved from the capped mean
  (from ``mean_terminated_length``, the mean below the cap, where TRL prints it);
* ``mu_k``'s sampling variance is the middle mean's, ``Var[length | window] (1 + (k - 1) rho) / n``
  through the level's derivative, with ``rho`` the within-group correlation (``k`` responses
  per prompt): the drift model separates the step-to-step variation from it as it does for
  per-sample levels.

What summaries leave unknown is said in the spec (``fitted_from``, ``statistics``, ``assumed``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import polars as pl
from scipy import optimize, special, stats

from analyses.fit.continuous import json_safe
from analyses.fit.drift import DriftModel, drift_from_levels
from analyses.fit.empirical import HEAVY_QUANTILE, MAX_EXTREMES, EmpiricalTailFit, heavy_chain
from analyses.fit.stepshape import (
    SCIPY_NAME,
    ExpParts,
    Parts,
    StepShape,
    WindowMean,
    WindowParts,
    capped_mean,
    capped_parts,
    mid_mean,
    mid_var,
    solve_levels,
    window_parts,
    window_var,
)
from analyses.fit.summaries import conform_summaries

FAMILY = "logistic"
# the response body's candidates (family, skew): the log-logistic, the closest family to every
# recorded run's single-turn steps, and the Weibull (left-skewed on the log axis); a multi-turn
# trajectory sums its turns, and those that stop at the first turn make a short mass below the
# body, so agent runs also get the glogistic's skews between the two. The least skewed whose
# likelihood is within FAMILY_MARGIN of the best is taken (:func:`fit_body`)
BODIES = ((FAMILY, 1.0), ("gumbel_min", 1.0))
AGENT_BODIES = ((FAMILY, 1.0), ("glogistic", 2.0), ("glogistic", 4.0), ("glogistic", 8.0), ("gumbel_min", 1.0))
FAMILY_MARGIN = 2.0
S_GRID = tuple(float(v) for v in np.exp(np.linspace(math.log(0.03), math.log(2.0), 11)))
LOG_EPS = (math.log(1e-7), math.log(0.05))
EPS_START = 1e-4
KNOT_LOGITS = 18.0  # knot levels from expit(-18) ~ 1.5e-8 to 1 - 1.5e-8, logit-spaced
N_KNOTS = 513
UPPER_OVER_CAP = math.e  # the upper contamination reaches e x the cap (its part beyond is cut there)
UPPER_OVER_MAX = 2.0  # ... or, with no cap known, twice the longest length logged
MIN_EXTREME_N = 8  # fewer draws in a row than this: only its mean is used
SPREAD_STEP = 0.1  # the step in log s of the profile likelihood's curvature
MAX_SPREAD_SE = 0.5
DEFAULT_WITHIN = 0.25  # within-group correlation where the summaries do not tell it


@dataclass
class LengthSummaries:
    """One length variable's per-step summaries as arrays (rows with a mean and an n)."""

    name: str  # "response" | "prompt"
    steps: np.ndarray
    n: np.ndarray  # draws the row's statistics are over
    mean: np.ndarray
    lo: np.ndarray  # min
    hi: np.ndarray  # max
    clipped: np.ndarray  # draws at the cap (per averaged step)
    averaged: np.ndarray  # steps a row averages (1: the statistics of one batch)
    cap: float | None
    term_mean: np.ndarray | None = None  # mean of the draws below the cap (TRL)
    statistics: list[str] = field(default_factory=list)
    half: float = 0.5  # half the rounding of a logged value: 0.5 for token counts; 0 for seconds (densities)

    @classmethod
    def from_frame(cls, summ: pl.DataFrame, name: str, n_col: str, cap: float | None,
                   metric_names: dict[str, str]) -> LengthSummaries:
        df = summ.filter(pl.col(f"{name}_mean").is_not_null() & pl.col(n_col).is_not_null() & (pl.col(n_col) >= 1))

        def col(c: str, default: float = np.nan) -> np.ndarray:
            return df[c].fill_null(default).cast(pl.Float64).to_numpy() if c in df.columns else np.full(df.height, default)

        n = col(n_col)
        mean = col(f"{name}_mean")
        lo = np.where(np.isfinite(col(f"{name}_min")), col(f"{name}_min"), np.nan)
        hi = np.where(np.isfinite(col(f"{name}_max")), col(f"{name}_max"), np.nan)
        clip = col(f"{name}_clip_ratio", 0.0) * n if cap is not None else np.zeros(df.height)
        term = col("terminated_mean") if name == "response" and "terminated_mean" in df.columns else None
        stats_used = [metric_names[c] for c in (f"{name}_mean", f"{name}_min", f"{name}_max", f"{name}_clip_ratio")
                      if c in df.columns and df[c].null_count() < df.height and c in metric_names]
        if term is not None and np.isfinite(term).any():
            stats_used.append(metric_names.get("terminated_mean", "terminated_mean"))
        else:
            term = None
        return cls(name, df["step"].to_numpy(), n, mean, lo, hi, clip, col("averaged_steps", 1.0), cap, term, stats_used)


def _t(v: np.ndarray, mu: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(v, 1e-9)) - mu


class _Rows:
    """The rows of a :class:`LengthSummaries` split by how they enter the likelihood."""

    def __init__(self, d: LengthSummaries) -> None:
        self.d = d
        h = d.half
        self.floor = 0.5 if h > 0 else 1e-9  # the smallest value a length can round from
        ok = np.isfinite(d.mean) & (d.n >= 1) & (d.mean > 0)
        one = d.averaged <= 1
        ext = ok & np.isfinite(d.lo) & np.isfinite(d.hi)
        # the extremes of a handful of draws say little, and leave a middle window too narrow to solve a level in
        enough = d.n >= MIN_EXTREME_N
        self.exact = ext & one & enough  # one batch's min and max
        self.maxonly = ok & one & ~np.isfinite(d.lo) & np.isfinite(d.hi) & enough  # its max alone
        self.avg = ext & ~one  # means of per-step extremes
        self.plain = ok & ~self.exact & ~self.maxonly & ~self.avg  # a mean only
        cap = d.cap if d.cap is not None else math.inf
        self.cap = cap
        c = np.rint(np.where(self.exact, d.clipped, 0.0))
        self.c = np.minimum(c, np.maximum(d.n - 1, 0))
        self.cut = self.exact & (self.c >= 1)
        # the window and mean of the draws between the extremes (one batch's rows); the whole range otherwise
        lo_known = self.exact
        k = d.n - np.where(lo_known, 1, 0) - np.where(self.cut, self.c, 1)
        tot = (d.n * d.mean - np.where(lo_known, np.nan_to_num(d.lo), 0.0)
               - np.where(self.cut, self.c * np.where(np.isfinite(cap), cap, 0.0), np.nan_to_num(d.hi)))
        mid_ok = (self.exact | self.maxonly) & (k >= 1) & (tot > 0)
        self.target = np.where(mid_ok, tot / np.maximum(k, 1), d.mean)
        self.k = np.where(mid_ok, k, d.n * np.maximum(d.averaged, 1))
        self.win_lo = np.where(mid_ok & lo_known, np.maximum(d.lo - h, self.floor), self.floor)
        self.win_hi = np.where(mid_ok, np.where(self.cut, cap - h, d.hi + h), math.inf)
        self.mid = mid_ok
        term = d.term_mean if d.term_mean is not None else np.full(d.mean.shape, np.nan)
        self.use_term = ~mid_ok & np.isfinite(term) & np.isfinite(cap)
        self.target = np.where(self.use_term, term, self.target)
        self.win_hi = np.where(self.use_term, cap - h, self.win_hi)


def _levels(shape: StepShape, r: _Rows, guess: np.ndarray | None = None) -> np.ndarray:
    """Each row's level: from the middle mean (exact rows), the mean below the cap (TRL's
    terminated mean), or the capped mean."""
    windowed = r.mid | r.use_term
    mean_fn: Callable[[np.ndarray], np.ndarray]
    if windowed.all():
        mean_fn = WindowMean(shape, r.win_lo, r.win_hi)
    else:
        # each row's own mean alone (both are elementwise in the rows: the same values as computing
        # both for every row and choosing)
        iw, ic = np.flatnonzero(windowed), np.flatnonzero(~windowed)
        window = WindowMean(shape, r.win_lo[iw], r.win_hi[iw])
        cap = r.cap if np.isfinite(r.cap) else None

        def mean_fn(mu: np.ndarray) -> np.ndarray:
            out = np.empty(mu.shape)
            out[iw] = window(mu[iw])
            out[ic] = capped_mean(shape, mu[ic], cap)
            return out

    return solve_levels(shape, r.target, r.win_lo, np.where(np.isfinite(r.win_hi), r.win_hi, r.target * 1e3),
                        mean_fn=mean_fn, guess=guess)


def extreme_parts(shape: StepShape, mu: np.ndarray, cap: float) -> tuple[Parts, np.ndarray]:
    """:func:`_extreme_moments`' terms at fixed levels before the weights: the quadrature grid's
    :class:`Parts` and lengths."""
    t = shape.grid(2001)
    return shape.parts(t), np.minimum(np.exp(mu[:, None] + t[None, :]), cap)


def _extreme_moments(shape: StepShape, mu: np.ndarray, n: np.ndarray, cap: float,
                     parts: tuple[Parts, np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """(E, Var) of the min and of the capped max of ``n`` draws at levels ``mu``, by quadrature
    (``parts``: :func:`extreme_parts`)."""
    grid, x = extreme_parts(shape, mu, cap) if parts is None else parts
    f = shape.mix(grid)[0]
    g_max = f[None, :] ** n[:, None]
    g_min = 1.0 - (1.0 - f[None, :]) ** n[:, None]
    out = []
    for g in (g_min, g_max):
        w = np.diff(g, axis=1, prepend=0.0)
        w[:, -1] += 1.0 - g[:, -1]
        e = np.sum(w * x, axis=1)
        out += [e, np.maximum(np.sum(w * x * x, axis=1) - e * e, 1e-12)]
    return tuple(out)


class RowParts(NamedTuple):
    """:func:`loglik_rows`' terms at a fixed scale and fixed levels, before the contamination
    weights: the weights' optimisation (:func:`fit_levels`) computes them once per round."""

    t: np.ndarray  # the endpoints of the rows with one batch's extremes, de-levelled
    ends: Parts | None
    extremes: tuple[Parts, np.ndarray] | None  # rows averaging several steps' extremes
    cap: Parts | None  # ... and their cap


def row_parts(shape: StepShape, r: _Rows, mu: np.ndarray) -> RowParts:
    d = r.d
    h = d.half
    # every endpoint at once: min -+ h, max -+ h, the top of the middle, the cap
    lo = np.where(r.exact, d.lo, r.floor)
    top = np.where(r.cut, r.cap - h, d.hi - h)
    cap = np.full(d.n.shape, r.cap - h if np.isfinite(r.cap) else np.inf)
    t = _t(np.stack([lo - h, lo + h, d.hi - h, d.hi + h, top, cap]), mu)
    ends = shape.parts(t, density=h <= 0) if (r.exact | r.maxonly).any() else None
    extremes = cap_parts = None
    if r.avg.any():
        idx = np.flatnonzero(r.avg)
        extremes = extreme_parts(shape, mu[idx], r.cap)
        cap_parts = shape.parts(_t(np.full(idx.size, r.cap - h), mu[idx]))
    return RowParts(t, ends, extremes, cap_parts)


def loglik_rows(shape: StepShape, r: _Rows, mu: np.ndarray, parts: RowParts | None = None) -> np.ndarray:
    """Each row's log-likelihood of its extremes (and clip count) given the levels (module text;
    ``parts``: :func:`row_parts` at the same scale and levels). Token counts are integers (an
    extreme's probability is the mass within half a token of it); seconds (``half = 0``) enter by
    their density."""
    d = r.d
    n = d.n
    h = d.half
    ll = np.zeros(n.size)
    one = r.exact | r.maxonly
    p = row_parts(shape, r, mu) if parts is None else parts
    if one.any():
        lo = np.where(r.exact, d.lo, r.floor)
        t = p.t
        c, s = shape.mix(p.ends)

        def mass(i: int, j: int) -> np.ndarray:
            return np.maximum(np.where(t[i] > 0, s[i] - s[j], c[j] - c[i]), 0.0) + 1e-300

        if h > 0:
            lp_lo, lp_hi = np.log(mass(0, 1)), np.log(mass(2, 3))
        else:  # densities in x: pdf(t) / x
            dens = shape.mix_pdf(p.ends)
            lp_lo = np.log(dens[0] + 1e-300) - np.log(np.maximum(lo, 1e-300))
            lp_hi = np.log(dens[2] + 1e-300) - np.log(np.maximum(d.hi, 1e-300))
        mid = np.log(mass(1, 4))
        both = np.log(n) + np.log(np.maximum(n - 1, 1)) + lp_lo + lp_hi + (n - 2) * mid
        if np.isfinite(r.cap):
            cut = (special.gammaln(n + 1) - special.gammaln(r.c + 1) - special.gammaln(np.maximum(n - r.c, 1))
                   + r.c * np.log(s[5] + 1e-300) + lp_lo + (n - r.c - 1) * mid)
            both = np.where(r.cut, cut, both)
        both = np.where(d.lo >= d.hi, n * lp_lo, both)  # every draw the same length
        top_only = np.log(n) + lp_hi + (n - 1) * np.log(np.maximum(c[2], 1e-300))
        ll = np.where(r.exact, both, np.where(r.maxonly, top_only, ll))
    if r.avg.any():
        idx = np.flatnonzero(r.avg)
        e_lo, v_lo, e_hi, v_hi = _extreme_moments(shape, mu[idx], n[idx], r.cap, p.extremes)
        a = d.averaged[idx]
        z_lo = (d.lo[idx] - e_lo) ** 2 / (v_lo / a)
        z_hi = (d.hi[idx] - e_hi) ** 2 / (v_hi / a)
        part = -0.5 * (z_lo + z_hi + np.log(v_lo / a) + np.log(v_hi / a))
        if np.isfinite(r.cap):
            trials = n[idx] * a
            k = d.clipped[idx] * a
            q = np.clip(shape.mix(p.cap)[1], 1e-300, 1 - 1e-16)
            part = part + k * np.log(q) + (trials - k) * np.log1p(-q)
        ll[idx] = part
    return ll


def _alike(mask: np.ndarray) -> bool | None:
    """The value every element of ``mask`` holds, or None when they differ."""
    if mask.all():
        return True
    return False if not mask.any() else None


class RowsLoglik:
    """:func:`loglik_rows` at a fixed scale and levels (``parts``: :func:`row_parts`) as a function
    of the shape's weights alone, bit for bit: what the weights do not move (the rows' masks, the
    combinatorial constants, which side of the median each endpoint is) is computed once, for the
    optimiser that moves only the weights (:func:`fit_levels`, Nelder-Mead: ~25 evaluations a round).
    Rows averaging several steps' extremes are :func:`loglik_rows`' own."""

    def __init__(self, r: _Rows, mu: np.ndarray, parts: RowParts) -> None:
        self.r, self.mu, self.parts = r, mu, parts
        d = r.d
        n = d.n
        self.one = bool((r.exact | r.maxonly).any()) and not r.avg.any()
        if not self.one:
            return
        self.pos = parts.t > 0
        self.k_both = np.log(n) + np.log(np.maximum(n - 1, 1))
        self.k_cut = (special.gammaln(n + 1) - special.gammaln(r.c + 1) - special.gammaln(np.maximum(n - r.c, 1))
                      if np.isfinite(r.cap) else None)
        self.log_n = np.log(n)
        if d.half <= 0:
            self.log_lo = np.log(np.maximum(np.where(r.exact, d.lo, r.floor), 1e-300))
            self.log_hi = np.log(np.maximum(d.hi, 1e-300))
        # a choice every row makes alike is made once (np.where with a uniform condition is one of
        # its two arrays, bit for bit): which side of the median an endpoint is, rows with a cut,
        # with every draw the same length, with a max alone
        self.side = [_alike(v) for v in self.pos]
        self.n2, self.n_under = n - 2, n - r.c - 1
        self.any_cut = self.k_cut is not None and bool(r.cut.any())
        self.same = d.lo >= d.hi
        self.any_same, self.any_maxonly = bool(self.same.any()), bool(r.maxonly.any())
        self.zeros = np.zeros(n.size)

    def __call__(self, shape: StepShape) -> np.ndarray:
        r, p = self.r, self.parts
        if not self.one:
            return loglik_rows(shape, r, self.mu, p)
        d = r.d
        n = d.n
        pos, side = self.pos, self.side
        c, s = shape.mix(p.ends)

        def mass(i: int, j: int) -> np.ndarray:
            if side[i] is None:
                return np.maximum(np.where(pos[i], s[i] - s[j], c[j] - c[i]), 0.0) + 1e-300
            return np.maximum(s[i] - s[j] if side[i] else c[j] - c[i], 0.0) + 1e-300

        if d.half > 0:
            lp_lo, lp_hi = np.log(mass(0, 1)), np.log(mass(2, 3))
        else:
            dens = shape.mix_pdf(p.ends)
            lp_lo = np.log(dens[0] + 1e-300) - self.log_lo
            lp_hi = np.log(dens[2] + 1e-300) - self.log_hi
        mid = np.log(mass(1, 4))
        both = self.k_both + lp_lo + lp_hi + self.n2 * mid
        if self.any_cut:
            cut = self.k_cut + r.c * np.log(s[5] + 1e-300) + lp_lo + self.n_under * mid
            both = np.where(r.cut, cut, both)
        if self.any_same:
            both = np.where(self.same, n * lp_lo, both)
        if not self.any_maxonly:
            return np.where(r.exact, both, self.zeros)
        top_only = self.log_n + lp_hi + (n - 1) * np.log(np.maximum(c[2], 1e-300))
        return np.where(r.exact, both, np.where(r.maxonly, top_only, self.zeros))


def weight_terms(shape: StepShape, r: _Rows, parts: RowParts) -> tuple[np.ndarray, ...] | None:
    """The rows' log-likelihood as ``sum coef log(B + eps_lo P + eps_hi Q)`` plus what the weights do
    not move: each probability in :func:`loglik_rows` is the body's, the lower and the upper
    contamination's, mixed by the weights, so at fixed scale and levels the likelihood is a sum of
    logarithms of affine functions of ``(eps_lo, eps_hi)`` -- concave, one maximum, and Newton's
    method finds it (:func:`max_weights`). ``(coef, B, P, Q)``; None for rows that average several
    steps' extremes (their normal terms are not of this form)."""
    if r.avg.any() or parts.ends is None:
        return None
    d = r.d
    n = d.n
    t = parts.t
    comps = []
    for w in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0)):  # the body, the lower, the upper contamination alone
        sh = replace(shape, eps_lo=w[0], eps_hi=w[1])
        c, sv = sh.mix(parts.ends)
        mass = [np.where(t[i] > 0, sv[i] - sv[j], c[j] - c[i]) for i, j in ((0, 1), (2, 3), (1, 4))]
        if d.half > 0:
            lo_p, hi_p = mass[0], mass[1]
        else:
            dens = sh.mix_pdf(parts.ends)
            lo_p, hi_p = dens[0], dens[2]
        comps.append((lo_p, hi_p, mass[2], sv[5], c[2]))
    cut = r.cut if np.isfinite(r.cap) else np.zeros(n.size, bool)
    same = d.lo >= d.hi
    plain = r.exact & ~cut & ~same
    # per term: (rows, coefficient, which probability: lo, hi, mid, above the cap, below the max)
    spec = [(plain, np.ones(n.size), 0), (plain, np.ones(n.size), 1), (plain, n - 2, 2),
            (r.exact & cut & ~same, r.c, 3), (r.exact & cut & ~same, np.ones(n.size), 0),
            (r.exact & cut & ~same, n - r.c - 1, 2), (r.exact & same, n, 0),
            (r.maxonly, np.ones(n.size), 1), (r.maxonly, n - 1, 4)]
    coef, parts_b, parts_l, parts_h = [], [], [], []
    for rows, k, which in spec:
        use = rows & (k > 0)
        if not use.any():
            continue
        coef.append(k[use])
        b, lo_, hi_ = (comp[which][use] for comp in comps)
        parts_b.append(b)
        parts_l.append(lo_ - b)
        parts_h.append(hi_ - b)
    if not coef:
        return None
    return tuple(np.concatenate(x) for x in (coef, parts_b, parts_l, parts_h))


def max_weights(terms: tuple[np.ndarray, ...], start: np.ndarray, tol: float = 1e-10) -> np.ndarray:
    """``log (eps_lo, eps_hi)`` maximising ``sum coef log(B + e1 P + e2 Q)`` on the box
    :data:`LOG_EPS` (exponentiated): projected Newton from ``start`` with a backtracking line search;
    the function is concave, so the maximum it stops at is the box's."""
    coef, b, p, q = terms
    lo, hi = math.exp(LOG_EPS[0]), math.exp(LOG_EPS[1])
    e = np.clip(np.exp(np.asarray(start, dtype=float)), lo, hi)

    def value(x: np.ndarray) -> float:
        return float((coef * np.log(np.maximum(b + x[0] * p + x[1] * q, 0.0) + 1e-300)).sum())

    f = value(e)
    for _ in range(100):
        m = np.maximum(b + e[0] * p + e[1] * q, 1e-300)
        wp, wq = coef * p / m, coef * q / m
        g = np.array([wp.sum(), wq.sum()])
        pq = (wp * q / m).sum()
        hess = -np.array([[(wp * p / m).sum(), pq], [pq, (wq * q / m).sum()]])
        # a bound the gradient pushes against holds its variable; Newton on the others
        free = ~(((e <= lo) & (g < 0)) | ((e >= hi) & (g > 0)))
        if not free.any():
            break
        step = np.zeros(2)
        hf = hess[np.ix_(free, free)] - 1e-12 * np.eye(int(free.sum()))
        try:
            step[free] = -np.linalg.solve(hf, g[free])
        except np.linalg.LinAlgError:
            step[free] = g[free]
        if float(g @ step) <= 0:  # not an ascent direction (numerically flat): the gradient's
            step = np.where(free, g, 0.0)
        a = 1.0
        while a > 1e-12:
            x = np.clip(e + a * step, lo, hi)
            fx = value(x)
            if fx >= f:
                break
            a *= 0.5
        else:
            break
        done = np.max(np.abs(x - e) / np.maximum(e, lo)) < tol
        e, f = x, fx
        if done:
            break
    return np.log(e)


@dataclass
class LevelFit:
    """Per-step distributions of one length variable: a shared shape, a level per step."""

    shape: StepShape
    steps: np.ndarray
    mu: np.ndarray
    mu_var: np.ndarray
    loglik: float
    data: LengthSummaries
    upper: float
    spread_se: float = 0.0  # standard error of log s (profile likelihood)

    def marginal(self, level: float, integer: bool = True, lower: float = 1.0) -> EmpiricalTailFit:
        """The shape at ``level`` as the generator's marginal (:func:`shape_marginal`)."""
        n = int(np.sum(self.data.n * np.maximum(self.data.averaged, 1)))
        return shape_marginal(self.shape, level, self.upper, self.data.cap, max(n, 1), int(np.sum(self.data.clipped)),
                              integer, lower, self.spread_se)

    def step_quantiles(self, probs: np.ndarray) -> np.ndarray:
        """``[steps, probs]``: each fitted step's length quantiles (cut at the cap)."""
        t = self.shape.ppf(np.asarray(probs, dtype=float))
        q = np.exp(self.mu[:, None] + t[None, :])
        return np.minimum(q, self.data.cap) if self.data.cap is not None else q

    def expected_extremes(self) -> tuple[np.ndarray, np.ndarray]:
        """Each step's expected min and (capped) max of its ``n`` draws."""
        e_lo, _, e_hi, _ = _extreme_moments(self.shape, self.mu, self.data.n,
                                            self.data.cap if self.data.cap is not None else math.inf)
        return e_lo, e_hi

    def body(self) -> dict[str, Any]:
        """The fitted shape's parameters, as the spec records them."""
        sh = self.shape
        out = {"family": SCIPY_NAME[sh.family], "log_scale": sh.s, "eps_low": sh.eps_lo, "eps_high": sh.eps_hi,
               "low_span": sh.lam_lo, "high_span": sh.lam_hi, "loglik": self.loglik}
        if sh.family == "glogistic":
            out["skew"] = sh.skew
        return out


def shape_marginal(shape: StepShape, level: float, upper: float, cap: float | None, n: int, n_censored: int,
                   integer: bool = True, lower: float = 1.0, spread_se: float = 0.0) -> EmpiricalTailFit:
    """A shape at ``level`` as the generator's marginal: its quantile function on knots dense in both
    tails (where the contamination lives), the cap as its censoring point."""
    p = special.expit(np.linspace(-KNOT_LOGITS, KNOT_LOGITS, N_KNOTS - 2))
    levels = np.concatenate([[0.0], p, [1.0]])
    t = shape.ppf(levels)
    t[0] = min(t[0], math.log(max(lower, 1e-9)) - level)
    t[-1] = max(t[-1], math.log(upper) - level)
    knots = np.minimum(np.exp(level + t), upper)
    return EmpiricalTailFit([float(v) for v in knots], 0.0, 0.0, 1.0, float(upper), cap, 0.0, n, n_censored, integer, lower,
                            levels=[float(v) for v in levels], spread_se=spread_se)


def _upper(d: LengthSummaries) -> float:
    if d.cap is not None:
        return UPPER_OVER_CAP * d.cap
    hi = d.hi[np.isfinite(d.hi)]
    return UPPER_OVER_MAX * float(hi.max()) if hi.size else UPPER_OVER_MAX * float(np.nanmax(d.mean)) * 10


def _level_var(shape: StepShape, r: _Rows, mu: np.ndarray, design: float) -> np.ndarray:
    """Sampling variance of each level: the variance of the mean it was solved from, through the
    level's derivative (numerical)."""
    hi = np.where(np.isfinite(r.win_hi), r.win_hi, r.cap if np.isfinite(r.cap) else np.inf)
    var = mid_var(shape, mu, r.win_lo, hi)
    h = 1e-3
    m_up, m_dn = mid_mean(shape, mu + h, r.win_lo, hi), mid_mean(shape, mu - h, r.win_lo, hi)
    slope = (m_up - m_dn) / (2 * h)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = var * design / np.maximum(r.k, 1) / slope**2
    return np.where(np.isfinite(v) & (v > 0), v, np.nan)


def _shared_level(shape: StepShape, r: _Rows) -> np.ndarray:
    """One level for every row (a variable that does not drift, as prompts drawn from a dataset):
    the level whose capped mean is the rows' pooled mean."""
    d = r.d
    w = d.n * np.maximum(d.averaged, 1)
    target = np.array([float(np.sum(w * d.mean) / np.sum(w))])
    cap = r.cap if np.isfinite(r.cap) else None
    mu = solve_levels(shape, target, np.array([r.floor]), np.array([float(np.nanmax(d.mean)) * 1e3]),
                      mean_fn=lambda m: capped_mean(shape, m, cap))
    return np.full(d.n.size, float(mu[0]))


def mean_parts(shape: StepShape, r: _Rows, mu: np.ndarray) -> tuple[tuple[ExpParts, Parts | None], WindowParts]:
    """:func:`mean_terms`' terms at a fixed scale and levels, before the weights."""
    hi = np.full(mu.shape, r.cap - r.d.half if np.isfinite(r.cap) else np.inf)
    return (capped_parts(shape, mu, r.cap if np.isfinite(r.cap) else None),
            window_parts(shape, mu, np.full(mu.shape, r.floor), hi, var=True))


def mean_terms(shape: StepShape, r: _Rows, mu: np.ndarray,
               parts: tuple[tuple[ExpParts, Parts | None], WindowParts] | None = None) -> np.ndarray:
    """Log-likelihood of each row's mean around the shared level's: normal with variance
    ``Var / n`` (the step means of a variable that does not drift scatter by sampling alone, so
    their spread says how wide the variable is; ``parts``: :func:`mean_parts`)."""
    d = r.d
    capped, window = mean_parts(shape, r, mu) if parts is None else parts
    e = capped_mean(shape, mu, r.cap if np.isfinite(r.cap) else None, capped)
    v = window_var(shape, mu, window) / np.maximum(d.n * np.maximum(d.averaged, 1), 1)
    ok = np.isfinite(v) & (v > 0) & np.isfinite(e)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = -0.5 * ((d.mean - e) ** 2 / v + np.log(2 * math.pi * v))
    return np.where(ok, out, 0.0)


class MeanLoglik:
    """:func:`mean_terms` at a fixed scale and levels (``parts``: :func:`mean_parts`) as a function
    of the shape's weights alone, bit for bit (:class:`RowsLoglik`'s companion for a shared level)."""

    def __init__(self, r: _Rows, mu: np.ndarray, parts: tuple[tuple[ExpParts, Parts | None], WindowParts]) -> None:
        d = r.d
        self.r, self.parts = r, parts
        with np.errstate(over="ignore"):
            self.exp_mu, self.exp_2mu = np.exp(mu), np.exp(2 * mu)
        self.per = np.maximum(d.n * np.maximum(d.averaged, 1), 1)
        # the window's lower end above the median: StepShape.mass's choice, made once when alike
        self.above = _alike(parts[1].a > 0)

    def __call__(self, shape: StepShape) -> np.ndarray:
        (e_parts, cap_parts), w = self.parts
        d = self.r.d
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            e = self.exp_mu * shape.mix_exp(e_parts)
            if cap_parts is not None:
                e = e + self.r.cap * shape.mix(cap_parts)[1]
            if self.above is None:
                m = shape.mass(w.a, w.b, w.mass)
            else:
                c, s = shape.mix(w.mass)
                m = np.maximum(s[0] - s[1] if self.above else c[1] - c[0], 0.0)
            e1 = shape.mix_exp(w.e1) / m
            e2 = shape.mix_exp(w.e2) / m
            v = np.maximum(self.exp_2mu * (e2 - e1 * e1), 0.0) / self.per
            ok = np.isfinite(v) & (v > 0) & np.isfinite(e)
            out = -0.5 * ((d.mean - e) ** 2 / v + np.log(2 * math.pi * v))
        return np.where(ok, out, 0.0)


class OnBox:
    """``f`` of the weights clipped to the box :data:`LOG_EPS`, each clipped point evaluated once:
    Nelder-Mead's simplex wanders beyond the box, where the clip maps its points onto ones already
    evaluated (about half of the evaluations on the demo runs); ``f`` is a function of the clipped
    point alone, so its remembered value is the one it would compute again."""

    def __init__(self, f: Callable[[np.ndarray], float]) -> None:
        self.f = f
        self.seen: dict[tuple[float, float], float] = {}

    def __call__(self, x: np.ndarray) -> float:
        c = np.clip(x, *LOG_EPS)
        key = (float(c[0]), float(c[1]))
        if key not in self.seen:
            self.seen[key] = self.f(c)
        return self.seen[key]


def fit_levels(d: LengthSummaries, family: str = FAMILY, within: float = 0.0, per_prompt: int = 1,
               shared: bool = False, skew: float = 1.0) -> LevelFit:
    """The shared shape and each step's level of one length variable (see the module text);
    ``shared``: one level for every step (a variable that does not drift), the step means then
    entering the likelihood (:func:`mean_terms`).

    The scale ``s`` is profiled on a grid (then refined between the best point's neighbours); at
    each ``s`` the contamination weights maximise the likelihood with the levels held, then the
    levels are solved again."""
    fit, spread = _fit_levels(d, family, within, per_prompt, shared, skew)
    return spread(fit)


def _fit_levels(d: LengthSummaries, family: str, within: float, per_prompt: int, shared: bool,
                skew: float) -> tuple[LevelFit, Callable[[LevelFit], LevelFit]]:
    """:func:`fit_levels` without its last part, the spread's standard error (two more profile
    points), returned as a function that adds it: :func:`fit_body` adds it to the body it keeps only."""
    r = _Rows(d)
    use = r.exact | r.maxonly | r.avg | r.plain
    if not use.any():
        raise ValueError(f"no step has a {d.name} length mean and a sample count")
    mbar = float(np.exp(np.mean(np.log(np.maximum(d.mean[use], 1.0)))))
    upper = _upper(d)
    lam_lo = max(math.log(max(mbar, 1.0)), 0.5)
    lam_hi = max(math.log(upper) - math.log(max(mbar, 1.0)), 0.5)
    informative = (r.exact | r.maxonly | r.avg).any() or (shared and d.n.size > 1)

    def make(s: float, le: np.ndarray) -> StepShape:
        return StepShape(family, s, math.exp(le[0]), math.exp(le[1]), lam_lo, lam_hi, skew)

    def levels(sh: StepShape, mu: np.ndarray | None) -> np.ndarray:
        return _shared_level(sh, r) if shared else _levels(sh, r, mu)

    def total(sh: StepShape, mu: np.ndarray, parts: tuple[RowParts, Any] | None = None) -> float:
        rows, means = (None, None) if parts is None else parts
        ll = float(loglik_rows(sh, r, mu, rows).sum())
        return ll + float(mean_terms(sh, r, mu, means).sum()) if shared else ll

    def at(s: float, le: np.ndarray, mu: np.ndarray | None) -> tuple[float, np.ndarray, np.ndarray]:
        for _ in range(2):
            sh = make(s, le)
            mu = levels(sh, mu)
            if not informative:
                break
            # the weights move nothing but the weights: what the scale and the levels fix is computed once
            parts = (row_parts(sh, r, mu), mean_parts(sh, r, mu) if shared else None)
            terms = None if shared else weight_terms(sh, r, parts[0])
            if terms is not None:
                le = max_weights(terms, le)
                continue

            rows, means = RowsLoglik(r, mu, parts[0]), MeanLoglik(r, mu, parts[1]) if shared else None

            def neg(c: np.ndarray, rows: RowsLoglik = rows, means: MeanLoglik | None = means) -> float:
                sh = make(s, c)
                ll = float(rows(sh).sum())
                return -(ll + float(means(sh).sum()) if means is not None else ll)

            res = optimize.minimize(OnBox(neg), le, method="Nelder-Mead", options={"xatol": 0.05, "fatol": 1e-3, "maxiter": 60})
            le = np.clip(res.x, *LOG_EPS)
        mu = levels(make(s, le), mu)
        return total(make(s, le), mu), le, mu

    start = np.full(2, math.log(EPS_START))
    if not informative:
        # a mean alone says nothing of the spread: the shape stays at the grid's middle scale
        s = S_GRID[len(S_GRID) // 2]
        ll, le, mu = at(s, start, None)
    else:
        results = []
        le, mu = start, None
        for s in S_GRID:
            ll, le, mu = at(s, le, mu)
            results.append((ll, s, le, mu))
        i = int(np.argmax([x[0] for x in results]))
        ll, s, le, mu = results[i]
        lo_s, hi_s = S_GRID[max(i - 1, 0)], S_GRID[min(i + 1, len(S_GRID) - 1)]
        cache: dict[float, tuple[float, np.ndarray, np.ndarray]] = {}

        def neg_s(ls: float) -> float:
            cache[ls] = at(math.exp(ls), le, mu)
            return -cache[ls][0]

        ref = optimize.minimize_scalar(neg_s, bounds=(math.log(lo_s), math.log(hi_s)), method="bounded",
                                       options={"xatol": 0.02})
        if ref.x in cache and cache[ref.x][0] > ll:
            ll, le, mu = cache[ref.x]
            s = math.exp(ref.x)
    shape = make(s, le)
    design = 1.0 + max(per_prompt - 1, 0) * within
    out = LevelFit(shape, d.steps, mu, _level_var(shape, r, mu, design), ll, d, upper)

    def spread(fit: LevelFit) -> LevelFit:
        if informative:
            # how well the summaries know the spread: the profile likelihood's curvature in log s
            h = SPREAD_STEP
            lp, lm = at(s * math.exp(h), le, mu)[0], at(s * math.exp(-h), le, mu)[0]
            curv = (lp - 2 * ll + lm) / (h * h)
            fit.spread_se = min(1.0 / math.sqrt(-curv), MAX_SPREAD_SE) if curv < 0 else MAX_SPREAD_SE
        return fit

    return out, spread


def heavy_flags(fit: LevelFit) -> np.ndarray:
    """Per fitted step whether its longest response is a runaway: beyond the 99% quantile of the
    longest of its ``n`` draws from the body and the lower contamination alone (a step with
    responses at the cap: when those would reach it with under 1% probability) -- the per-sample
    fit's rule for heavy steps (:func:`analyses.fit.empirical.heavy_steps`) on the logged max."""
    sh = fit.shape
    if sh.eps_hi <= 0:
        return np.zeros(fit.steps.size, bool)
    quiet = replace(sh, eps_lo=sh.eps_lo / (1 - sh.eps_hi), eps_hi=0.0)
    r = _Rows(fit.data)
    top = np.where(r.cut, r.cap, fit.data.hi)
    with np.errstate(invalid="ignore"):
        p_reach = -np.expm1(fit.data.n * np.log(np.maximum(quiet.cdf(_t(top - 0.5, fit.mu)), 1e-300)))
    return r.exact & np.isfinite(top) & (p_reach < 1.0 - HEAVY_QUANTILE)


def heavy_entry(fit: LevelFit, level: float, flags: np.ndarray) -> dict[str, Any]:
    """The heavy-step fields of the generator's marginal (:class:`~analyses.fit.empirical.EmpiricalTailFit`)
    when some fitted steps carry runaways: the marginal is the body and the lower contamination; a
    heavy step (probability ``(h + 1/2) / (m + 1)``, persistent as the fitted steps' flags say)
    draws its top ``1 - cut_level`` share from the upper contamination above the body's reach
    (``extremes``). ``cut_level`` keeps the run's expected number of runaways."""
    sh = fit.shape
    n_bar = float(np.mean(fit.data.n))
    quiet = replace(sh, eps_lo=sh.eps_lo / (1 - sh.eps_hi), eps_hi=0.0)
    t_top = float(quiet.ppf(np.array([HEAVY_QUANTILE ** (1.0 / max(n_bar, 1.0))]))[0])
    t_top = min(max(t_top, 0.0), sh.lam_hi)
    share_above = (sh.lam_hi - t_top) / sh.lam_hi
    expected = float(np.sum(fit.data.n)) * sh.eps_hi * share_above
    h = int(flags.sum())
    r = float(np.clip(expected / max(h, 1) / n_bar, 1.0 / n_bar, 0.05))
    ext = np.exp(level + np.linspace(t_top, sh.lam_hi, MAX_EXTREMES))
    return {"extremes": [float(v) for v in ext], "cut_level": 1.0 - r, "heavy_prob": (h + 0.5) / (flags.size + 1),
            "heavy_persistence": heavy_chain(flags), "heavy_last": bool(flags[-1]), "last_step": int(fit.steps[-1])}


def dispersion(fit: LevelFit) -> float:
    """How much more the step means of a shared-level fit scatter than its shape says they should:
    their variance over the shape's ``Var / n`` (1: as sampling alone would)."""
    r = _Rows(fit.data)
    if fit.data.n.size < 3:
        return 1.0
    d = fit.data
    hi = np.full(fit.mu.shape, r.cap - d.half if np.isfinite(r.cap) else fit.upper)
    v = mid_var(fit.shape, fit.mu, np.full(fit.mu.shape, r.floor), hi) / np.maximum(d.n * np.maximum(d.averaged, 1), 1)
    obs = float(np.var(d.mean, ddof=1))
    model = float(np.mean(v))
    return obs / model if model > 0 and np.isfinite(model) else 1.0


def widened(fit: LevelFit) -> LevelFit:
    """A shared-level fit whose step means scatter more than its shape allows, with the body's
    scale raised until they do not: the variable's variance is what a step's sum depends on, and min, mean and max
    cannot tell a two-cluster variable (a video run's prompts: 30% near 1,060 tokens, 70% near
    4,000) from one cluster, while the scatter of the step means says how wide it is."""
    m = fit.data.n.size
    ratio = dispersion(fit)
    if m < 3 or ratio <= 1.0:
        return fit
    sh = fit.shape
    r = _Rows(fit.data)

    def at(log_s: float) -> LevelFit:
        shape = replace(sh, s=math.exp(log_s))
        mu = _shared_level(shape, r)
        return LevelFit(shape, fit.steps, mu, fit.mu_var, fit.loglik, fit.data, fit.upper)

    lo, hi = math.log(sh.s), math.log(max(S_GRID[-1], sh.s * 2))
    if dispersion(at(hi)) > 1.0:
        return at(hi)
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if dispersion(at(mid)) > 1.0 else (lo, mid)
    return at(hi)


def fit_body(d: LengthSummaries, within: float = 0.0, per_prompt: int = 1, multi_turn: bool = False) -> LevelFit:
    """:func:`fit_levels` with the body chosen among :data:`BODIES` (``multi_turn``:
    :data:`AGENT_BODIES`): the least skewed whose likelihood is within :data:`FAMILY_MARGIN` of the
    best, so a skew is taken only as far as the summaries ask for it. With the two ends this is
    "the log-logistic unless the Weibull is favoured by more than the margin"."""
    fits = [_fit_levels(d, fam, within, per_prompt, False, a) for fam, a in (AGENT_BODIES if multi_turn else BODIES)]
    best = max(f.loglik for f, _ in fits)
    fit, spread = next((f, sp) for f, sp in fits if f.loglik >= best - FAMILY_MARGIN)
    return spread(fit)  # the spread of the body kept: the others' is never read


RUNAWAY_MODES = ("heavy", "iid", "none")


def runaway_variant(w: dict[str, Any], mode: str) -> dict[str, Any]:
    """A fitted workload's runaways (its upper contamination) as ``heavy`` steps (as fitted), as
    draws of ``iid`` every step alike (the whole fitted mixture), or ``none`` at all -- without
    fitting again: the marginal's ``body`` records the whole shape."""
    if mode not in RUNAWAY_MODES:
        raise ValueError(f"runaways must be one of {RUNAWAY_MODES}, got {mode!r}")
    v = w["variables"]["response_tokens"]
    if mode == "heavy" or v.get("fitted_from") != "summaries":
        return w
    if mode == "none":
        r = {**v, "heavy_prob": 0.0}
    else:
        m = shape_marginal(shape_of(v), float(w["drift"]["reference_log_scale"]), float(v["upper"]), v.get("censor_at"),
                           int(v["n"]), int(v.get("n_censored") or 0), bool(v.get("integer", True)),
                           float(v.get("lower", 1.0)), float(v.get("spread_se") or 0.0))
        r = {**{k: x for k, x in v.items() if k in KEPT_ON_VARIANT}, **m.to_dict()}
    return {**w, "variables": {**w["variables"], "response_tokens": r}}


KEPT_ON_VARIANT = ("fitted_from", "statistics", "body", "scipy_fallback")


def drift_of(fit: LevelFit) -> tuple[DriftModel, dict[int, float]]:
    """The step-level model of the fitted levels (latent: no attenuation by the cap)."""
    return drift_from_levels(fit.steps, fit.mu, fit.mu_var, 1.0)


def marginal_entry(fit: LevelFit, level: float, statistics: list[str], integer: bool = True,
                   heavy: bool | None = None, lower: float = 1.0) -> dict[str, Any]:
    """The spec variable of a fitted length: the generator's marginal, what it came from.
    ``heavy`` (responses): the marginal is the body and the lower contamination, and the upper
    contamination's runaways come as heavy steps (:func:`heavy_entry`; ``False``: no runaways at
    all); ``None`` (prompts): the whole mixture, every draw alike."""
    if heavy is None:
        d = fit.marginal(level, integer=integer, lower=lower).to_dict()
    else:
        sh = fit.shape
        quiet = LevelFit(replace(sh, eps_lo=sh.eps_lo / (1 - sh.eps_hi), eps_hi=0.0),
                         fit.steps, fit.mu, fit.mu_var, fit.loglik, fit.data, fit.upper, fit.spread_se)
        d = quiet.marginal(level, integer=integer, lower=lower).to_dict()
        if heavy and sh.eps_hi > 0:
            d.update(heavy_entry(fit, level, heavy_flags(fit)))
    d["fitted_from"] = "summaries"
    d["statistics"] = list(statistics)
    d["body"] = json_safe(fit.body())
    d["scipy_fallback"] = scipy_body(fit, level, integer, lower)
    return d


def scipy_body(fit: LevelFit, level: float, integer: bool = True, lower: float = 1.0) -> dict[str, Any]:
    """The body as the plain scipy family it is (``fisk`` c = 1/s, ``weibull_min`` c = 1/s, ``burr12``
    c = 1/s and d = the skew, ``lognorm`` s; scale e^level), for consumers that read scipy marginals
    (PolyTrace's parameter file)."""
    sh = fit.shape
    fam = SCIPY_NAME[sh.family]
    shape_params, names = ([sh.s], ["s"]) if fam == "lognorm" else ([1.0 / sh.s], ["c"])
    if fam == "burr12":
        shape_params, names = [1.0 / sh.s, sh.skew], ["c", "d"]
    return {"kind": "continuous", "family": fam, "params": [*shape_params, 0.0, math.exp(level)],
            "param_names": [*names, "loc", "scale"], "censor_at": fit.data.cap,
            "n": max(int(np.sum(fit.data.n * np.maximum(fit.data.averaged, 1))), 1), "n_censored": int(np.sum(fit.data.clipped)),
            "integer": integer, "lower": lower, "gof": {}, "candidates": []}


# summary column -> the canonical metric it is read from (what a spec says it used)
SPELLINGS: dict[str, str] = {
    "response_mean": "response_length/mean", "response_min": "response_length/min", "response_max": "response_length/max",
    "response_clip_ratio": "response_length/clip_ratio", "terminated_mean": "completions/mean_terminated_length",
    "prompt_mean": "prompt_length/mean", "prompt_min": "prompt_length/min", "prompt_max": "prompt_length/max",
    "prompt_clip_ratio": "prompt_length/clip_ratio", "total_tokens": "perf/total_num_tokens",
    "seqlen_min": "global_seqlen/min", "seqlen_max": "global_seqlen/max", "seqlen_mean": "global_seqlen/mean",
    "turns_mean": "num_turns/mean", "turns_min": "num_turns/min", "turns_max": "num_turns/max",
    "tool_time_mean": "timing_s/agent_loop/tool_calls/mean", "tool_time_min": "timing_s/agent_loop/tool_calls/min",
    "tool_time_max": "timing_s/agent_loop/tool_calls/max",
}


def summary_cap(summ: pl.DataFrame, declared: float | None) -> float | None:
    """The response cap: the run's (declared or inferred at ingest), else the longest response of
    a step with responses at the cap."""
    if declared is not None and declared > 0:
        return float(declared)
    cut = summ.filter(pl.col("response_clip_ratio").fill_null(0.0) > 0)["response_max"].drop_nulls()
    return float(cut.max()) if cut.len() else None


def _prompt_variable(summ: pl.DataFrame, per_prompt: int) -> tuple[dict[str, Any] | None, LevelFit | None]:
    """Prompt lengths from their summaries (over prompts: verl repeats a prompt per response),
    or a constant at the mean a token count implies (TRL), or None when the logs hold neither;
    with the fit when there is one."""
    rows = summ.filter(pl.col("prompt_mean").is_not_null())
    if rows.height:
        lo, hi = rows["prompt_min"].drop_nulls(), rows["prompt_max"].drop_nulls()
        if lo.len() and hi.len() and float(lo.min()) == float(hi.max()):
            v = float(lo.min())
            return {"kind": "categorical", "values": [v], "probs": [1.0], "n": int(rows["n"].sum()),
                    "fitted_from": "summaries", "statistics": ["prompt_length/min", "prompt_length/max"]}, None
        prompts = rows.with_columns(n_p=pl.coalesce(pl.col("n_prompts"), pl.col("n") / float(per_prompt)))
        # no prompt cap known: the sampler cuts a marginal at twice its largest value, so the fit does too
        cap = UPPER_OVER_MAX * float(hi.max()) if hi.len() else None
        d = LengthSummaries.from_frame(prompts, "prompt", "n_p", cap, SPELLINGS)
        fit = widened(fit_levels(d, shared=True))
        return marginal_entry(fit, float(np.mean(fit.mu)), d.statistics), fit
    implied = summ.select(p=pl.col("total_tokens") / pl.col("n") - pl.col("response_mean"))["p"].drop_nulls()
    implied = implied.filter(implied > 0)
    if implied.len():
        return {"kind": "categorical", "values": [float(round(implied.mean()))], "probs": [1.0],
                "n": int(summ["n"].drop_nulls().sum()), "fitted_from": "summaries",
                "statistics": ["perf/cumulative_num_tokens", "response_length/mean"]}, None
    return None, None


def turns_variable(summ: pl.DataFrame) -> dict[str, Any] | None:
    """Assistant turns per trajectory: ``1 + Binomial(t_max - t_min, p)`` on the logged range (the
    fewest and most turns of any step: the loop's own bounds), ``p`` from the steps' pooled mean --
    every turn after the first is one more decision to call a tool. A mean with its support is all
    the summaries say; at n >= 100 trajectories a step's min and max are the support's ends."""
    rows = summ.filter(pl.col("turns_mean").is_not_null())
    if rows.height == 0:
        return None
    lo = int(rows["turns_min"].drop_nulls().min() or 1)
    hi = int(rows["turns_max"].drop_nulls().max() or max(lo, round(float(rows["turns_mean"].max()))))
    lo, hi = max(lo, 1), max(hi, lo)
    w = rows["n"].fill_null(1.0).to_numpy()
    mean = float(np.sum(w * rows["turns_mean"].to_numpy()) / np.sum(w))
    support = list(range(lo, hi + 1))
    if hi == lo:
        pmf = [1.0]
        p = 0.0
    else:
        p = float(np.clip((mean - lo) / (hi - lo), 0.0, 1.0))
        pmf = [float(v) for v in stats.binom.pmf(np.arange(hi - lo + 1), hi - lo, p)]
    return {"kind": "discrete", "method": "binomial", "support": support, "pmf": pmf, "params": {"p": p, "shift": lo},
            "shift": lo, "n": int(np.sum(w)), "aic": None, "fitted_from": "summaries",
            "statistics": ["num_turns/mean", "num_turns/min", "num_turns/max"]}


def tool_variable(summ: pl.DataFrame) -> tuple[dict[str, Any], DriftModel] | None:
    """One tool whose calls (one per turn but the last) take the seconds the logged per-trajectory
    tool time implies: each step's mean per call (tool time mean / (turns mean - 1)) sets its
    level, and the longest trajectory's tool time, taken as the longest call of the step's calls
    (an upper bound: it can only widen the fit), its spread; with the level model of the calls'
    latency (a tool server's latency moves with its load: the per-sample fit's ``tool_latency_drift``)."""
    rows = summ.filter(pl.col("tool_time_mean").is_not_null() & pl.col("turns_mean").is_not_null()
                       & (pl.col("turns_mean") > 1.0) & (pl.col("tool_time_mean") > 0))
    if rows.height == 0:
        return None
    calls = rows.select("step", n=pl.col("n") * (pl.col("turns_mean") - 1.0), averaged_steps="averaged_steps",
                        call_mean=pl.col("tool_time_mean") / (pl.col("turns_mean") - 1.0), call_max="tool_time_max")
    d = LengthSummaries("call", calls["step"].to_numpy(), calls["n"].to_numpy(), calls["call_mean"].to_numpy(),
                        np.full(calls.height, np.nan), calls["call_max"].fill_null(np.nan).to_numpy(),
                        np.zeros(calls.height), calls["averaged_steps"].fill_null(1.0).to_numpy(), None,
                        statistics=["timing_s/agent_loop/tool_calls/mean", "timing_s/agent_loop/tool_calls/max",
                                    "num_turns/mean"], half=0.0)
    fit = fit_levels(d)
    drift, _ = drift_of(fit)
    lat = marginal_entry(fit, drift.reference, d.statistics, integer=False, lower=0.0)
    n = int(round(float(calls["n"].sum())))
    return {"tool": {"share": 1.0, "n": max(n, 1), "latency_s": lat, "failure_rate": 0.0, "failure_statuses": {}}}, drift


WITHIN_PRIOR = (1.0, 3.0)  # Beta prior of the within-group correlation: mean DEFAULT_WITHIN, nearly flat
WITHIN_GRID = np.linspace(0.0, 0.95, 96)


def within_from_seqlen(summ: pl.DataFrame, resp: LevelFit, prompt: LevelFit | None, per_prompt: int) -> float | None:
    """The within-group correlation of response lengths from verl's ``global_seqlen``: each of the
    ``R`` ranks sums ``G / R`` whole prompt groups, ``k`` prompt copies and ``k`` responses each, so a
    rank's sum has variance ``G/R (k^2 Var(prompt) + k Var(response) (1 + (k - 1) rho))`` and the
    logged min and max are the extremes of ``R`` such (normal) sums around their mean. The posterior
    mean of ``rho`` under :data:`WITHIN_PRIOR` on a grid (the prior's mean where the ranks' spread is
    all prompts, as on a video run); None without ``global_seqlen``."""
    rows = summ.filter(pl.col("seqlen_min").is_not_null() & pl.col("seqlen_max").is_not_null()
                       & (pl.col("seqlen_ranks").fill_null(0) >= 2) & pl.col("step").is_in(resp.steps.tolist()))
    if rows.height == 0 or per_prompt < 2:
        return None
    idx = np.searchsorted(resp.steps, rows["step"].to_numpy())
    cap = resp.data.cap
    hi = np.full(idx.size, cap - 0.5 if cap is not None else resp.upper)
    vx = mid_var(resp.shape, resp.mu[idx], np.full(idx.size, 0.5), hi)
    vp = 0.0
    if prompt is not None:
        pcap = prompt.data.cap if prompt.data.cap is not None else prompt.upper
        vp = float(mid_var(prompt.shape, prompt.mu[:1], np.array([0.5]), np.array([pcap]))[0])
    R = rows["seqlen_ranks"].to_numpy()
    G = rows["n"].to_numpy() / per_prompt
    mean = rows["seqlen_mean"].fill_null(np.nan).to_numpy()
    mean = np.where(np.isfinite(mean), mean, (rows["seqlen_min"] + rows["seqlen_max"]).to_numpy() / 2)
    lo, top = rows["seqlen_min"].to_numpy(), rows["seqlen_max"].to_numpy()
    k = float(per_prompt)
    V = (G / R)[None, :] * (k * k * vp + k * vx[None, :] * (1 + (k - 1) * WITHIN_GRID[:, None]))
    sd = np.sqrt(np.maximum(V, 1e-12))
    a, b = (lo - mean) / sd, (top - mean) / sd
    ll = (stats.norm.logpdf(a) + stats.norm.logpdf(b) - 2 * np.log(sd)
          + (R - 2) * np.log(np.maximum(stats.norm.cdf(b) - stats.norm.cdf(a), 1e-300))).sum(axis=1)
    ll = np.where(np.isfinite(ll), ll, -np.inf)
    if not np.isfinite(ll).any():
        return None
    post = np.exp(ll - ll.max()) * stats.beta.pdf(WITHIN_GRID / 0.95, *WITHIN_PRIOR)
    return float(np.sum(post * WITHIN_GRID) / np.sum(post))


def statistics_used(variables: dict[str, Any], n_sources: list[str], within_source: str) -> list[str]:
    """Every logged metric the workload was fitted from."""
    used = {s for v in variables.values() for s in v.get("statistics", [])}
    used |= {s for t in (variables.get("tools") or {}).values() for s in (t.get("latency_s") or {}).get("statistics", [])}
    if "tokens" in n_sources:
        used.add("perf/total_num_tokens")
    if within_source == "global_seqlen":
        used |= {"global_seqlen/min", "global_seqlen/max", "global_seqlen/mean"}
    return sorted(used)


def fit_workload_from_summaries(
    summ: pl.DataFrame,
    *,
    run_id: str = "run",
    task: str | None = None,
    max_response_length: float | None = None,
    samples_per_prompt: int | None = None,
    within: float | None = None,
) -> dict[str, Any]:
    """The spec entry for one run from its per-step summaries (the same layout as
    :func:`analyses.fit.workload.fit_workload`'s, with ``source.kind = "summaries"``).

    ``samples_per_prompt``: the rollout n (config); unknown, each prompt is taken to have one
    response (said in ``source.assumed``). ``within``: the within-group correlation of response
    lengths; unknown, :data:`DEFAULT_WITHIN`."""
    summ = conform_summaries(summ).filter(pl.col("response_mean").is_not_null())
    if summ.height == 0:
        raise ValueError(f"{run_id}: no step with a response-length mean")
    if summ["n"].drop_nulls().len() == 0:
        raise ValueError(f"{run_id}: the batch's sample count is not in the logs (no config dump with the train batch "
                         "size, no token count with prompt lengths); set train_batch_size and rollout_n in run.toml")
    summ = summ.filter(pl.col("n").is_not_null())
    cap = summary_cap(summ, max_response_length)
    assumed: list[str] = []
    k = int(samples_per_prompt) if samples_per_prompt else 1
    if not samples_per_prompt:
        assumed.append("samples_per_prompt")
    resp = LengthSummaries.from_frame(summ, "response", "n", cap, SPELLINGS)
    rho = within if within is not None else (DEFAULT_WITHIN if k > 1 else 0.0)
    turns = turns_variable(summ)
    multi = turns is not None and max(turns["support"]) > 1
    fit = fit_body(resp, within=rho, per_prompt=k, multi_turn=multi)
    prompt, prompt_fit = _prompt_variable(summ, k)
    within_source = "given" if within is not None else "none" if k == 1 else "assumed"
    if within is None and k > 1:
        est = within_from_seqlen(summ, fit, prompt_fit, k)
        if est is not None:
            rho, within_source = est, "global_seqlen"
            fit.mu_var = _level_var(fit.shape, _Rows(fit.data), fit.mu, 1.0 + (k - 1) * rho)
        else:
            assumed.append("within_group_corr")
    drift, _ = drift_of(fit)
    variables: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if prompt is not None:
        variables["prompt_tokens"] = prompt
    rvar = marginal_entry(fit, drift.reference, resp.statistics, heavy=True)
    variables["response_tokens"] = rvar
    if multi:
        variables["n_turns"] = turns
        # a call per turn but the last: the tool-calling turns the loop logged
        variables["n_tool_calls"] = {**turns, "support": [v - 1 for v in turns["support"]], "shift": turns["shift"] - 1,
                                     "params": {**turns["params"], "shift": turns["shift"] - 1}}
        tools = tool_variable(summ)
        if tools is not None:
            variables["tools"], lat_drift = tools
            extra["tool_latency_drift"] = lat_drift.to_dict()
    n = summ["n"].to_numpy()
    N = int(round(float(np.median(n))))
    G = max(int(round(N / k)), 1)
    ranks = summ["seqlen_ranks"].drop_nulls()
    R = int(ranks.mode().sort()[-1]) if ranks.len() else 1
    R = max(min(R, G), 1)
    steps = [int(v) for v in summ["step"]]
    batch = {"prompts_per_step": G, "samples_per_prompt": k, "dp_ranks": list(range(R)), "rank_of_dp": list(range(R)),
             "tp_size": 1, "has_ranks": R > 1, "first_step": steps[0], "last_step": steps[-1], "n_steps": len(steps),
             "multi_turn": multi}
    if multi:
        # the logs give each trajectory's whole response, not how its turns and tool results split it
        batch["trajectory_response"] = "marginal"
    copula = {"type": "gaussian_copula", "within_group_corr": float(rho), "prompt_response_corr": 0.0, "n": int(np.sum(n))}
    n_sources = sorted({str(v) for v in summ["n_source"].drop_nulls()})
    return json_safe({
        "run_id": run_id,
        "task": task or "unknown",
        "n_samples": int(np.sum(n)),
        "steps_fitted": steps,
        "batch": batch,
        "variables": variables,
        "joint": {"selected": "gaussian_copula", "gaussian_copula": copula},
        "drift": drift.to_dict(),
        **extra,
        "source": {"kind": "summaries", "n_source": n_sources[0] if len(n_sources) == 1 else n_sources,
                   "statistics": statistics_used(variables, n_sources, within_source),
                   "within_group_corr": within_source, "assumed": assumed},
    })


CHECK_PROBS = (0.01, 0.5, 0.99)


def shape_of(variable: dict[str, Any]) -> StepShape:
    """The fitted shape a spec variable fitted from summaries records (its ``body``)."""
    b = variable["body"]
    family = next(k for k, v in SCIPY_NAME.items() if v == b["family"])
    return StepShape(family, float(b["log_scale"]), float(b["eps_low"]), float(b["eps_high"]), float(b["low_span"]),
                     float(b["high_span"]), float(b.get("skew", 1.0)))


def summary_check(w: dict[str, Any], summ: pl.DataFrame) -> pl.DataFrame:
    """Each fitted step's response lengths as the fit from summaries has them beside what the step
    logged: its 1% / 50% / 99% quantiles, its mean, and the expected shortest and longest of the
    step's ``n`` responses against the logged min, mean and max (the run_workload asset and the
    report show it). Empty for a workload fitted from samples."""
    v = w["variables"]["response_tokens"]
    if v.get("fitted_from") != "summaries" or "body" not in v:
        return pl.DataFrame()
    shape = shape_of(v)
    levels = {int(x["step"]): float(x["level"]) for x in w["drift"].get("windows") or []}
    rows = summ.filter(pl.col("step").is_in(list(levels)) & pl.col("n").is_not_null()).sort("step")
    if rows.height == 0:
        return pl.DataFrame()
    mu = np.array([levels[int(k)] for k in rows["step"]])
    cap = v.get("censor_at")
    q = np.exp(mu[:, None] + shape.ppf(np.array(CHECK_PROBS))[None, :])
    if cap is not None:
        q = np.minimum(q, cap)
    e_lo, _, e_hi, _ = _extreme_moments(shape, mu, rows["n"].to_numpy(), cap if cap is not None else math.inf)
    out = rows.select("step", "n", logged_min="response_min", logged_mean="response_mean", logged_max="response_max",
                      logged_clip_ratio="response_clip_ratio")
    return out.with_columns(
        fitted_p01=pl.Series(q[:, 0]), fitted_p50=pl.Series(q[:, 1]), fitted_p99=pl.Series(q[:, 2]),
        fitted_mean=pl.Series(capped_mean(shape, mu, cap)), expected_min=pl.Series(e_lo), expected_max=pl.Series(e_hi),
    )
