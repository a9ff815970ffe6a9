"""The level of response lengths from step to step: a trend that has to earn its slope, a
step-level random effect, and the uncertainty of the level itself.

Real RL steps do not look alike: a step's responses are a sample of prompts, and the policy
changes between steps, so the per-step level wanders more than i.i.d. samples would make it
(rllm's step means move by 40%; a DAPO run's by 5%). Per training step ``k`` the *level* is

    l_k = mean over the step's prompt groups of the group's mean of log(min(length, cap))

(GRPO groups share a prompt, so they are the independent units: ``v_k = var(group means) / G_k``
is ``l_k``'s sampling variance, within-group correlation included). Over the ``m`` training steps,
a random-effects model ``l_k = a + b (k - k0) + eta_k + e_k`` with ``eta_k ~ N(0, tau^2)``,
``e_k ~ N(0, v_k)`` is estimated by the method of moments:

* ``b``: least squares, then shrunk towards zero by the positive-part rule ``b (1 - 1/t^2)+``
  (the empirical-Bayes posterior mean under a normal prior on the slope whose variance is
  estimated from the data): a slope within one standard error of zero is dropped, a clear trend
  is kept almost whole. Beyond the fitted steps the trend is held at half a span's
  extrapolation.
* ``tau^2 = max(0, residual variance around the trend - mean v_k)``: the step-to-step variation
  that sampling prompts does not explain (the generator's copula already makes group-level noise);
  with unequal ``v_k`` the same estimate weighted by ``1 / v_k`` (:func:`step_variance`).
* ``level_se^2 = (tau^2 + mean v_k) / m`` (with unequal ``v_k``: ``1 / sum 1/(tau^2 + v_k)``): how well ``a`` is known. The sampler draws it once per
  replay (a seed), the step effect once per step.

Censoring at the cap attenuates log(min(length, cap)): a level shift ``d`` moves ``l_k`` by about
``d * P(uncensored)``, so slope, ``tau`` and ``level_se`` are divided by the uncensored share to
act on the latent (uncut) lengths the sampler scales.

``step_offsets`` (the trend plus each step's shrunk effect, ``tau^2 / (tau^2 + v_k)`` of its
residual) de-level the training values before the marginal is fitted, so the marginal holds the
within-step shape and the level variation is not counted twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special, stats

from analyses.fit.continuous import json_safe

MIN_UNCENSORED_SHARE = 0.25  # below this the attenuation correction would only amplify noise
PRIOR_DOF = 2.0  # the prior on the step levels' residual variance weighs as much as 2 steps
MIN_TREND_STEPS = 5  # a slope needs at least 3 residual degrees of freedom to be told from step noise


@dataclass
class DriftModel:
    kind: str  # 'linear_log_scale' (a trend is used) | 'none'
    intercept: float
    slope: float  # per step, on the latent log scale (after shrinkage)
    reference: float  # the level the marginal was fitted at: log_factor = intercept + slope * step - reference
    step_min: int
    step_max: int
    t_stat: float
    windows: list[dict[str, float]] = field(default_factory=list)  # per training step: level, its variance, offset
    step_sd: float = 0.0  # tau on the latent log scale: a step's level around the trend
    level_se: float = 0.0  # uncertainty of the level (latent log scale), drawn once per replay
    slope_raw: float = 0.0  # least-squares slope before shrinkage (latent log scale)
    shrinkage: float = 0.0  # the factor applied to slope_raw (0 = no trend, 1 = the raw slope)
    dof: float = 0.0  # degrees of freedom of level_var (0: use the point estimates)
    level_var: float = 0.0  # residual variance of the step levels around the trend (tau^2 + sampling)
    sampling_var: float = 0.0  # mean sampling variance of a step level
    n_steps: int = 0

    @property
    def posterior_dof(self) -> float:
        return self.dof + PRIOR_DOF if self.n_steps > 0 else 0.0

    def replay(self, chi2: float) -> tuple[float, float]:
        """(step_sd, level_se) of one replay, given a chi-square(``posterior_dof``) draw.

        The residual variance of the step levels is not known, only estimated from ``dof``
        degrees of freedom (one, with 2 fitted steps). Each replay draws it from its posterior
        under the conjugate scaled-inverse-chi-square prior centred on ``sampling_var`` -- steps
        that differ by sampling alone -- with the weight of ``PRIOR_DOF`` steps; so a replay of a
        model fitted on few steps may vary more than the point estimate says, and a long run's
        replays all vary as its steps did."""
        nu = self.posterior_dof
        if nu <= 0 or chi2 <= 0:
            return self.step_sd, self.level_se
        s2_post = (self.dof * self.level_var + PRIOR_DOF * self.sampling_var) / nu
        s2 = s2_post * nu / chi2
        return math.sqrt(max(0.0, s2 - self.sampling_var)), math.sqrt(s2 / self.n_steps)

    def log_factor(self, step: int | np.ndarray) -> np.ndarray:
        if self.slope == 0:
            return np.zeros_like(np.asarray(step, dtype=float))
        span = max(self.step_max - self.step_min, 1)
        s = np.clip(np.asarray(step, dtype=float), self.step_min - span / 2, self.step_max + span / 2)
        return self.intercept + self.slope * s - self.reference

    def factor(self, step: int) -> float:
        return float(np.exp(self.log_factor(step)))

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "kind": self.kind,
                "variable": "response_tokens",
                "intercept": self.intercept,
                "slope_per_step": self.slope,
                "reference_log_scale": self.reference,
                "step_min": self.step_min,
                "step_max": self.step_max,
                "t_stat": self.t_stat,
                "windows": self.windows,
                "step_sd": self.step_sd,
                "level_se": self.level_se,
                "slope_raw": self.slope_raw,
                "shrinkage": self.shrinkage,
                "dof": self.dof,
                "level_var": self.level_var,
                "sampling_var": self.sampling_var,
                "n_steps": self.n_steps,
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DriftModel:
        if not d:
            return none_model(0, 0)
        return cls(d["kind"], float(d["intercept"]), float(d["slope_per_step"]), float(d["reference_log_scale"]),
                   int(d["step_min"]), int(d["step_max"]), float(d.get("t_stat") or 0.0), list(d.get("windows") or []),
                   float(d.get("step_sd") or 0.0), float(d.get("level_se") or 0.0), float(d.get("slope_raw") or 0.0),
                   float(d.get("shrinkage") or 0.0), float(d.get("dof") or 0.0), float(d.get("level_var") or 0.0),
                   float(d.get("sampling_var") or 0.0), int(d.get("n_steps") or 0))


def none_model(step_min: int, step_max: int) -> DriftModel:
    """No trend, no step effect (multi-turn responses, or nothing to estimate from)."""
    return DriftModel("none", 0.0, 0.0, 0.0, int(step_min), int(step_max), 0.0)


def step_levels(steps: np.ndarray, groups: np.ndarray, values: np.ndarray, cap: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, l_k, v_k): per step the mean of group means of log(min(value, cap)) and its
    sampling variance ``var(group means) / G`` (NaN with a single group)."""
    y = np.log(np.maximum(np.minimum(values, cap) if cap is not None else values, 1.0))
    _, g_code = np.unique(np.asarray(groups), return_inverse=True)
    _, s_code = np.unique(steps, return_inverse=True)
    _, gi = np.unique(s_code.ravel().astype(np.int64) * (int(g_code.max()) + 1) + g_code.ravel(), return_inverse=True)
    gi = gi.ravel()
    gmean = np.bincount(gi, weights=y) / np.bincount(gi)
    gstep = np.zeros(gmean.size, dtype=np.int64)
    gstep[gi] = steps
    uniq, si = np.unique(gstep, return_inverse=True)
    cnt = np.bincount(si).astype(float)
    lev = np.bincount(si, weights=gmean) / cnt
    ss = np.bincount(si, weights=(gmean - lev[si]) ** 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(cnt > 1, ss / np.maximum(cnt - 1, 1) / cnt, np.nan)
    return uniq, lev, var


def step_variance(resid: np.ndarray, v: np.ndarray, dof: float) -> float:
    """``tau^2`` from the levels' residuals and their sampling variances ``v``: DerSimonian and
    Laird's moment estimator, ``(Q - dof) / c`` with ``Q = sum(resid^2 / v)`` and ``c`` its
    expected growth per unit of ``tau^2`` -- with equal ``v`` exactly the residual variance minus
    ``v``; with unequal ones (a fit from summaries: a step with a runaway knows its level less
    well) a noisy step does not hide the others' spread."""
    m = resid.size
    if dof <= 0 or m < 2:
        return 0.0
    v = np.maximum(np.asarray(v, dtype=float), 1e-12)
    w = 1.0 / v
    q = float(np.sum(w * resid**2))
    c = (float(np.sum(w)) - float(np.sum(w * w)) / float(np.sum(w))) * dof / (m - 1)
    return max(0.0, (q - dof) / c) if c > 0 else 0.0


def fit_drift(steps: np.ndarray, values: np.ndarray, groups: np.ndarray | None = None,
              cap: float | None = None) -> tuple[DriftModel, dict[int, float]]:
    """The level model of ``values`` (response lengths) over ``steps`` (one per value), and the
    latent log offset of each training step (trend + shrunk step effect) for de-levelling.
    ``groups``: the prompt group of each value (default: every value its own group)."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=float)
    groups = np.arange(values.size) if groups is None else np.asarray(groups)
    if np.unique(steps).size == 0:
        return none_model(0, 0), {}
    ks, lev, var = step_levels(steps, groups, values, cap)
    att = max(1.0 - float(np.mean(values >= cap)) if cap is not None else 1.0, MIN_UNCENSORED_SHARE)
    return drift_from_levels(ks, lev, var, att)


def drift_from_levels(ks: np.ndarray, lev: np.ndarray, var: np.ndarray,
                      att: float = 1.0) -> tuple[DriftModel, dict[int, float]]:
    """The level model from per-step levels ``lev`` (steps ``ks``, in order) and their sampling
    variances ``var`` (NaN: unknown, the mean of the others is used): the method of moments of the
    module text. ``att``: the uncensored share, by which levels of cut lengths are attenuated
    (1 for levels already on the latent scale, as a fit from summaries gives them)."""
    ks, lev = np.asarray(ks, dtype=np.int64), np.asarray(lev, dtype=float)
    var = np.asarray(var, dtype=float)
    if ks.size == 0:
        return none_model(0, 0), {}
    v = np.where(np.isfinite(var), var, np.nanmean(var) if np.isfinite(var).any() else 0.0)
    m = ks.size
    center = float(np.mean(ks))
    c = ks - center
    mean_l = float(np.mean(lev))
    sxx = float(np.sum(c * c))
    b_raw, shrink, t = 0.0, 0.0, 0.0
    if m >= MIN_TREND_STEPS and sxx > 0:
        b_raw = float(np.sum(c * (lev - mean_l)) / sxx)
        s2 = float(np.sum((lev - mean_l - b_raw * c) ** 2) / (m - 2))
        se_b = math.sqrt(max(s2, float(np.mean(v))) / sxx)
        t = b_raw / se_b if se_b > 0 else 0.0
        # the same evidence on the normal scale: |t| with m - 2 dof -> z with the same tail probability
        z = float(special.ndtri(stats.t.cdf(abs(t), m - 2))) if t != 0 else 0.0
        shrink = max(0.0, 1.0 - 1.0 / (z * z)) if z > 0 else 0.0
    b = shrink * b_raw
    resid = lev - mean_l - b * c
    dof = m - 1 - shrink
    s2 = float(np.sum(resid**2)) / dof if dof > 0 else 0.0
    tau2 = step_variance(resid, v, dof)
    # the variance of the precision-weighted level ((tau^2 + v) / m with equal v), and the steps' typical
    # sampling variance as their harmonic mean (a step that knows its level badly does not dominate either)
    level_se = math.sqrt(1.0 / float(np.sum(1.0 / np.maximum(tau2 + v, 1e-12))))
    v_typ = float(v.size / np.sum(1.0 / np.maximum(v, 1e-12)))
    blup = resid * (tau2 / (tau2 + v)) if tau2 > 0 else np.zeros(m)
    offsets = (b * c + blup) / att
    windows = [{"step": int(k), "level": float(lv), "sampling_var": float(vv), "offset": float(o)}
               for k, lv, vv, o in zip(ks, lev, v, offsets, strict=True)]
    slope = b / att
    model = DriftModel("linear_log_scale" if slope != 0 else "none", mean_l - slope * center, slope, mean_l,
                       int(ks[0]), int(ks[-1]), float(t), windows, math.sqrt(tau2) / att, level_se / att,
                       b_raw / att, shrink, max(dof, 0.0), s2 / att**2, v_typ / att**2, m)
    return model, {int(k): float(o) for k, o in zip(ks, offsets, strict=True)}
