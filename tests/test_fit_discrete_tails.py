"""Count pmfs, categorical lengths, body + GPD tails."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analyses.fit.discrete import fit_categorical, fit_discrete, is_categorical
from analyses.fit.tails import fit_body_tail


def test_empirical_pmf_add_half_smoothing_by_hand():
    # counts over support 1..4: {1: 2, 2: 0, 3: 5, 4: 1}; n = 8, 4 support points, alpha = 0.5
    # smoothed = (c + 0.5) / (8 + 2) -> [0.25, 0.05, 0.55, 0.15]
    x = np.array([1, 1, 3, 3, 3, 3, 3, 4])
    f = fit_discrete(x)
    assert f.method == "empirical_smoothed"  # too lumpy for Poisson / nbinom
    assert f.support == [1, 2, 3, 4]
    assert f.pmf == pytest.approx([0.25, 0.05, 0.55, 0.15])
    assert f.ppf(np.array([0.0, 0.26, 0.31, 0.99])).tolist() == [1, 2, 3, 4]


def test_poisson_counts_get_a_fitted_pmf_shifted_to_the_minimum():
    x = np.random.default_rng(0).poisson(2.0, 5000) + 1  # turns >= 1
    f = fit_discrete(x)
    assert f.method in ("poisson", "nbinom")
    assert f.shift == 1
    assert f.mean() == pytest.approx(x.mean(), rel=0.02)
    assert sum(f.pmf) == pytest.approx(1.0)


def test_overdispersed_counts_pick_negative_binomial():
    x = stats.nbinom.rvs(2, 0.3, size=5000, random_state=1)
    f = fit_discrete(x)
    assert f.method == "nbinom"
    assert f.params["n"] == pytest.approx(2, rel=0.15)


def test_categorical_lengths_keep_their_atoms():
    x = np.array([1066] * 50 + [3830] * 30 + [4247] * 20)
    assert is_categorical(x)
    c = fit_categorical(x)
    assert c.values == [1066, 3830, 4247] and c.probs == pytest.approx([0.5, 0.3, 0.2])
    assert c.ppf(np.array([0.1, 0.6, 0.95])).tolist() == [1066, 3830, 4247]
    assert not is_categorical(np.arange(1000))


def test_body_tail_recovers_a_pareto_tail():
    r = np.random.default_rng(2)
    body = r.lognormal(-1.5, 0.5, 9000)
    tail = 0.6 + stats.genpareto.rvs(0.3, scale=0.2, size=1000, random_state=3)
    f = fit_body_tail(np.concatenate([body, tail]))
    assert f.tail_prob > 0 and f.n_tail >= 30
    assert f.xi == pytest.approx(0.3, abs=0.12)
    u = np.linspace(0.001, 0.999, 400)
    q = f.ppf(u)
    assert np.all(np.diff(q) >= -1e-9)  # monotone through the splice
    data = np.concatenate([body, tail])
    assert f.ppf(np.array([0.999]))[0] == pytest.approx(np.quantile(data, 0.999), rel=0.25)
    d = f.to_dict()
    assert d["kind"] == "body_tail" and d["tail"]["family"] == "genpareto"


def test_body_tail_needs_enough_exceedances():
    with pytest.raises(ValueError):
        fit_body_tail(np.arange(1, 40, dtype=float))


def test_discrete_gof_is_total_variation_by_hand():
    # empirical smoothed pmf [0.25, 0.05, 0.55, 0.15] vs observed [0.25, 0, 0.625, 0.125]:
    # TV = (0 + 0.05 + 0.075 + 0.025) / 2 = 0.075
    f = fit_discrete(np.array([1, 1, 3, 3, 3, 3, 3, 4]))
    assert f.to_dict()["gof"]["tv_distance"] == pytest.approx(0.075)
