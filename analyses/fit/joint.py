"""Dependence between prompt and response lengths.

Two candidates, chosen by how well each reproduces the joint on held-out prompt groups:

* ``gaussian_copula`` -- a Gaussian copula over the fitted marginals with the GRPO group
  structure built in: every prompt has a latent "difficulty" ``z_g`` shared by its ``n``
  responses (within-group correlation ``a**2``) and correlated with the prompt-length score
  (``r``). Marginals are preserved exactly; responses of one prompt are alike, as in real runs,
  which is what drives the longest response and the per-rank load of a step.
* ``gaussian_mixture`` -- a Gaussian mixture on (log prompt, log response) per sample, the
  PolyTrace way (theirs is in raw token space; the log keeps lengths positive).

The score is a 2-D CDF distance on a grid of held-out quantiles plus the error in the
within-group correlation of log responses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special, stats

from analyses.fit.continuous import json_safe


def normal_scores(x: np.ndarray) -> np.ndarray:
    """Rank-based normal scores (ties get their average rank)."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return x
    r = stats.rankdata(x, method="average")
    return special.ndtri((r - 0.5) / x.size)


def icc_oneway(z: np.ndarray, groups: np.ndarray) -> float:
    """Intra-class correlation of ``z`` by one-way ANOVA (unequal group sizes allowed)."""
    z = np.asarray(z, dtype=float)
    _, g = np.unique(groups, return_inverse=True)
    k = int(g.max()) + 1 if g.size else 0
    if k < 2 or z.size <= k:
        return 0.0
    n_i = np.bincount(g, minlength=k).astype(float)
    means = np.bincount(g, weights=z, minlength=k) / n_i
    grand = z.mean()
    ssb = float(np.sum(n_i * (means - grand) ** 2))
    ssw = float(np.sum((z - means[g]) ** 2))
    msb, msw = ssb / (k - 1), ssw / (z.size - k)
    n0 = (z.size - np.sum(n_i**2) / z.size) / (k - 1)
    denom = msb + (n0 - 1) * msw
    return float(np.clip((msb - msw) / denom, 0.0, 0.99)) if denom > 0 else 0.0


@dataclass
class GroupCopula:
    within: float  # a**2: correlation of two responses' latent scores in one group
    prompt_corr: float  # r: correlation between prompt score and the group latent
    n: int

    def latents(self, rng: np.random.Generator, n_groups: int, per_group: int) -> tuple[np.ndarray, np.ndarray]:
        """(u_prompt[G], u_response[G, n]) uniforms."""
        a = math.sqrt(max(self.within, 0.0))
        r = self.prompt_corr
        zp = rng.standard_normal(n_groups)
        zg = r * zp + math.sqrt(max(1 - r * r, 0.0)) * rng.standard_normal(n_groups)
        z = a * zg[:, None] + math.sqrt(max(1 - a * a, 0.0)) * rng.standard_normal((n_groups, per_group))
        return special.ndtr(zp), special.ndtr(z)

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"type": "gaussian_copula", "within_group_corr": self.within, "prompt_response_corr": self.prompt_corr, "n": self.n})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupCopula:
        return cls(float(d.get("within_group_corr", 0.0)), float(d.get("prompt_response_corr", 0.0)), int(d.get("n", 0)))


def fit_group_copula(prompt: np.ndarray, response: np.ndarray, groups: np.ndarray) -> GroupCopula:
    """Estimate the copula from per-sample arrays (prompt repeated within its group)."""
    zr = normal_scores(response)
    within = icc_oneway(zr, groups)
    # prompt scores over prompts (one per group), broadcast back to samples
    _, first, inv = np.unique(groups, return_index=True, return_inverse=True)
    zp = normal_scores(np.asarray(prompt, float)[first])[inv]
    if np.std(zp) == 0 or np.std(zr) == 0:
        c = 0.0
    else:
        c = float(np.corrcoef(zp, zr)[0, 1])
    a = math.sqrt(within)
    r = float(np.clip(c / a, -1, 1)) if a > 1e-6 else 0.0
    return GroupCopula(within, r, int(zr.size))


# ----------------------------------------------------------------------------- mixture


@dataclass
class GaussianMixture:
    weights: np.ndarray
    means: np.ndarray  # (k, d)
    covs: np.ndarray  # (k, d, d)
    bic: float
    space: str = "log"  # 'log' (of token counts) or 'raw'

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        comp = rng.choice(self.weights.size, size=n, p=self.weights)
        out = np.empty((n, self.means.shape[1]))
        for j in range(self.weights.size):
            m = comp == j
            if m.any():
                out[m] = rng.multivariate_normal(self.means[j], self.covs[j], size=int(m.sum()), method="cholesky")
        return out

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "type": "gaussian_mixture",
                "space": self.space,
                "n_components": int(self.weights.size),
                "weights": self.weights.tolist(),
                "means": self.means.tolist(),
                "covariances": self.covs.tolist(),
                "bic": self.bic,
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GaussianMixture:
        return cls(np.asarray(d["weights"], float), np.asarray(d["means"], float), np.asarray(d["covariances"], float),
                   float(d.get("bic") or 0.0), d.get("space", "log"))


def _logpdf_mvn(x: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    d = x.shape[1]
    c = np.linalg.cholesky(cov)
    y = np.linalg.solve(c, (x - mean).T)
    return -0.5 * np.sum(y * y, axis=0) - np.log(np.diag(c)).sum() - 0.5 * d * math.log(2 * math.pi)


def fit_gmm(x: np.ndarray, k: int, seed: int = 0, iters: int = 100, reg: float = 1e-6) -> GaussianMixture:
    """EM for a full-covariance Gaussian mixture (numpy only; sklearn is not a dependency)."""
    rng = np.random.default_rng(seed)
    n, d = x.shape
    scale = np.var(x, axis=0).mean() * reg + 1e-9
    # k-means++ seeding: spread-out starts avoid two components fighting over one cluster
    means = [x[rng.integers(n)]]
    for _ in range(1, k):
        d2 = np.min(np.stack([np.sum((x - m) ** 2, axis=1) for m in means]), axis=0)
        means.append(x[rng.choice(n, p=d2 / d2.sum())] if d2.sum() > 0 else x[rng.integers(n)])
    means = np.array(means)
    covs = np.array([np.cov(x.T) + scale * np.eye(d) for _ in range(k)])
    w = np.full(k, 1 / k)
    prev = -np.inf
    for _ in range(iters):
        lp = np.stack([np.log(w[j]) + _logpdf_mvn(x, means[j], covs[j]) for j in range(k)], axis=1)
        ll = special.logsumexp(lp, axis=1)
        resp = np.exp(lp - ll[:, None])
        nk = resp.sum(axis=0) + 1e-12
        w = nk / n
        means = (resp.T @ x) / nk[:, None]
        for j in range(k):
            dx = x - means[j]
            covs[j] = (resp[:, j, None] * dx).T @ dx / nk[j] + scale * np.eye(d)
        tot = float(ll.sum())
        if tot - prev < 1e-5 * abs(tot):
            break
        prev = tot
    p = k * (d + d * (d + 1) / 2) + (k - 1)
    return GaussianMixture(w, means, covs, -2 * tot + p * math.log(n))


def fit_gmm_bic(x: np.ndarray, max_k: int = 4, seed: int = 0, space: str = "log", max_n: int = 5_000) -> GaussianMixture:
    """The BIC-best mixture with 1..max_k components (fitted on a seeded subsample of max_n)."""
    rng = np.random.default_rng(seed)
    if x.shape[0] > max_n:
        x = x[rng.choice(x.shape[0], size=max_n, replace=False)]
    best: GaussianMixture | None = None
    for k in range(1, max_k + 1):
        if x.shape[0] < 10 * k:
            break
        try:
            g = fit_gmm(x, k, seed=seed)
        except np.linalg.LinAlgError:
            continue
        if best is None or g.bic < best.bic:
            best = g
    if best is None:
        raise ValueError("could not fit a mixture")
    best.space = space
    return best


# ----------------------------------------------------------------------------- selection


def joint_distance(gen_p: np.ndarray, gen_r: np.ndarray, gen_groups: np.ndarray, ref_p: np.ndarray, ref_r: np.ndarray, ref_groups: np.ndarray) -> dict[str, float]:
    """How far a generated joint is from a reference: max 2-D CDF difference on a 12x12 grid of
    reference quantiles, and the error in the within-group correlation of response scores."""
    qs = np.linspace(0.05, 0.95, 12)
    xp, xr = np.quantile(ref_p, qs), np.quantile(ref_r, qs)

    def cdf2(p: np.ndarray, r: np.ndarray) -> np.ndarray:
        a = p[:, None] <= xp[None, :]
        b = r[:, None] <= xr[None, :]
        return (a.T.astype(float) @ b.astype(float)) / p.size

    d2 = float(np.max(np.abs(cdf2(gen_p, gen_r) - cdf2(ref_p, ref_r))))
    icc_err = abs(icc_oneway(normal_scores(gen_r), gen_groups) - icc_oneway(normal_scores(ref_r), ref_groups))
    return {"cdf2_distance": d2, "within_corr_error": float(icc_err), "score": d2 + float(icc_err)}
