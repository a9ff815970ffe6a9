"""Censored MLE, AIC selection and goodness of fit (analyses.fit.continuous, lnmix)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analyses.fit.continuous import fit_continuous, frozen, infer_cap, param_names
from analyses.fit.lnmix import LogNormalMixture


def test_censored_fit_recovers_lognormal_that_a_naive_fit_underestimates():
    # lognormal(sigma=0.8, scale=500) capped at 1500: ~8.5% of the draws sit at the cap
    x = stats.lognorm.rvs(0.8, scale=500, size=20_000, random_state=1)
    capped = np.minimum(np.rint(x), 1500)
    f = fit_continuous(capped, censor_at=1500, families=("lognorm", "gamma"))
    assert f.family == "lognorm"
    assert f.n_censored == int(np.sum(np.rint(x) >= 1500))
    s, _, scale = f.params
    assert s == pytest.approx(0.8, rel=0.03)
    assert scale == pytest.approx(500, rel=0.03)
    # treating the cap as data points shrinks the spread: the censored fit must do better
    s_naive, _, _ = stats.lognorm.fit(capped, floc=0)
    assert abs(s_naive - 0.8) > 3 * abs(s - 0.8)


def test_aic_picks_the_generating_family_and_every_candidate_has_gof():
    x = np.rint(stats.gamma.rvs(3.0, scale=200, size=20_000, random_state=2))
    f = fit_continuous(x, families=("lognorm", "gamma", "weibull_min", "expon"))
    assert f.family == "gamma"
    assert [c.aic for c in f.candidates] == sorted(c.aic for c in f.candidates)
    for c in f.candidates:
        assert c.k == len(param_names(c.family)) - 1  # loc is fixed at 0
        for key in ("ks", "ks_p", "wasserstein", "p99_rel_err", "p999_rel_err"):
            assert np.isfinite(getattr(c, key))
    best = f.candidates[0]
    assert best.ks < 0.02 and abs(best.p99_rel_err) < 0.05
    assert f.candidates[-1].ks > best.ks  # expon is visibly worse


def test_large_input_is_screened_on_a_subsample_then_refit_on_all():
    x = np.rint(stats.lognorm.rvs(0.5, scale=300, size=30_000, random_state=3))
    f = fit_continuous(x, censor_at=800, families=("lognorm", "gamma"), screen_n=2_000)
    assert f.refit_on_all and f.n == 30_000
    assert f.params[0] == pytest.approx(0.5, rel=0.02)
    assert f.params[2] == pytest.approx(300, rel=0.02)


def test_individual_censoring_points_are_lower_bounds():
    x = stats.expon.rvs(scale=100, size=20_000, random_state=4)
    caps = np.where(np.arange(x.size) % 2 == 0, 50.0, 200.0)  # two different limits
    cens = x >= caps
    f = fit_continuous(np.minimum(x, caps), censored=cens, families=("expon",), integer=False)
    assert f.params[-1] == pytest.approx(100, rel=0.04)


def test_lognormal_mixture_candidate_wins_on_bimodal_lengths():
    r = np.random.default_rng(5)
    x = np.rint(np.concatenate([r.lognormal(5, 0.3, 8000), r.lognormal(8, 0.4, 2000)]))
    f = fit_continuous(x, censor_at=6000)
    assert f.family.startswith("lognorm_mix")
    m = f.dist()
    assert isinstance(m, LogNormalMixture)
    w_small = m.w[np.argmin(m.mu)]
    assert w_small == pytest.approx(0.8, abs=0.02)
    u = np.linspace(0.01, 0.99, 50)
    assert np.allclose(m.cdf(m.ppf(u)), u, atol=1e-4)


def test_ppf_clips_to_cap_and_rounds_integers():
    x = np.rint(stats.lognorm.rvs(1.0, scale=1000, size=5000, random_state=6))
    f = fit_continuous(x, censor_at=3000, families=("lognorm",))
    q = f.ppf(np.array([0.001, 0.5, 0.999]))
    assert q[-1] == 3000 and np.all(q == np.rint(q)) and q[0] >= f.lower


def test_infer_cap_rules():
    x = np.arange(1, 200, dtype=float)
    assert infer_cap(x, declared=4096) == 4096
    assert infer_cap(np.append(x, [500, 500])) == 500  # the max repeats: a length limit
    assert infer_cap(np.append(x, 500)) is None  # a single largest value is just the largest
    assert infer_cap(np.array([5, 9, 9.0]), truncated=np.array([False, True, True])) == 9


def test_frozen_dispatches_to_scipy_and_mixture():
    assert frozen("gamma", [2.0, 0.0, 10.0]).mean() == pytest.approx(20)
    assert isinstance(frozen("lognorm_mix2", [0.5, 0.5, 1, 2, 0.1, 0.1]), LogNormalMixture)


def test_rejects_unfittable_input():
    with pytest.raises(ValueError):
        fit_continuous(np.array([3.0]))
    with pytest.raises(ValueError):
        fit_continuous(np.array([10.0, 10.0, 10.0]), censor_at=10)
