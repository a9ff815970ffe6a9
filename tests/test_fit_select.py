"""The generator's response marginal (Kaplan-Meier body, censored GPD tail, trimmed fit, heavy
steps) and the choice of its options by rolling origin inside the fitted steps."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_samples
from scipy import stats

from analyses.export.formats.polytrace_params import scipy_marginal
from analyses.export.spec import build_spec, validate_spec
from analyses.fit.empirical import (
    EmpiricalTailFit,
    fit_empirical_tail,
    fit_gpd_censored,
    heavy_chain,
    heavy_step_share,
    iid_log_excess_var,
    kaplan_meier,
    km_quantile,
    tail_scale_sd,
)
from analyses.fit.marginals import marginal
from analyses.fit.sampler import generate
from analyses.fit.select import CANDIDATES, DEFAULT, choose, fit_workload_selected, without_heavy_steps


def test_kaplan_meier_by_hand():
    # values 1, 2, 3+ (censored), 4: at 1, 1 event of 4 at risk -> S = 3/4; at 2, 1 of 3 -> 1/2;
    # 3 is censored; at 4, 1 of 1 -> 0. F after each event: 1/4, 1/2, 1
    vals, cdf = kaplan_meier(np.array([1.0, 2.0, 3.0, 4.0]), np.array([False, False, True, False]))
    assert vals.tolist() == [1, 2, 4] and cdf.tolist() == pytest.approx([0.25, 0.5, 1.0])
    # without censoring it is the ECDF; quantiles sit at the middle of each jump (Hazen)
    vals, cdf = kaplan_meier(np.array([10.0, 20.0, 30.0, 40.0]), np.zeros(4, bool))
    assert km_quantile(vals, cdf, np.array([0.125, 0.25, 0.875, 1.0])).tolist() == pytest.approx([10, 15, 40, 40])


def test_censored_gpd_recovers_its_parameters():
    y = stats.genpareto.rvs(0.25, scale=100, size=20_000, random_state=3)
    xi, sigma = fit_gpd_censored(y)
    assert xi == pytest.approx(0.25, abs=0.03) and sigma == pytest.approx(100, rel=0.04)
    # the same draws cut at their 90% quantile: the cut ones say only "at least c"
    c = float(np.quantile(y, 0.9))
    xi_c, sigma_c = fit_gpd_censored(y[y < c], np.full(int(np.sum(y >= c)), c))
    assert xi_c == pytest.approx(0.25, abs=0.06) and sigma_c == pytest.approx(100, rel=0.06)
    # a naive fit that takes the cut values as exact thins the tail
    xi_naive, _ = fit_gpd_censored(np.minimum(y, c))
    assert xi_naive < xi_c - 0.2


def test_empirical_tail_body_tail_and_cap():
    rng = np.random.default_rng(0)
    x = np.rint(rng.lognormal(7, 0.8, 5000))
    cap = 4000.0
    m = fit_empirical_tail(np.minimum(x, cap), cap)
    assert m.p_cap == 0.0 and m.censor_at == cap and m.n_censored == int(np.sum(x >= cap))
    # the body is the data's own: quantiles below the threshold agree with the sample's
    q = np.array([0.1, 0.5, 0.8])
    assert m.ppf(q).tolist() == pytest.approx(np.quantile(x, q), rel=0.02)
    # the latent tail continues past the cap, so the share drawn at the cap matches the data's
    draws = m.ppf(rng.random(50_000))
    assert float(np.mean(draws == cap)) == pytest.approx(float(np.mean(x >= cap)), abs=0.01)
    assert draws.max() == cap
    # a step level scales the latent length before the cut: a higher level, more at the cap
    assert float(np.mean(m.ppf(rng.random(50_000), 1.5) == cap)) > float(np.mean(draws == cap)) + 0.05
    # round trip through the spec form
    back = marginal(m.to_dict())
    assert back.ppf(q).tolist() == m.ppf(q).tolist()


def test_spec_1_0_cap_mass_still_samples_as_before():
    # a spec-1.0 empirical_tail: knots 10..20, no tail, half the mass at the cap 100
    m = EmpiricalTailFit([10.0, 20.0], 0.0, 0.0, 1.0, 100.0, 100.0, 0.5, 10, 5)
    # u = 0.25 -> level 0.5 of the body -> 15; factor 2 -> 30; u = 0.75 is the cap whatever the factor
    assert m.ppf(np.array([0.25, 0.75]), 2.0).tolist() == [30, 100]
    assert m.ppf(np.array([0.25]), 10.0).tolist() == [100]  # the body scaled past the cap is cut there


def test_trimming_bounds_the_influence_of_runaway_values():
    rng = np.random.default_rng(1)
    normal = np.rint(rng.lognormal(5, 0.3, 10_000))
    runaway = np.concatenate([normal, [16000.0] * 8])  # 8 runaway responses in 10k
    untrimmed = fit_empirical_tail(runaway, None, trim=0.0)
    trimmed = fit_empirical_tail(runaway, None, trim=0.1)
    clean = fit_empirical_tail(normal, None, trim=0.1)
    # trimmed, the 8 count only as "at least the trim point": the tail shape is the bulk's
    assert abs(trimmed.xi - clean.xi) < 0.1 < untrimmed.xi - clean.xi
    # the values above the trim point are kept as the recorded extremes, runaways included
    assert trimmed.extremes[-1] == 16000.0 and 0.98 < trimmed.cut_level < 1.0
    # a heavy step draws its levels above cut_level from them
    v = np.array([0.5, 0.999999])
    assert trimmed.latent_ppf(v, heavy=True)[1] == pytest.approx(16000.0, rel=0.01)
    assert trimmed.latent_ppf(v, heavy=False)[1] < 16000.0
    assert trimmed.latent_ppf(v, heavy=True)[0] == trimmed.latent_ppf(v, heavy=False)[0]


def test_heavy_step_share_by_hand():
    rng = np.random.default_rng(2)
    steps = np.repeat(np.arange(10), 500)
    x = np.rint(rng.lognormal(5, 0.3, steps.size))
    x[np.flatnonzero(steps == 3)[0]] = 20000.0  # one runaway in step 3
    x[np.flatnonzero(steps == 7)[0]] = 15000.0  # and one in step 7
    cens = np.zeros(x.size, bool)
    m = fit_empirical_tail(x, None, trim=0.0)
    # 2 heavy steps of 10: (2 + 1/2) / (10 + 1)
    assert heavy_step_share(m, steps, x, cens) == pytest.approx(2.5 / 11)
    # none heavy: Jeffreys' (0 + 1/2) / 11
    assert heavy_step_share(fit_empirical_tail(np.rint(rng.lognormal(5, 0.3, 5000)), None, trim=0.0),
                            steps, np.rint(rng.lognormal(5, 0.3, steps.size)), cens) == pytest.approx(0.5 / 11)


def test_heavy_chain_by_hand():
    # quiet, quiet, quiet, heavy, heavy, heavy, quiet, quiet: transitions QQ QQ QH HH HH HQ QQ.
    # From heavy: 3, of which 2 stay heavy -> (2 + 1/2) / (3 + 1) = 0.625; from quiet: 4, of which 1
    # turns heavy -> (1 + 1/2) / (4 + 1) = 0.3; persistence 0.625 - 0.3 = 0.325
    h = np.array([0, 0, 0, 1, 1, 1, 0, 0], dtype=bool)
    assert heavy_chain(h) == pytest.approx(0.325)
    # alternating steps do not cluster: the difference is negative, no persistence
    assert heavy_chain(np.array([1, 0, 1, 0], dtype=bool)) == 0.0


def test_heavy_prob_forecast_from_the_last_fitted_step():
    m = EmpiricalTailFit([10.0, 20.0], 0.0, 0.0, 1.0, 100.0, None, 0.0, 10, 0, heavy_prob=0.3,
                         heavy_persistence=0.5, heavy_last=True, last_step=10)
    # one step on: 0.3 + (1 - 0.3) * 0.5; two: 0.3 + 0.7 * 0.25; the fitted steps and exports: the share
    assert m.heavy_prob_at(11) == pytest.approx(0.65)
    assert m.heavy_prob_at(12) == pytest.approx(0.475)
    assert m.heavy_prob_at(10) == m.heavy_prob_at(11, forecast=False) == 0.3
    # no heavy steps (a smooth candidate): none forecast either, whatever the last state
    m.heavy_prob = 0.0
    assert m.heavy_prob_at(11) == 0.0
    assert marginal({**m.to_dict(), "heavy_prob": 0.3}).heavy_prob_at(11) == pytest.approx(0.65)


def test_tail_scale_sd_by_hand():
    # a tail-only marginal: threshold 100, exponential excesses of scale 1e6 (so the floor of 1
    # on an excess never bites); the longest of one draw is one exponential, and
    # var(log(Exp)) = pi^2 / 6
    m = EmpiricalTailFit([100.0, 100.0], 1.0, 0.0, 1e6, 1e300, None, 0.0, 10, 0)
    assert iid_log_excess_var(m, 1.0) == pytest.approx(np.pi**2 / 6, abs=0.01)
    # quiet steps' log excesses 0, 2, 4 (sample variance 4) around log(1e6): tau^2 = 4 - pi^2 / 6
    top = 100.0 + 1e6 * np.exp(np.array([0.0, 2.0, 4.0, 9.0, 0.0]))
    top[4] = np.inf  # a step cut at the cap: only "at least" known, left out
    n_k = np.ones(5)
    quiet = np.array([True, True, True, False, True])  # step 3 is heavy: the chain's, left out
    assert tail_scale_sd(m, n_k, top, quiet) == pytest.approx(np.sqrt(4 - np.pi**2 / 6), abs=0.01)
    # the same spread as i.i.d. draws give: no effect; fewer than 3 quiet steps: none estimated
    assert tail_scale_sd(m, n_k, 100.0 + 1e6 * np.exp(np.array([0.0, 0.5, 1.0, 0, 0])), quiet) == 0.0
    assert tail_scale_sd(m, n_k[:2], top[:2], quiet[:2]) == 0.0


def test_tail_scale_multiplies_the_gpd_excess_only():
    m = EmpiricalTailFit([10.0, 20.0], 0.5, 0.0, 5.0, 1e300, None, 0.0, 10, 0)
    v = np.array([0.25, 0.75])  # a body level, and a tail level: excess -5 log(1 - 0.5) = 5 log 2
    assert m.latent_ppf(v, tail_scale=3.0).tolist() == pytest.approx([15.0, 20.0 + 15.0 * np.log(2)])
    assert m.latent_ppf(v, tail_scale=np.array([1.0, 3.0]))[1] == pytest.approx(20.0 + 15.0 * np.log(2))


def test_choose_takes_the_lowest_score_and_the_default_on_ties():
    assert choose({"a": 0.2, "b": 0.1}, "a") == "b"
    assert choose({"a": 0.1, "b": 0.1}, "b") == "b"
    assert choose({}, "a") == "a"


def test_selected_fit_is_validated_inside_the_fitted_steps_and_exportable():
    s = synth_samples(steps=6, prompts=16, n=4, cap=2000, slope=0.05, seed=3)
    w = fit_workload_selected(s, run_id="sel", task="math")
    sel = w["selection"]
    assert set(sel["relative_crps"]) == set(CANDIDATES) and sel["default"] == DEFAULT
    assert sel["selected"] == min(sel["relative_crps"], key=lambda k: sel["relative_crps"][k])
    # the last 3 origins inside steps 0..5, each predicting the next one or two fitted steps
    assert [(o["fitted_steps"], o["predicted_steps"]) for o in sel["origins"]] == [
        ([0, 1, 2], [3, 4]), ([0, 1, 2, 3], [4, 5]), ([0, 1, 2, 3, 4], [5])]
    assert validate_spec(build_spec({"sel": w}, ["sel"])) == []
    g = generate(w, [6, 7], seed=0).samples
    assert g.height == 2 * 16 * 4 and int(g["response_tokens"].max()) <= 2000
    out = scipy_marginal(w["variables"]["response_tokens"])
    assert "type" in out and out.get("censor_at") == 2000
    assert without_heavy_steps(w)["variables"]["response_tokens"]["heavy_prob"] == 0.0


def test_origins_of_a_fidelity_check_share_their_validations():
    """Origin k validates on the prefixes ending at k-1..k-3, origin k+1 on k..k-2: with the memo
    passed along each prefix is fitted (and each forecast scored) once, with the same result."""
    from analyses.fit.data import training_samples
    from analyses.fit.rolling import RealSteps

    s = synth_samples(steps=6, prompts=16, n=4, cap=2000, slope=0.05, seed=3)
    real = RealSteps.build(training_samples(s), None, None, False)
    memo: dict = {}
    for last in (4, 5):
        prefix = s.filter(pl.col("step") <= last)
        shared = fit_workload_selected(prefix, real=real, memo=memo, run_id="sel")
        alone = fit_workload_selected(prefix, real=real, run_id="sel")
        assert shared == alone
    # 3 + 1 new prefixes, 2 fits each (the window; heavy or not shares one); the origin ([0..3], [4])
    # of the first call and ([0..3], [4, 5]) of the second are different forecasts
    assert sum(k[0] == "fit" for k in memo) == 2 * 4
    assert sum(k[0] == "score" for k in memo) == len(CANDIDATES) * (3 + 2)


def test_short_runs_keep_the_default():
    s = synth_samples(steps=2, prompts=8, n=4, seed=0)
    w = fit_workload_selected(s, run_id="short")
    assert w["selection"]["selected"] == DEFAULT and w["selection"]["origins"] == []


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
    from analyses.fit.data import training_samples
    from analyses.fit.workload import fit_by_turns

    r = _by_turns_run()
    v = fit_by_turns(training_samples(r["samples"]), r["turns"], r["tool_calls"])
    assert sorted(v["completion_by_turns"]) == ["1", "2"]
    assert sorted(v["completion_by_turns"]["2"]) == ["final", "tool_turn"] and list(v["completion_by_turns"]["1"]) == ["final"]
    assert list(v["tool_response_by_turns"]) == ["search"] and list(v["tool_response_by_turns"]["search"]) == ["2"]
    # 40 values each, no tail (no extrapolation): the knots run min..max; the median of 100..139
    # is 119.5 -> rounded half to even: 120
    fin = marginal(v["completion_by_turns"]["2"]["final"])
    assert fin.knots[0] == 100 and fin.knots[-1] == 139 and fin.ppf(np.array([0.5])).tolist() == [120]
    assert marginal(v["tool_response_by_turns"]["search"]["2"]).ppf(np.array([0.0, 1 - 1e-12])).tolist() == [500, 539]


def test_by_turns_sampler_uses_the_conditionals_and_selection_is_recorded():
    r = _by_turns_run()
    w = fit_workload_selected(r["samples"], turns=r["turns"], tool_calls=r["tool_calls"], run_id="bt")
    assert w["selection"]["selected"] in ("pooled", "by_turns")
    assert set(w["selection"]["relative_crps"]) == {"pooled", "by_turns"}
    assert len(w["selection"]["origins"]) == 2  # 4 steps: fit 2 predict 2, fit 3 predict 1
    assert validate_spec(build_spec({"bt": w}, ["bt"])) == []
    from analyses.fit.workload import fit_workload

    w = fit_workload(r["samples"], turns=r["turns"], tool_calls=r["tool_calls"], run_id="bt", by_turns=True)
    g = generate(w, [4, 5], seed=0)
    t = g.turns.join(g.samples.select("step", "group", "sample_index", "n_turns"), on=["step", "group", "sample_index"])
    t = t.with_columns(final=pl.col("turn") == pl.col("n_turns") - 1)
    # the conditional ranges, up to the replay's response level (steps here differ by sampling only:
    # a few percent)
    lo_hi = {(1, True): (200, 239), (2, False): (10, 49), (2, True): (100, 139)}
    for (nt, fin), (lo, hi) in lo_hi.items():
        c = t.filter((pl.col("n_turns") == nt) & (pl.col("final") == fin))["completion_tokens"]
        assert c.len() > 0 and 0.9 * lo <= c.min() and c.max() <= 1.1 * hi, (nt, fin)
    calls = g.tool_calls
    assert calls.height > 0 and calls["response_tokens"].min() >= 0.9 * 500 and calls["response_tokens"].max() <= 1.1 * 539
