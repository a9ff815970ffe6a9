"""Dependence (group copula, mixture) and drift."""

from __future__ import annotations

import numpy as np
import pytest
from _fit_synth import synth_samples

from analyses.fit.drift import fit_drift
from analyses.fit.joint import GroupCopula, fit_gmm_bic, fit_group_copula, icc_oneway, joint_distance


def test_icc_by_hand():
    # two groups of two: [1, 1] and [3, 3] -> all variance between groups -> ICC 0.99 (clipped)
    assert icc_oneway(np.array([1.0, 1.0, 3.0, 3.0]), np.array([0, 0, 1, 1])) == pytest.approx(0.99)
    # identical group means -> MSB = 0 -> ICC clipped at 0
    assert icc_oneway(np.array([1.0, 3.0, 1.0, 3.0]), np.array([0, 0, 1, 1])) == 0.0


def test_group_copula_recovers_within_group_correlation():
    s = synth_samples(steps=4, prompts=64, n=8, within=0.5, cap=None, seed=1)
    groups = (s["step"] * 1000 + s["local_index"] + s["dp_rank"] * 100).to_numpy()
    cop = fit_group_copula(s["prompt_tokens"].to_numpy(), s["response_tokens"].to_numpy(), groups)
    assert cop.within == pytest.approx(0.5, abs=0.08)
    assert abs(cop.prompt_corr) < 0.25  # synth prompts are independent of responses
    up, ur = GroupCopula(0.5, 0.0, 0).latents(np.random.default_rng(0), 2000, 8)
    assert up.shape == (2000,) and ur.shape == (2000, 8)
    assert icc_oneway(ur.ravel(), np.repeat(np.arange(2000), 8)) == pytest.approx(0.5, abs=0.05)


def test_gmm_separates_two_clusters():
    r = np.random.default_rng(0)
    x = np.vstack([r.normal([0, 0], 0.3, (600, 2)), r.normal([4, 4], 0.3, (400, 2))])
    g = fit_gmm_bic(x, max_k=3)
    assert g.weights.size == 2
    big = int(np.argmax(g.weights))
    assert g.weights[big] == pytest.approx(0.6, abs=0.03)
    assert np.allclose(sorted(g.means[:, 0]), [0, 4], atol=0.1)


def test_joint_distance_is_zero_on_identical_samples():
    r = np.random.default_rng(1)
    p, q = r.lognormal(5, 1, 800), r.lognormal(6, 1, 800)
    g = np.repeat(np.arange(100), 8)
    d = joint_distance(p, q, g, p, q, g)
    assert d["score"] == 0.0


def test_drift_recovers_a_log_trend_and_ignores_noise():
    s = synth_samples(steps=12, prompts=32, n=8, slope=0.05, within=0.2, cap=None, seed=2)
    d = fit_drift(s["step"].to_numpy(), s["response_tokens"].to_numpy())
    assert d.kind == "linear_log_scale"
    assert d.slope == pytest.approx(0.05, abs=0.015)
    assert d.factor(11) / d.factor(0) == pytest.approx(np.exp(0.55), rel=0.2)
    flat = synth_samples(steps=12, prompts=32, n=8, slope=0.0, within=0.2, cap=None, seed=3)
    d0 = fit_drift(flat["step"].to_numpy(), flat["response_tokens"].to_numpy())
    assert d0.kind == "none" and d0.factor(100) == 1.0


def test_drift_needs_three_windows():
    d = fit_drift(np.array([0, 0, 1, 1]), np.array([10, 12, 100, 120]))
    assert d.kind == "none"
