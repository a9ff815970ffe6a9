"""A k-component lognormal mixture, right-censored, fitted by EM in log space.

RL response lengths are often multi-modal (short direct answers and long reasoning chains,
or answers plus a rare run-away mode that hits the cap); a single family fitted by AIC then
gets either the body or the tail wrong. The mixture is one more candidate in the AIC race, with
a scipy-like frozen interface (cdf, ppf, logpdf, logsf) so the rest of the code treats it like
any scipy family. Parameters: ``[w_1..w_k, mu_1..mu_k, sigma_1..sigma_k]`` (mu, sigma of log x).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

MIN_SIGMA = 1e-3


class LogNormalMixture:
    def __init__(self, params: list[float] | np.ndarray):
        p = np.asarray(params, dtype=float)
        k = p.size // 3
        self.w = p[:k] / p[:k].sum()
        self.mu = p[k : 2 * k]
        self.sigma = np.maximum(p[2 * k :], MIN_SIGMA)
        self._grid: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def params(self) -> list[float]:
        return [*self.w.tolist(), *self.mu.tolist(), *self.sigma.tolist()]

    def _z(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            y = np.log(np.asarray(x, dtype=float))
        return (y[..., None] - self.mu) / self.sigma

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        z = self._z(x)
        with np.errstate(divide="ignore"):
            lc = np.log(self.w) - np.log(self.sigma) - 0.5 * z * z - 0.5 * math.log(2 * math.pi)
            return special.logsumexp(lc, axis=-1) - np.log(x)

    def pdf(self, x: np.ndarray) -> np.ndarray:
        return np.exp(self.logpdf(x))

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return np.sum(self.w * special.ndtr(self._z(x)), axis=-1)

    def sf(self, x: np.ndarray) -> np.ndarray:
        return np.sum(self.w * special.ndtr(-self._z(x)), axis=-1)

    def logsf(self, x: np.ndarray) -> np.ndarray:
        z = self._z(x)
        with np.errstate(divide="ignore"):
            return special.logsumexp(np.log(self.w) + special.log_ndtr(-z), axis=-1)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF by interpolation on a fine log grid (monotone, exact to ~1e-6 in u)."""
        if self._grid is None:
            lo = float(np.min(self.mu - 9 * self.sigma))
            hi = float(np.max(self.mu + 9 * self.sigma))
            y = np.linspace(lo, hi, 20001)
            c = np.sum(self.w * special.ndtr((y[:, None] - self.mu) / self.sigma), axis=1)
            c, idx = np.unique(c, return_index=True)
            self._grid = (c, y[idx])
        c, y = self._grid
        return np.exp(np.interp(np.asarray(u, dtype=float), c, y))

    def isf(self, q: np.ndarray) -> np.ndarray:
        return self.ppf(1 - np.asarray(q, dtype=float))


def fit_lnmix(vals: np.ndarray, w: np.ndarray, cvals: np.ndarray, cw: np.ndarray, k: int, seed: int = 0, iters: int = 300) -> tuple[LogNormalMixture, float]:
    """EM on weighted distinct values ``vals`` (counts ``w``) and right-censored points ``cvals``
    (counts ``cw``). Returns the mixture and its negative log-likelihood."""
    y = np.log(vals)
    yc = np.log(cvals) if cvals.size else np.zeros(0)
    n = w.sum() + cw.sum()
    # initialise at weighted quantiles of the uncensored log values
    order = np.argsort(y)
    cum = np.cumsum(w[order]) / w.sum()
    qs = (np.arange(k) + 0.5) / k
    mu = y[order][np.minimum(np.searchsorted(cum, qs), y.size - 1)].astype(float)
    sd = np.full(k, max(float(np.sqrt(np.average((y - np.average(y, weights=w)) ** 2, weights=w))) / k, 0.05))
    pi = np.full(k, 1 / k)
    prev = -np.inf
    ll = -np.inf
    for _ in range(iters):
        z = (y[:, None] - mu) / sd
        lp = np.log(pi) - np.log(sd) - 0.5 * z * z - 0.5 * math.log(2 * math.pi)
        ly = special.logsumexp(lp, axis=1)
        r = np.exp(lp - ly[:, None]) * w[:, None]
        ll = float(np.sum(w * (ly - y)))  # density of x = density of log x / x
        s0, s1, s2 = r.sum(0), (r * y[:, None]).sum(0), (r * y[:, None] ** 2).sum(0)
        if yc.size:
            a = (yc[:, None] - mu) / sd
            lq = np.log(pi) + special.log_ndtr(-a)
            lyc = special.logsumexp(lq, axis=1)
            rc = np.exp(lq - lyc[:, None]) * cw[:, None]
            ll += float(np.sum(cw * lyc))
            lam = np.exp(special.log_ndtr(a) * 0 + _log_phi(a) - special.log_ndtr(-a))  # inverse Mills ratio
            ey = mu + sd * lam
            vy = sd**2 * (1 + a * lam - lam**2)
            s0 = s0 + rc.sum(0)
            s1 = s1 + (rc * ey).sum(0)
            s2 = s2 + (rc * (vy + ey**2)).sum(0)
        pi = np.maximum(s0 / n, 1e-12)
        mu = s1 / np.maximum(s0, 1e-12)
        sd = np.sqrt(np.maximum(s2 / np.maximum(s0, 1e-12) - mu**2, MIN_SIGMA**2))
        if ll - prev < 1e-9 * abs(ll):
            break
        prev = ll
    m = LogNormalMixture([*pi, *mu, *sd])
    return m, -ll


def _log_phi(a: np.ndarray) -> np.ndarray:
    return -0.5 * a * a - 0.5 * math.log(2 * math.pi)
