"""A step's length distribution as its summaries see it: a body shared by every step of the run
(a location-scale family on log length; each step its own location), plus two thin contamination
components for the extremes that are not part of the body.

Why this shape. Per step a framework prints the mean, min and max of the lengths (and the share
at the cap). The min and max of ``n`` lengths are extreme order statistics: under a body
``F`` alone their likelihood is ``n f F^(n-1)`` and ``n f (1-F)^(n-1)``, which pins the body's
spread. But real extremes are often not the body's: DAPO's shortest answer is 2 tokens against a
1% quantile of 6, verl-video's longest is a 16,000-token runaway at the cap against a p99 of 315.
So the model is a mixture in ``t = log(length) - mu_k`` (``mu_k`` the step's level):

* **body** ``(1 - eps_lo - eps_hi) * G((t) / s)``: ``G`` a standard ``logistic`` (the body is a
  log-logistic, scipy's ``fisk``), ``normal`` (lognormal) or ``gumbel_min`` (Weibull) law, or the
  ``glogistic`` between the first and the last: ``G(z) = 1 - (1 + e^z)^-a``, skewed to the left on
  the log axis by ``a`` (``skew``; 1: the logistic, towards the Gumbel-min as ``a`` grows; scipy's
  ``burr12`` with ``c = 1/s``, ``d = a``); ``s`` its scale on the log axis, shared by every step;
* **lower contamination** ``eps_lo``: uniform in ``t`` on ``[-lam_lo, 0]`` -- log-uniform lengths
  from 1 token up to the step's level (a 2-token answer);
* **upper contamination** ``eps_hi``: uniform in ``t`` on ``[0, lam_hi]`` -- log-uniform from the
  level up to ``e`` times the cap (a repetition loop; its part beyond the cap is cut there, the
  runaways *at* the cap), or up to twice the longest length logged when no cap is known.

A step's min and max then may belong to the body or to a contamination component, as the
likelihood says; an extreme that no body explains does not pull the body's spread.

Everything here is on plain numpy arrays; the fit over a run's steps is
:mod:`analyses.fit.summary_fit`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from scipy import special

FAMILIES = ("logistic", "normal", "gumbel_min", "glogistic")
SCIPY_NAME = {"logistic": "fisk", "normal": "lognorm", "gumbel_min": "weibull_min", "glogistic": "burr12"}
_GRID = 4001  # points of the body's partial-expectation table
_TAIL = 1e-13  # the body's table spans its quantiles [_TAIL, 1 - _TAIL]


def std_cdf(family: str, z: np.ndarray, a: float = 1.0) -> np.ndarray:
    if family == "logistic":
        return special.expit(z)
    if family == "normal":
        return special.ndtr(z)
    if family == "gumbel_min":
        return -np.expm1(-np.exp(np.minimum(z, 700.0)))
    if family == "glogistic":
        return -np.expm1(-a * np.logaddexp(0.0, z))
    raise ValueError(f"unknown family {family!r}")


def std_sf(family: str, z: np.ndarray, a: float = 1.0) -> np.ndarray:
    if family == "logistic":
        return special.expit(-z)
    if family == "normal":
        return special.ndtr(-z)
    if family == "gumbel_min":
        return np.exp(-np.exp(np.minimum(z, 700.0)))
    if family == "glogistic":
        return np.exp(-a * np.logaddexp(0.0, z))
    raise ValueError(f"unknown family {family!r}")


def std_cdf_sf(family: str, z: np.ndarray, a: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`std_cdf`, :func:`std_sf`) at ``z``, bit for bit, sharing what the two compute alike."""
    if family == "gumbel_min":
        e = np.exp(np.minimum(z, 700.0))
        return -np.expm1(-e), np.exp(-e)
    if family == "glogistic":
        la = -a * np.logaddexp(0.0, z)
        return -np.expm1(la), np.exp(la)
    return std_cdf(family, z, a), std_sf(family, z, a)


def std_pdf(family: str, z: np.ndarray, a: float = 1.0) -> np.ndarray:
    if family == "logistic":
        e = special.expit(z)
        return e * (1.0 - e)
    if family == "normal":
        return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if family == "gumbel_min":
        ez = np.exp(np.minimum(z, 700.0))
        return ez * np.exp(-ez)
    if family == "glogistic":
        return a * special.expit(z) * np.exp(-a * np.logaddexp(0.0, z))
    raise ValueError(f"unknown family {family!r}")


def std_ppf(family: str, p: np.ndarray, a: float = 1.0) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if family == "logistic":
        return special.logit(p)
    if family == "normal":
        return special.ndtri(p)
    if family == "gumbel_min":
        return np.log(-np.log1p(-p))
    if family == "glogistic":
        with np.errstate(divide="ignore"):
            return np.log(np.expm1(-np.log1p(-p) / a))
    raise ValueError(f"unknown family {family!r}")


class Parts(NamedTuple):
    """A shape's terms at fixed points before its weights (:meth:`StepShape.parts`): the body's
    standard CDF and survival, each contamination's share below (``u``) and above (``v = 1 - u``)
    the points, and optionally the body's standard density with the contaminations' supports."""

    key: tuple[str, float, float, float, float]
    cdf: np.ndarray
    sf: np.ndarray
    u_lo: np.ndarray
    v_lo: np.ndarray
    u_hi: np.ndarray
    v_hi: np.ndarray
    pdf: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


class ExpParts(NamedTuple):
    """:meth:`StepShape.partial_exp`'s terms before the weights: the body's, and per contamination
    (where its support meets the interval, the integral of e^(power t) over the meeting)."""

    key: tuple[str, float, float, float, float]
    power: int
    body: np.ndarray
    lo: tuple[np.ndarray, np.ndarray]
    hi: tuple[np.ndarray, np.ndarray]


@dataclass
class StepShape:
    """The de-levelled law of ``t = log(length) - mu`` (see the module text)."""

    family: str
    s: float  # the body's scale on the log axis
    eps_lo: float
    eps_hi: float
    lam_lo: float  # the lower contamination spans t in [-lam_lo, 0]
    lam_hi: float  # the upper one t in [0, lam_hi]
    skew: float = 1.0  # the glogistic's a (other families: 1)

    def __post_init__(self) -> None:
        self._z, self._pe = body_table(self.family, self.s, self.skew)

    @property
    def w_body(self) -> float:
        return 1.0 - self.eps_lo - self.eps_hi

    def parts(self, t: np.ndarray, density: bool = False) -> Parts:
        """What the CDF, survival (and ``density``) at ``t`` are made of before the weights: a fit
        that moves only ``eps_lo`` / ``eps_hi`` computes these once (:meth:`cdf_sf` takes them)."""
        t = np.asarray(t, dtype=float)
        z = t / self.s
        u_lo = np.minimum(np.maximum((t + self.lam_lo) / self.lam_lo, 0.0), 1.0)
        u_hi = np.minimum(np.maximum(t / self.lam_hi, 0.0), 1.0)
        pdf = None
        if density:
            pdf = (std_pdf(self.family, z, self.skew), (t >= -self.lam_lo) & (t <= 0), (t >= 0) & (t <= self.lam_hi))
        return Parts(self.body_key, std_cdf(self.family, z, self.skew), std_sf(self.family, z, self.skew), u_lo, 1.0 - u_lo, u_hi,
                     1.0 - u_hi, pdf)

    @property
    def body_key(self) -> tuple[str, float, float, float, float]:
        """What :class:`Parts` depend on: every parameter but the weights."""
        return (self.family, self.s, self.lam_lo, self.lam_hi, self.skew)

    def _check(self, key: tuple[str, float, float, float, float]) -> None:
        if key != self.body_key:
            raise ValueError(f"parts of {key} used for a shape {self.body_key}")

    def cdf_sf(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(CDF, survival) at ``t``, each accurate in its own tail."""
        return self.mix(self.parts(t))

    def mix(self, p: Parts) -> tuple[np.ndarray, np.ndarray]:
        """(CDF, survival) from :meth:`parts` (of a shape that differs from this one at most in its weights)."""
        self._check(p.key)
        c, s = self.w_body * p.cdf, self.w_body * p.sf
        if self.eps_lo > 0:
            c, s = c + self.eps_lo * p.u_lo, s + self.eps_lo * p.v_lo
        if self.eps_hi > 0:
            c, s = c + self.eps_hi * p.u_hi, s + self.eps_hi * p.v_hi
        return c, s

    def cdf(self, t: np.ndarray) -> np.ndarray:
        return self.cdf_sf(t)[0]

    def sf(self, t: np.ndarray) -> np.ndarray:
        return self.cdf_sf(t)[1]

    def pdf(self, t: np.ndarray) -> np.ndarray:
        """Density in ``t``."""
        return self.mix_pdf(self.parts(t, density=True))

    def mix_pdf(self, p: Parts) -> np.ndarray:
        """The density from :meth:`parts` with ``density``."""
        self._check(p.key)
        if p.pdf is None:
            raise ValueError("parts without the density")
        body, in_lo, in_hi = p.pdf
        out = self.w_body * body / self.s
        if self.eps_lo > 0:
            out = out + np.where(in_lo, self.eps_lo / self.lam_lo, 0.0)
        if self.eps_hi > 0:
            out = out + np.where(in_hi, self.eps_hi / self.lam_hi, 0.0)
        return out

    def mass(self, a: np.ndarray, b: np.ndarray, parts: Parts | None = None) -> np.ndarray:
        """P(a < t <= b), accurate in both tails (survival differences above the median);
        ``parts``: :meth:`parts` of ``np.stack([a, b])``."""
        a = np.asarray(a, dtype=float)
        if parts is None:
            a, b = np.broadcast_arrays(a, np.asarray(b, dtype=float))
            parts = self.parts(np.stack([a, b]))
        c, s = self.mix(parts)
        return np.maximum(np.where(a > 0, s[0] - s[1], c[1] - c[0]), 0.0)  # where broadcasts a as the parts are

    def exp_parts(self, a: np.ndarray, b: np.ndarray, power: int = 1) -> ExpParts:
        """:meth:`partial_exp`'s terms before the weights."""
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        za, zb = np.clip(a / self.s, self._z[0], self._z[-1]), np.clip(b / self.s, self._z[0], self._z[-1])
        pe = self._pe[power - 1]
        terms = []
        for lo, hi in ((np.maximum(a, -self.lam_lo), np.minimum(b, 0.0)), (np.maximum(a, 0.0), np.minimum(b, self.lam_hi))):
            terms.append((hi > lo, np.exp(power * hi) - np.exp(power * lo)))
        return ExpParts(self.body_key, power, np.interp(zb, self._z, pe) - np.interp(za, self._z, pe), terms[0], terms[1])

    def partial_exp(self, a: np.ndarray, b: np.ndarray, power: int = 1) -> np.ndarray:
        """E[e^(power t); a < t <= b] (``power`` 1 or 2; ``a < b`` elementwise; infinite ends allowed)."""
        return self.mix_exp(self.exp_parts(a, b, power))

    def mix_exp(self, p: ExpParts) -> np.ndarray:
        """:meth:`partial_exp` from :meth:`exp_parts`."""
        self._check(p.key)
        out = self.w_body * p.body
        for eps, lam, (inside, span) in ((self.eps_lo, self.lam_lo, p.lo), (self.eps_hi, self.lam_hi, p.hi)):
            if eps > 0:
                out = out + np.where(inside, eps / lam / p.power * span, 0.0)
        return out

    def ppf(self, p: np.ndarray) -> np.ndarray:
        """Quantiles in ``t`` (numerical inversion of the mixture's CDF on a fine grid)."""
        p = np.asarray(p, dtype=float)
        t = self.grid()
        return np.interp(p, self.cdf(t), t)

    def grid(self, points: int = 20001) -> np.ndarray:
        """A grid in ``t`` dense over the body and spanning the contamination."""
        z = std_ppf(self.family, np.array([1e-12, 1 - 1e-12]), self.skew) * self.s
        lo = min(float(z[0]), -self.lam_lo if self.eps_lo > 0 else float(z[0]))
        hi = max(float(z[1]), self.lam_hi if self.eps_hi > 0 else float(z[1]))
        body = np.linspace(float(z[0]), float(z[1]), points // 2)
        return np.unique(np.concatenate([body, np.linspace(lo, hi, points - body.size)]))


@lru_cache(maxsize=512)
def body_table(family: str, s: float, a: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(z grid, cumulative integrals of e^(p s z) g(z) dz for p = 1, 2): the body's partial
    expectations of e^t and e^(2t), built once per (family, scale)."""
    lo, hi = std_ppf(family, np.array([_TAIL, 1 - _TAIL]), a)
    z = np.linspace(float(lo), float(hi), _GRID)
    g = std_pdf(family, z, a)
    dz = z[1] - z[0]
    out = []
    for p in (1, 2):
        w = g * np.exp(np.minimum(p * s * z, 700.0))
        out.append(np.concatenate([[0.0], np.cumsum((w[1:] + w[:-1]) * dz / 2)]))
    return z, np.stack(out)


class WindowParts(NamedTuple):
    """:func:`mid_mean` / :func:`mid_var`'s terms at fixed levels and window, before the weights."""

    a: np.ndarray
    b: np.ndarray
    mass: Parts
    e1: ExpParts
    e2: ExpParts | None


def window_parts(shape: StepShape, mu: np.ndarray, lo: np.ndarray, hi: np.ndarray, var: bool = False) -> WindowParts:
    a, b = np.log(lo) - mu, np.log(hi) - mu
    a, b = np.broadcast_arrays(a, b)
    return WindowParts(a, b, shape.parts(np.stack([a, b])), shape.exp_parts(a, b),
                       shape.exp_parts(a, b, power=2) if var else None)


def mid_mean(shape: StepShape, mu: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """E[length | lo < length <= hi] at levels ``mu`` (lengths, not logs)."""
    w = window_parts(shape, mu, lo, hi)
    m = shape.mass(w.a, w.b, w.mass)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.exp(mu) * shape.mix_exp(w.e1) / m


def mid_var(shape: StepShape, mu: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Var[length | lo < length <= hi] at levels ``mu``."""
    return window_var(shape, mu, window_parts(shape, mu, lo, hi, var=True))


def window_var(shape: StepShape, mu: np.ndarray, w: WindowParts) -> np.ndarray:
    """:func:`mid_var` from :func:`window_parts` with ``var``."""
    if w.e2 is None:
        raise ValueError("window parts without the second moment")
    m = shape.mass(w.a, w.b, w.mass)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        e1 = shape.mix_exp(w.e1) / m
        e2 = shape.mix_exp(w.e2) / m
        return np.maximum(np.exp(2 * mu) * (e2 - e1 * e1), 0.0)


def capped_parts(shape: StepShape, mu: np.ndarray, cap: float | None) -> tuple[ExpParts, Parts | None]:
    """:func:`capped_mean`'s terms at fixed levels, before the weights."""
    mu = np.asarray(mu, dtype=float)
    if cap is None or not np.isfinite(cap):
        return shape.exp_parts(np.full(np.shape(mu), -np.inf), np.full(np.shape(mu), np.inf)), None
    b = math.log(cap) - mu
    return shape.exp_parts(np.full(b.shape, -np.inf), b), shape.parts(b)


def capped_mean(shape: StepShape, mu: np.ndarray, cap: float | None,
                parts: tuple[ExpParts, Parts | None] | None = None) -> np.ndarray:
    """E[min(length, cap)] at levels ``mu`` (no cap: E[length]; ``parts``: :func:`capped_parts`)."""
    e, p = capped_parts(shape, mu, cap) if parts is None else parts
    with np.errstate(over="ignore"):
        body = np.exp(mu) * shape.mix_exp(e)
        if p is None:
            return body
        return body + cap * shape.mix(p)[1]


class WindowMean:
    """:func:`mid_mean` at fixed ``lo`` / ``hi`` as a function of the levels alone, the same
    arithmetic in the same order (bit for bit) without the intermediate :class:`Parts`: a level
    solve (:func:`solve_levels`) evaluates it a dozen times per fitted scale, and on a run's few
    dozen steps each evaluation is mostly numpy's per-call cost, so both ends of the window go
    through each elementwise operation at once (one ``[2, steps]`` array, the same values)."""

    def __init__(self, shape: StepShape, lo: np.ndarray, hi: np.ndarray) -> None:
        self.shape = shape
        self.log_lo, self.log_hi = np.log(lo), np.log(hi)
        self.log_ends = np.stack(np.broadcast_arrays(self.log_lo, self.log_hi))

    def __call__(self, mu: np.ndarray) -> np.ndarray:
        sh = self.shape
        ab = self.log_ends - mu  # [a, b]
        a, b = ab[0], ab[1]
        zab = ab / sh.s
        w = sh.w_body
        # the mass between a and b (StepShape.mass)
        cdf, sf = std_cdf_sf(sh.family, zab, sh.skew)
        c, sv = w * cdf, w * sf
        # E[e^t; a < t <= b] (StepShape.partial_exp)
        z, pe = sh._z, sh._pe[0]
        i = np.interp(np.minimum(np.maximum(zab, z[0]), z[-1]), z, pe)
        out = w * (i[1] - i[0])
        if sh.eps_lo > 0:
            u = np.minimum(np.maximum((ab + sh.lam_lo) / sh.lam_lo, 0.0), 1.0)
            c, sv = c + sh.eps_lo * u, sv + sh.eps_lo * (1.0 - u)
            lo, hi = np.maximum(a, -sh.lam_lo), np.minimum(b, 0.0)
            out = out + np.where(hi > lo, sh.eps_lo / sh.lam_lo / 1 * (np.exp(hi) - np.exp(lo)), 0.0)
        if sh.eps_hi > 0:
            u = np.minimum(np.maximum(ab / sh.lam_hi, 0.0), 1.0)
            c, sv = c + sh.eps_hi * u, sv + sh.eps_hi * (1.0 - u)
            lo, hi = np.maximum(a, 0.0), np.minimum(b, sh.lam_hi)
            out = out + np.where(hi > lo, sh.eps_hi / sh.lam_hi / 1 * (np.exp(hi) - np.exp(lo)), 0.0)
        m = np.maximum(np.where(a > 0, sv[0] - sv[1], c[1] - c[0]), 0.0)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return np.exp(mu) * out / m


def solve_levels(shape: StepShape, target: np.ndarray, lo: np.ndarray, hi: np.ndarray, tol: float = 1e-7,
                 iters: int = 80, mean_fn: Callable[[np.ndarray], np.ndarray] | None = None,
                 guess: np.ndarray | None = None) -> np.ndarray:
    """Per step the level ``mu`` whose mean between ``lo`` and ``hi`` is ``target`` (``mean_fn``:
    another mean of the level, e.g. :func:`capped_mean`; ``lo``/``hi`` then only bound the search).

    The mean rises with the level, so ``log mean - log target`` has one root in ``mu``: regula
    falsi with the Illinois rule on a bracket (a few evaluations where bisection needs dozens; a
    ``guess`` narrows the bracket); a level with no mass in the window (NaN) counts as below or
    above it by where it is."""
    target = np.asarray(target, dtype=float)
    lo = np.broadcast_to(np.asarray(lo, dtype=float), target.shape)
    hi = np.broadcast_to(np.asarray(hi, dtype=float), target.shape)
    center = 0.5 * (np.log(lo) + np.log(np.where(np.isfinite(hi), hi, lo * 1e6)))
    mean_fn = mean_fn or WindowMean(shape, lo, hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_target = np.log(target)
        return _solve(shape, target, center, mean_fn, log_target, tol, iters, guess)


def _solve(shape: StepShape, target: np.ndarray, center: np.ndarray, mean_fn: Callable[[np.ndarray], np.ndarray],
           log_target: np.ndarray, tol: float, iters: int, guess: np.ndarray | None) -> np.ndarray:
    """:func:`solve_levels`' search, under its caller's ``errstate`` (one for the whole search:
    entering one per evaluation cost as much as a tenth of the search)."""

    def g(mu: np.ndarray) -> np.ndarray:
        out = np.log(mean_fn(mu)) - log_target
        return np.where(np.isfinite(out), out, np.where(mu < center, -50.0, 50.0))

    # the bracket nearest the target that holds a root: with contamination spread over many log
    # units the mean can come back to the target far from the body (the window then sits inside a
    # contamination component alone), so the search widens from the body's own scale outwards
    center_t = np.log(np.maximum(target, 1e-9)) if guess is None else np.asarray(guess, dtype=float)
    a = b = fa = fb = None
    found = np.zeros(target.shape, bool)
    for width in (4.0 * shape.s + 0.5, 12.0 * shape.s + 2.0, 30.0 * shape.s + 12.0):
        wa, wb = center_t - width, center_t + width
        fwa, fwb = g(wa), g(wb)
        ok = ~found & (fwa < 0) & (fwb > 0)
        if a is None:
            a, b, fa, fb = wa, wb, fwa, fwb
        a, b, fa, fb = np.where(ok, wa, a), np.where(ok, wb, b), np.where(ok, fwa, fa), np.where(ok, fwb, fb)
        found |= ok
        if found.all():
            break
    x = 0.5 * (a + b)
    first, prev_left = True, None  # prev_left: the last step kept b (the Illinois rule's memory)
    for _ in range(iters):
        # the secant point where it falls strictly inside the bracket, else the midpoint (fb == fa
        # makes it infinite or NaN, which the test sends to the midpoint as well); a <= b throughout
        # (it starts so, and x and the midpoint lie between them), so min(a, b) is a and |b - a| is b - a
        mid = 0.5 * (a + b)
        x = (a * fb - b * fa) / (fb - fa)
        x = np.where(np.isfinite(x) & (x > a) & (x < b), x, mid)
        fx = g(x)
        if ((np.abs(fx) < tol) | (b - a < tol)).all():
            break
        left = np.sign(fx) == np.sign(fa)  # the root is between x and b
        # Illinois: halve the kept end's value when the same end is kept twice in a row (each end's
        # halved value is used only where this step keeps that end)
        if not first:
            fb = np.where(prev_left, fb / 2, fb)
            fa = np.where(prev_left, fa, fa / 2)
        a, fa = np.where(left, x, a), np.where(left, fx, fa)
        b, fb = np.where(left, b, x), np.where(left, fb, fx)
        first, prev_left = False, left
    if found.all():
        return x
    # no bracket holds a root (a mean no level reaches in its window, as a window too narrow for its
    # draws): the level that puts the target at the shape's median
    fallback = np.log(np.maximum(target, 1e-300)) - float(shape.ppf(np.array([0.5]))[0])
    return np.where(found, x, fallback)
