"""Semi-parametric response marginal (empirical body + GPD tail + cap mass) and the response-model
choice by rolling-origin validation inside the fitted steps."""

from __future__ import annotations

import numpy as np
import pytest
from _fit_synth import synth_samples

from analyses.fit.empirical import EmpiricalTailFit, fit_empirical_tail
from analyses.fit.exporters import _scipy_marginal
from analyses.fit.sampler import _scaled_ppf, generate
from analyses.fit.select import CANDIDATES, fit_workload_selected, origins, recent_window, validated_steps
from analyses.fit.spec import build_spec, validate_spec
from analyses.fit.workload import marginal


def test_empirical_tail_by_hand():
    # 1..100 uncensored plus 5 values at the cap 200: p_cap = 5/105; no threshold leaves >= 20
    # exceedances (the 0.9 quantile leaves 10), so there is no GPD tail and the body runs to 100
    x = np.concatenate([np.arange(1, 101), np.full(5, 200)]).astype(float)
    m = fit_empirical_tail(x, 200.0)
    assert m.p_cap == pytest.approx(5 / 105) and m.n_censored == 5 and m.tail_prob == 0.0
    assert m.knots[0] == 1 and m.knots[-1] == 100
    q = 1 - 5 / 105
    # level v = u / (1 - p_cap); the linear empirical quantile of 1..100 at 0.25 is 1 + 0.25 * 99 = 25.75 -> 26
    got = m.ppf(np.array([0.0, 0.25 * q, 0.999 * q, q, 0.9999]))
    assert got.tolist() == [1, 26, 100, 200, 200]
    # round trip through the spec form
    assert marginal(m.to_dict()).ppf(np.array([0.25 * q])).tolist() == [26]


def test_empirical_tail_gpd_is_truncated_at_the_cap_or_the_tail_limit():
    rng = np.random.default_rng(0)
    x = np.rint(rng.pareto(1.5, 5000) * 100 + 1)
    m = fit_empirical_tail(x, None, tail_limit=1.0)
    assert m.tail_prob > 0 and m.p_cap == 0.0
    u = np.linspace(0, 1, 10001)[:-1]
    v = m.ppf(u)
    assert np.all(np.diff(v) >= 0)  # a quantile function
    assert v.max() <= x.max()  # tail_limit 1: never beyond the largest value seen
    assert fit_empirical_tail(x, None, tail_limit=2.0).ppf(np.array([1 - 1e-9]))[0] > x.max()
    capped = fit_empirical_tail(np.minimum(x, 500), 500.0)
    # the uncensored part stays below the cap; the cap mass is the share of values at 500
    assert capped.p_cap == pytest.approx(float(np.mean(x >= 500)))
    draws = capped.ppf(rng.random(20000))
    assert float(np.mean(draws == 500)) == pytest.approx(capped.p_cap, abs=0.01)


def test_drift_scales_the_body_not_the_cap_mass():
    # knots 10..20, no tail, half the mass at the cap 100
    m = EmpiricalTailFit([10.0, 20.0], 0.0, 0.0, 1.0, 100.0, 100.0, 0.5, 10, 5)
    # u = 0.25 -> v = 0.5 -> 15; factor 2 -> 30; u = 0.75 is the cap whatever the factor
    assert _scaled_ppf(m, np.array([0.25, 0.75]), 2.0).tolist() == [30, 100]
    # a factor that pushes the body past the cap is clipped at it
    assert _scaled_ppf(m, np.array([0.25]), 10.0).tolist() == [100]


def test_origins_and_recent_window_by_hand():
    assert origins(2) == []  # too few fitted steps to validate: the default model is used
    assert origins(3) == [2]  # fit 2 steps, validate on the third
    assert origins(4) == [3]  # round(4 * 2/3) = 3 = m - 1
    assert origins(14) == [9, 13]  # round(28/3) = 9, and the last step
    assert recent_window(list(range(14))) == list(range(7, 14))
    assert recent_window([0, 1, 2]) == [1, 2]  # at least 2 steps, half rounded up
    # a long run validates at most 6 evenly spaced steps after the origin, the last one included:
    # 20 steps after origin 0 -> positions round(linspace(0, 19, 6)) = 0, 4, 8, 11, 15, 19
    assert validated_steps(list(range(100, 120)), 0) == [100, 104, 108, 111, 115, 119]
    assert validated_steps(list(range(10)), 6) == [6, 7, 8, 9]


def test_selected_fit_is_validated_inside_the_fitted_steps_and_exportable():
    s = synth_samples(steps=6, prompts=16, n=4, cap=2000, slope=0.05, seed=3)
    w = fit_workload_selected(s, run_id="sel", task="math")
    sel = w["response_selection"]
    assert set(sel["mean_accuracy_pct"]) == {f"{m}/{x}" for m, x in CANDIDATES}
    assert sel["selected"] == max(sel["mean_accuracy_pct"], key=lambda k: sel["mean_accuracy_pct"][k])
    # origins(6) = [4, 5]: never validated on a step outside 0..5
    assert [o["fitted_steps"] for o in sel["origins"]] == [[0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert [o["validated_steps"] for o in sel["origins"]] == [[4, 5], [5]]
    assert validate_spec(build_spec({"sel": w}, ["sel"])) == []
    g = generate(w, [6, 7], seed=0).samples
    assert g.height == 2 * 16 * 4 and int(g["response_tokens"].max()) <= 2000
    out = _scipy_marginal(w["variables"]["response_tokens"])
    assert "type" in out and out.get("censor_at") == 2000


def test_multi_turn_and_short_runs_keep_the_default_model():
    s = synth_samples(steps=2, prompts=8, n=4, seed=0)
    w = fit_workload_selected(s, run_id="short")
    assert w["response_selection"] == {"selected": "parametric/all", "reason": "2 fitted steps"}
