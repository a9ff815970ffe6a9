"""References for the fidelity score: hindsight ceiling, recorded mean, Monte Carlo error."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analyses.fit.score_refs import hindsight_ceiling, monte_carlo_se, recorded_mean, seed_stack


def _real() -> pl.DataFrame:
    # held-out steps 7 and 5 (out of order on purpose): total 200 / 100, longest 50 / 50
    return pl.DataFrame({"step": [7, 5], "total_tokens": [200.0, 100.0], "longest_response": [50.0, 50.0]})


def test_ceiling_by_hand():
    c = hindsight_ceiling(_real(), ["total_tokens", "longest_response"])
    # total: predicting 100 costs (0 + 100/200)/2 = 25%; predicting 200 costs (100/100 + 0)/2 = 50% -> 25%
    assert c["errors_pct"]["total_tokens"] == pytest.approx(25.0)
    assert c["errors_pct"]["longest_response"] == 0.0
    assert c["accuracy_pct"] == pytest.approx(100 - (25.0 + 0.0) / 2)


def test_ceiling_skips_zero_real_values():
    real = pl.DataFrame({"step": [0, 1, 2], "tool_time_s": [0.0, 10.0, 30.0]})
    c = hindsight_ceiling(real, ["tool_time_s"])
    # only 10 and 30 count: 10 -> (0 + 20/30)/2 = 33.3%, 30 -> (20/10 + 0)/2 = 100%
    assert c["errors_pct"]["tool_time_s"] == pytest.approx(100 / 3)


def test_recorded_mean_by_hand():
    fitted = pl.DataFrame({"step": [0, 1], "total_tokens": [100.0, 300.0], "longest_response": [40.0, 60.0]})
    r = recorded_mean(_real(), fitted, ["total_tokens", "longest_response"])
    assert r["prediction"] == {"total_tokens": 200.0, "longest_response": 50.0}
    assert r["errors_pct"]["total_tokens"] == pytest.approx(50.0)  # (0 + 100/100) / 2
    assert r["accuracy_pct"] == pytest.approx(75.0)


def test_ceiling_bounds_every_constant_prediction():
    # the recorded mean is one constant prediction, so it can never beat the hindsight ceiling
    rng = np.random.default_rng(3)
    for _ in range(50):
        k = int(rng.integers(1, 6))
        real = pl.DataFrame({"step": np.arange(k), "x": rng.lognormal(5, 1, k)})
        fitted = pl.DataFrame({"step": np.arange(4), "x": rng.lognormal(5, 1, 4)})
        assert hindsight_ceiling(real, ["x"])["accuracy_pct"] >= recorded_mean(real, fitted, ["x"])["accuracy_pct"] - 1e-9


def test_seed_stack_aligns_steps_with_real():
    g = pl.DataFrame({"step": [5, 7], "total_tokens": [1.0, 2.0], "longest_response": [3.0, 4.0]})
    st = seed_stack(_real(), [g, g], ["total_tokens", "longest_response"])
    assert st.shape == (2, 2, 2)
    assert st[0].tolist() == [[1.0, 3.0], [2.0, 4.0]]  # real sorted by step: 5 then 7


def test_monte_carlo_se():
    names = ["total_tokens", "longest_response"]
    same = pl.DataFrame({"step": [5, 7], "total_tokens": [110.0, 190.0], "longest_response": [50.0, 50.0]})
    assert monte_carlo_se(_real(), [same] * 10, names) == 0.0  # identical seeds: no Monte Carlo noise
    assert np.isnan(monte_carlo_se(_real(), [same], names))  # one seed: unknown
    rng = np.random.default_rng(0)
    noisy = [same.with_columns(total_tokens=pl.col("total_tokens") * float(rng.uniform(0.5, 1.5))) for _ in range(40)]
    few, many = monte_carlo_se(_real(), noisy[:10], names), monte_carlo_se(_real(), noisy, names)
    assert few > 0 and many > 0 and many < few  # more seeds, smaller error of the seed average
