"""The scoring module (analyses.fit.scores): CRPS, 90% coverage, KS and the skill, by hand on
small arrays; the MAPE context and the hindsight ceiling."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from analyses.fit.scores import (
    covered90,
    crps_ensemble,
    crps_skill,
    hindsight_ceiling,
    interval90,
    ks_2samp,
    ks_rows,
    mape_accuracy,
    stat_matrix,
    step_statistics,
)


def test_crps_of_a_small_ensemble_by_hand():
    # ensemble 1, 2, 4 and y = 3: mean|X - y| = (2 + 1 + 1) / 3 = 4/3; the 9 member pairs have
    # |differences| 0,1,3 / 1,0,2 / 3,2,0, mean 12/9 = 4/3, half of it 2/3: CRPS = 4/3 - 2/3 = 2/3
    assert crps_ensemble(np.array([1.0, 2.0, 4.0]), 3.0) == pytest.approx(2 / 3)
    # a point forecast: CRPS is the absolute error
    assert crps_ensemble(np.array([5.0, 5.0]), 2.0) == pytest.approx(3.0)
    assert crps_ensemble(np.array([5.0, 5.0]), 5.0) == 0.0
    # columns are independent statistics: the same numbers, one column each
    got = crps_ensemble(np.array([[1.0, 5.0], [2.0, 5.0], [4.0, 5.0]]), np.array([3.0, 2.0]))
    assert got == pytest.approx([2 / 3, 3.0])


def test_crps_matches_the_pairwise_definition_on_random_ensembles():
    rng = np.random.default_rng(0)
    e, y = rng.normal(size=(7, 3)), np.array([0.1, 1.0, -2.0])
    pairwise = np.mean(np.abs(e - y), axis=0) - 0.5 * np.mean(np.abs(e[:, None] - e[None]), axis=(0, 1))
    assert crps_ensemble(e, y) == pytest.approx(pairwise)


def test_coverage_of_the_central_90_percent_interval_by_hand():
    ens = np.arange(101, dtype=float)  # 0..100: linear quantiles q05 = 5, q95 = 95
    assert interval90(ens) == (pytest.approx(5.0), pytest.approx(95.0))
    assert covered90(ens, np.array([5.0, 95.0, 50.0, 4.9, 95.1])).tolist() == [True, True, True, False, False]
    # a degenerate ensemble covers exactly its value (a capped statistic that always sits at the cap)
    assert covered90(np.full(10, 16000.0), 16000.0) and not covered90(np.full(10, 16000.0), 15999.0)


def test_two_sample_ks_by_hand_with_ties():
    # F_a - F_b at 2 is 2/4 - 0 and at 4 is 1 - 2/4: D = 1/2
    assert ks_2samp(np.array([1, 2, 3, 4]), np.array([3, 4, 5, 6])) == 0.5
    # ties: at 1, F_a = 2/3 and F_b = 1/3; at 2 both are 1: D = 1/3
    assert ks_2samp(np.array([1, 1, 2]), np.array([1, 2, 2])) == pytest.approx(1 / 3)
    assert ks_2samp(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0.0


def test_vectorised_ks_rows_equal_scipy_row_by_row():
    rng = np.random.default_rng(1)
    gen = np.rint(rng.lognormal(5, 1, (20, 150)))  # integers: many ties
    real = np.rint(rng.lognormal(5.1, 1, 170))
    expected = [stats.ks_2samp(g, real).statistic for g in gen]
    assert ks_rows(gen, real) == pytest.approx(expected, abs=1e-12)
    assert ks_rows(gen[:1], real)[0] == pytest.approx(ks_2samp(gen[0], real))


def test_crps_skill_by_hand():
    # mean(ours / real) = (1/10 + 2/20) / 2 = 0.1; mean(reference / real) = (2/10 + 2/20) / 2 = 0.15
    assert crps_skill(np.array([1.0, 2.0]), np.array([2.0, 2.0]), np.array([10.0, 20.0])) == pytest.approx(1 - 0.1 / 0.15)
    # cells whose real value is 0 have no relative score; a perfect reference leaves no skill to measure
    assert crps_skill(np.array([1.0, 9.0]), np.array([2.0, 9.0]), np.array([10.0, 0.0])) == pytest.approx(0.5)
    assert np.isnan(crps_skill(np.array([1.0]), np.array([0.0]), np.array([10.0])))


def test_stat_matrix_equals_step_statistics():
    s = pl.DataFrame({
        "step": [0, 0, 0, 0], "dp_rank": [0, 0, 1, 1], "prompt_tokens": [10, 10, 20, 20],
        "response_tokens": [100, 300, 50, 50], "n_turns": [1, 2, 1, 1], "tool_time_s": [0.0, 1.5, 0.0, 0.5],
    })
    names = ["total_tokens", "longest_response", "p99_response", "makespan_tokens", "turns", "tool_time_s"]
    real = step_statistics(s, multi=True, has_ranks=True).select(names).row(0)
    m = stat_matrix(s["prompt_tokens"].to_numpy()[None], s["response_tokens"].to_numpy()[None], np.array([0, 0, 1, 1]), 2,
                    names, s["n_turns"].to_numpy()[None], s["tool_time_s"].to_numpy()[None])
    assert m[0].tolist() == pytest.approx(list(real))
    # by hand: prompts 60 + responses 500; longest 300; p99 of [50,50,100,300] = 300 - 0.03*200; rank 0 carries 400
    assert real == pytest.approx((560, 300, 294, 400, 5, 2.0))


def test_mape_and_ceiling_by_hand():
    real = np.array([[100.0, 10.0], [200.0, 0.0]])
    pred = np.array([[110.0, 5.0], [150.0, 3.0]])
    m = mape_accuracy(pred, real, ["a", "b"])
    # a: (10/100 + 50/200) / 2 = 17.5%; b: only the step with a real value, 50%; accuracy 100 - (17.5 + 50) / 2
    assert m["errors_pct"] == pytest.approx({"a": 17.5, "b": 50.0})
    assert m["accuracy_pct"] == pytest.approx(100 - 33.75)
    # the best constant for [100, 200] is 200 (errors 1 and 0 -> mean 0.5) or 100 (0 and 0.5 -> 0.25): 25%
    c = hindsight_ceiling(np.array([[100.0], [200.0]]), ["a"])
    assert c["errors_pct"]["a"] == pytest.approx(25.0) and c["accuracy_pct"] == pytest.approx(75.0)
