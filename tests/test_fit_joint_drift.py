"""Dependence (group copula, mixture) and drift."""

from __future__ import annotations

import numpy as np
import pytest
from _fit_synth import synth_samples

from analyses.fit.drift import fit_drift, step_levels
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
    d, offsets = fit_drift(s["step"].to_numpy(), s["response_tokens"].to_numpy(), s["group_id"].to_numpy())
    assert d.kind == "linear_log_scale" and d.shrinkage > 0.9  # a clear trend is kept almost whole
    assert d.slope == pytest.approx(0.05, abs=0.015)
    assert d.factor(11) / d.factor(0) == pytest.approx(np.exp(0.55), rel=0.2)
    assert offsets[11] - offsets[0] == pytest.approx(0.55, abs=0.15)
    flat = synth_samples(steps=12, prompts=32, n=8, slope=0.0, within=0.2, cap=None, seed=3)
    d0, _ = fit_drift(flat["step"].to_numpy(), flat["response_tokens"].to_numpy(), flat["group_id"].to_numpy())
    # no real trend: the slope chance leaves (raw -0.0098, z = 1.8 here) is shrunk, and small
    assert abs(d0.slope) < 0.01 and abs(d0.slope) < abs(d0.slope_raw)
    assert d0.step_sd < 0.05  # i.i.d. steps: (almost) no step effect beyond sampling


def test_step_levels_and_their_sampling_variance_by_hand():
    # step 0: groups a (1, e^2) and b (e^2, e^2): group means of log 1, 2 -> level 1.5,
    # sampling variance var([1, 2], ddof=1) / 2 = 0.25; step 1: one group -> no variance (NaN)
    e2 = float(np.exp(2))
    ks, lev, var = step_levels(np.array([0, 0, 0, 0, 1]), np.array(["a", "a", "b", "b", "c"]),
                               np.array([1.0, e2, e2, e2, e2]), None)
    assert ks.tolist() == [0, 1] and lev.tolist() == pytest.approx([1.5, 2.0])
    assert var[0] == pytest.approx(0.25) and np.isnan(var[1])


def test_step_effect_is_estimated_and_a_trend_needs_five_steps():
    # 8 steps whose log level jumps by +-0.3 around a constant: tau ~ 0.3, no trend
    rng = np.random.default_rng(4)
    levels = np.array([0.3, -0.3, 0.3, -0.3, -0.3, 0.3, 0.3, -0.3])
    steps = np.repeat(np.arange(8), 400)
    groups = np.repeat(np.arange(8 * 50), 8)
    x = np.exp(6 + levels[steps] + 0.5 * rng.standard_normal(steps.size))
    d, offsets = fit_drift(steps, x, groups)
    assert d.step_sd == pytest.approx(0.3, abs=0.08) and d.slope == 0.0
    # each step's offset is its (shrunk) level: the marginal is fitted to de-levelled lengths
    assert offsets[0] == pytest.approx(0.3, abs=0.08) and offsets[1] == pytest.approx(-0.3, abs=0.08)
    # the level's uncertainty: (tau^2 + sampling) / m
    assert d.level_se == pytest.approx(np.sqrt((d.step_sd**2 + d.sampling_var) / 8), rel=0.05)
    # 4 steps on a clean line: no trend all the same (fewer than 5 steps)
    d4, _ = fit_drift(np.repeat(np.arange(4), 100), np.exp(6 + 0.2 * np.repeat(np.arange(4), 100)))
    assert d4.kind == "none" and d4.slope_raw == 0.0


def test_replays_draw_the_level_variance_from_its_posterior():
    # dof 1, level_var 0.04, sampling 0.01, 2 steps: the posterior mixes 1 dof of data with
    # 2 of prior centred on the sampling variance: s2_post = (0.04 + 2 * 0.01) / 3 = 0.02
    from analyses.fit.drift import DriftModel

    d = DriftModel("none", 0, 0, 0, 0, 1, 0, [], 0.17, 0.14, 0, 0, 1.0, 0.04, 0.01, 2)
    assert d.posterior_dof == 3.0
    # a chi-square draw equal to its dof gives the posterior scale itself
    sd, se = d.replay(3.0)
    assert se == pytest.approx(np.sqrt(0.02 / 2)) and sd == pytest.approx(np.sqrt(0.02 - 0.01))
    # a small draw: a replay whose steps vary more
    assert d.replay(0.3)[0] > 3 * sd
