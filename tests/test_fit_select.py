"""Semi-parametric response marginal (empirical body + GPD tail + cap mass) and the response-model
choice by rolling-origin validation inside the fitted steps."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_samples

from analyses.export.formats.polytrace_params import scipy_marginal
from analyses.export.sampler import generate, scaled_ppf
from analyses.export.spec import build_spec, validate_spec
from analyses.fit.empirical import EmpiricalTailFit, fit_empirical_tail
from analyses.fit.select import (
    CANDIDATES,
    cv_seeds,
    fit_workload_selected,
    origins,
    recent_window,
    validated_steps,
)
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
    assert scaled_ppf(m, np.array([0.25, 0.75]), 2.0).tolist() == [30, 100]
    # a factor that pushes the body past the cap is clipped at it
    assert scaled_ppf(m, np.array([0.25]), 10.0).tolist() == [100]


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
    # validation seeds: 30, unless one candidate at one origin would generate > 2M samples
    assert len(cv_seeds(512, 5)) == 30  # 2M // 2560 = 781 -> capped at 30
    assert len(cv_seeds(100_000, 6)) == 5  # 2M // 600k = 3 -> at least 5
    assert cv_seeds(20_000, 10) == tuple(range(10))  # 2M // 200k = 10


def test_selected_fit_is_validated_inside_the_fitted_steps_and_exportable():
    s = synth_samples(steps=6, prompts=16, n=4, cap=2000, slope=0.05, seed=3)
    w = fit_workload_selected(s, run_id="sel", task="math")
    sel = w["response_selection"]
    assert set(sel["mean_accuracy_pct"]) == {f"{m}/{x}" for m, x in CANDIDATES}
    assert sel["selected"] == max(sel["mean_accuracy_pct"], key=lambda k: sel["mean_accuracy_pct"][k])
    # the histogram baseline is scored at the same origins as a reference (one score per origin)
    assert len(sel["baseline_scores"]) == 2 and 0 < sel["baseline_mean_accuracy_pct"] <= 100
    # origins(6) = [4, 5]: never validated on a step outside 0..5
    assert [o["fitted_steps"] for o in sel["origins"]] == [[0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert [o["validated_steps"] for o in sel["origins"]] == [[4, 5], [5]]
    assert validate_spec(build_spec({"sel": w}, ["sel"])) == []
    g = generate(w, [6, 7], seed=0).samples
    assert g.height == 2 * 16 * 4 and int(g["response_tokens"].max()) <= 2000
    out = scipy_marginal(w["variables"]["response_tokens"])
    assert "type" in out and out.get("censor_at") == 2000


def test_multi_turn_and_short_runs_keep_the_default_model():
    s = synth_samples(steps=2, prompts=8, n=4, seed=0)
    w = fit_workload_selected(s, run_id="short")
    assert w["response_selection"] == {"selected": "parametric/all", "reason": "2 fitted steps"}


def test_a_candidate_that_cannot_be_fitted_is_not_eligible():
    # from step 2 on every response is at the cap 4096: a recent window (steps 2-3 at origin 4,
    # 3-4 at origin 5) has no uncensored value, so the empirical_tail "/recent" candidates cannot
    # be fitted there and are not eligible; the parametric one fits that window as a point mass
    # at the cap (a categorical with one value) and, as the validated steps are all at the cap, wins
    s = synth_samples(steps=6, prompts=8, n=4, cap=4096, seed=1)
    s = s.with_columns(response_tokens=pl.when(pl.col("step") >= 2).then(4096).otherwise(pl.col("response_tokens")))
    w = fit_workload_selected(s, run_id="capped")
    sel = w["response_selection"]
    assert sel["scores"]["empirical_tail1/recent"] == [None, None] == sel["scores"]["empirical_tail2/recent"]
    assert set(sel["mean_accuracy_pct"]) == set(sel["scores"]) - {"empirical_tail1/recent", "empirical_tail2/recent"}
    assert sel["selected"] == "parametric/recent"
    assert generate(w, [6], seed=0).samples["response_tokens"].unique().to_list() == [4096]


def _by_turns_run() -> dict[str, pl.DataFrame]:
    """40 one-turn trajectories (completion 200..239) and 40 two-turn ones (tool-calling turn
    10..49, one search call returning 500..539 tokens, answer turn 100..139), over 4 steps."""
    from analyses.schema import conform

    s_rows, t_rows, c_rows = [], [], []
    for i in range(80):
        k, two, j = i % 4, i >= 40, i % 40
        sid = f"{i}"
        comps = [10 + j, 100 + j] if two else [200 + j]
        tool = 500 + j
        s_rows.append({"step": k, "sample_id": sid, "group_id": sid, "prompt_tokens": 300,
                       "response_tokens": sum(comps) + (tool if two else 0), "n_turns": len(comps),
                       "n_tool_calls": int(two), "validate": False})
        for t, c in enumerate(comps):
            t_rows.append({"step": k, "sample_id": sid, "turn": t, "completion_tokens": c})
        if two:
            c_rows.append({"step": k, "sample_id": sid, "turn": 0, "call_index": 0, "tool_name": "search",
                           "latency_s": 0.5 + j / 100, "status": "success", "response_tokens": tool})
    lit = pl.lit("bt")
    return {"samples": conform(pl.DataFrame(s_rows).with_columns(run_id=lit), "samples"),
            "turns": conform(pl.DataFrame(t_rows).with_columns(run_id=lit), "turns"),
            "tool_calls": conform(pl.DataFrame(c_rows).with_columns(run_id=lit), "tool_calls")}


def test_fit_by_turns_by_hand():
    from analyses.fit.workload import fit_by_turns, training_samples

    r = _by_turns_run()
    v = fit_by_turns(training_samples(r["samples"]), r["turns"], r["tool_calls"])
    assert sorted(v["completion_by_turns"]) == ["1", "2"]
    assert sorted(v["completion_by_turns"]["2"]) == ["final", "tool_turn"] and list(v["completion_by_turns"]["1"]) == ["final"]
    assert list(v["tool_response_by_turns"]) == ["search"] and list(v["tool_response_by_turns"]["search"]) == ["2"]
    # 40 values each: no threshold leaves 20 exceedances -> no GPD, the knots run min..max;
    # the median of 100..139 is 119.5 -> rounded half to even: 120
    fin = marginal(v["completion_by_turns"]["2"]["final"])
    assert fin.knots[0] == 100 and fin.knots[-1] == 139 and fin.ppf(np.array([0.5])).tolist() == [120]
    assert marginal(v["tool_response_by_turns"]["search"]["2"]).ppf(np.array([0.0, 1 - 1e-12])).tolist() == [500, 539]


def test_by_turns_sampler_uses_the_conditionals_and_selection_is_recorded():
    r = _by_turns_run()
    w = fit_workload_selected(r["samples"], turns=r["turns"], tool_calls=r["tool_calls"], run_id="bt")
    assert w["multiturn_selection"]["selected"] in ("pooled", "by_turns")
    assert set(w["multiturn_selection"]["mean_accuracy_pct"]) == {"pooled", "by_turns"}
    assert len(w["multiturn_selection"]["baseline_scores"]) == 1  # origins(4) = [3]
    assert validate_spec(build_spec({"bt": w}, ["bt"])) == []
    from analyses.fit.workload import fit_workload

    w = fit_workload(r["samples"], turns=r["turns"], tool_calls=r["tool_calls"], run_id="bt", by_turns=True)
    g = generate(w, [4, 5], seed=0)
    t = g.turns.join(g.samples.select("step", "group", "sample_index", "n_turns"), on=["step", "group", "sample_index"])
    t = t.with_columns(final=pl.col("turn") == pl.col("n_turns") - 1)
    lo_hi = {(1, True): (200, 239), (2, False): (10, 49), (2, True): (100, 139)}
    for (nt, fin), (lo, hi) in lo_hi.items():
        c = t.filter((pl.col("n_turns") == nt) & (pl.col("final") == fin))["completion_tokens"]
        assert c.len() > 0 and lo <= c.min() and c.max() <= hi, (nt, fin)
    calls = g.tool_calls
    assert calls.height > 0 and calls["response_tokens"].min() >= 500 and calls["response_tokens"].max() <= 539
