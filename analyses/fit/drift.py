"""Drift of the response-length distribution across training steps.

Steps are cut into windows; in each window the location of log response length is measured
(the median, which censoring at the cap does not move while fewer than half are censored).
A weighted linear trend over the windows gives ``log_scale(step) = intercept + slope * step``.
The sampler multiplies the fitted marginal's quantiles by ``exp(log_scale(k) - reference)``,
so generated step ``k`` has step ``k``'s scale, not the run's average.

The trend is used only when it is supported by the data (at least 3 windows and the slope's
two-sided p-value under a t test on the windows below 1%);
otherwise the slope is 0 and ``kind`` says so. Beyond the fitted steps the trend is held at
half a span's extrapolation: a short run's slope should not be extended indefinitely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from analyses.fit.continuous import json_safe

MIN_WINDOWS = 3
P_MAX = 0.01


@dataclass
class DriftModel:
    kind: str  # 'linear_log_scale' | 'none'
    intercept: float
    slope: float
    reference: float  # log scale the marginal was fitted at (sample-weighted mean over fit steps)
    step_min: int
    step_max: int
    t_stat: float
    windows: list[dict[str, float]] = field(default_factory=list)

    def log_factor(self, step: int | np.ndarray) -> np.ndarray:
        if self.kind == "none" or self.slope == 0:
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
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DriftModel:
        if not d:
            return cls("none", 0.0, 0.0, 0.0, 0, 0, 0.0)
        return cls(d["kind"], float(d["intercept"]), float(d["slope_per_step"]), float(d["reference_log_scale"]),
                   int(d["step_min"]), int(d["step_max"]), float(d.get("t_stat") or 0.0), list(d.get("windows") or []))


def fit_drift(steps: np.ndarray, values: np.ndarray, n_windows: int = 6) -> DriftModel:
    """Fit the log-scale trend of ``values`` (response lengths) over ``steps`` (one per value)."""
    steps = np.asarray(steps, dtype=np.int64)
    v = np.log(np.maximum(np.asarray(values, dtype=float), 1.0))
    uniq = np.unique(steps)
    if uniq.size == 0:
        return DriftModel("none", 0.0, 0.0, 0.0, 0, 0, 0.0)
    nw = min(n_windows, uniq.size)
    edges = np.array_split(uniq, nw)
    rows = []
    for e in edges:
        m = np.isin(steps, e)
        rows.append({"step_from": int(e[0]), "step_to": int(e[-1]), "center": float(np.mean(steps[m])), "log_scale": float(np.median(v[m])), "n": int(m.sum())})
    c = np.array([r["center"] for r in rows])
    y = np.array([r["log_scale"] for r in rows])
    w = np.array([r["n"] for r in rows], dtype=float)
    ref_all = float(np.median(v))
    base = DriftModel("none", ref_all, 0.0, ref_all, int(uniq[0]), int(uniq[-1]), 0.0, rows)
    if nw < MIN_WINDOWS:
        return base
    wm = np.average(c, weights=w)
    sxx = float(np.sum(w * (c - wm) ** 2))
    if sxx == 0:
        return base
    slope = float(np.sum(w * (c - wm) * (y - np.average(y, weights=w))) / sxx)
    intercept = float(np.average(y, weights=w) - slope * wm)
    resid = y - (intercept + slope * c)
    dof = nw - 2
    s2 = float(np.sum(w * resid**2) / dof) if dof > 0 else 0.0
    se = math.sqrt(s2 / sxx) if s2 > 0 else 0.0
    t = slope / se if se > 0 else (math.inf if slope != 0 else 0.0)
    reference = float(np.average(intercept + slope * steps.astype(float)))
    p = float(2 * stats.t.sf(abs(t), dof)) if dof > 0 and math.isfinite(t) else (0.0 if math.isinf(t) else 1.0)
    if p > P_MAX:
        return DriftModel("none", intercept, 0.0, reference, int(uniq[0]), int(uniq[-1]), float(t), rows)
    return DriftModel("linear_log_scale", intercept, slope, reference, int(uniq[0]), int(uniq[-1]), float(t), rows)
