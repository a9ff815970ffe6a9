"""The seeded sampler: determinism, batch shape, group structure, caps, multi-turn consistency."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_multiturn, synth_samples

from analyses.fit.joint import icc_oneway, normal_scores
from analyses.fit.sampler import draw_steps, generate, steps_for
from analyses.fit.workload import fit_workload


@pytest.fixture(scope="module")
def workload() -> dict:
    return fit_workload(synth_samples(steps=6, prompts=32, n=8, within=0.5, cap=2000, seed=0), run_id="synth", task="math")


def test_same_seed_same_numbers_and_steps_are_independent(workload):
    a = generate(workload, [0, 1, 2], seed=11).samples
    b = generate(workload, [0, 1, 2], seed=11).samples
    assert a.equals(b)
    only1 = generate(workload, [1], seed=11).samples
    assert only1.equals(a.filter(pl.col("step") == 1))  # a step does not depend on the others
    c = generate(workload, [0, 1, 2], seed=12).samples
    assert not a["response_tokens"].equals(c["response_tokens"])


def test_same_seed_same_bytes(workload, tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    generate(workload, [0, 1], seed=3).samples.write_parquet(a)
    generate(workload, [0, 1], seed=3).samples.write_parquet(b)
    assert a.read_bytes() == b.read_bytes()


def test_many_seeds_at_once_equal_one_seed_at_a_time(workload):
    # draw_steps (what selection and fidelity score) and generate (what exports write) share every draw
    # but the level's own uncertainty, which only a forecast's ensemble draws
    d = draw_steps(workload, [2, 5], seeds=[7, 8, 9], level_uncertainty=False)
    for i, seed in enumerate((7, 8, 9)):
        g = generate(workload, [2, 5], seed=seed).samples
        for j, k in enumerate((2, 5)):
            one = g.filter(pl.col("step") == k)
            assert d.response[i * 2 + j].astype(np.int64).tolist() == one["response_tokens"].to_list()
            assert d.prompt[i * 2 + j].astype(np.int64).tolist() == one["prompt_tokens"].to_list()


def test_batch_shape_ranks_and_cap(workload):
    b = workload["batch"]
    assert (b["prompts_per_step"], b["samples_per_prompt"], b["dp_ranks"], b["rank_of_dp"], b["tp_size"]) == (32, 8, [0, 1], [0, 4], 4)
    g = generate(workload, steps_for(workload, 2), seed=0).samples
    assert g.height == 2 * 32 * 8
    per = g.group_by("step", "dp_rank").agg(pl.col("group").n_unique().alias("prompts"), pl.col("local_index").max().alias("li"))
    assert per["prompts"].to_list() == [16] * 4 and per["li"].to_list() == [15] * 4
    assert g["response_tokens"].max() <= 2000 and g["response_tokens"].min() >= 1
    assert (g["truncated"] == (g["response_tokens"] >= 2000)).all()
    # prompts are constant within a group
    assert (g.group_by("step", "group").agg(pl.col("prompt_tokens").n_unique())["prompt_tokens"] == 1).all()


def test_generated_lengths_keep_marginal_and_group_correlation(workload):
    g = generate(workload, list(range(40)), seed=3).samples
    real = synth_samples(steps=40, prompts=32, n=8, within=0.5, cap=2000, seed=99)
    # medians agree within a few percent (lognormal median = e^6 = 403)
    assert g["response_tokens"].median() == pytest.approx(real["response_tokens"].median(), rel=0.06)
    grp = (g["step"] * 100 + g["group"]).to_numpy()
    assert icc_oneway(normal_scores(g["response_tokens"].to_numpy()), grp) == pytest.approx(0.5, abs=0.08)


def test_multiturn_generation_is_internally_consistent():
    mt = synth_multiturn(steps=2, prompts=16, n=4)
    w = fit_workload(mt["samples"], turns=mt["turns"], tool_calls=mt["tool_calls"], run_id="mt", task="search")
    assert w["batch"]["multi_turn"]
    g = generate(w, [0, 1], seed=5)
    assert g.turns is not None and g.tool_calls is not None
    keys = ["step", "group", "sample_index"]
    t = g.turns.group_by(keys).agg(pl.len().alias("nt"), pl.col("tool_call_count").sum().alias("nc"))
    j = g.samples.join(t, on=keys)
    assert j.height == g.samples.height  # every trajectory has turns (else the checks below are vacuous)
    assert (j["nt"] == j["n_turns"]).all() and (j["nc"] == j["n_tool_calls"]).all()
    assert g.tool_calls.height == int(g.samples["n_tool_calls"].sum())
    # the final turn never calls a tool; earlier ones do
    last = g.turns.filter(pl.col("turn") == pl.col("turn").max().over(keys))
    assert (last["tool_call_count"] == 0).all()
    # later turns see a longer prompt (context grows)
    two = g.turns.filter(pl.col("turn") <= 1).pivot("turn", index=keys, values="prompt_tokens").drop_nulls()
    assert two.height > 0  # some trajectories have a second turn
    assert (two["1"] > two["0"]).all()
    assert np.all(g.tool_calls["latency_s"].to_numpy() > 0)


def test_tool_failures_at_the_fitted_rate_with_their_status():
    mt = synth_multiturn(steps=2, prompts=16, n=4)
    tc = mt["tool_calls"]
    # every 5th call fails, two thirds of those by timeout: rate 0.2, statuses timeout 2/3 / error 1/3
    st = ["success"] * 4 + ["timeout"]
    status = [st[i % 5] if (i // 5) % 3 else ("error" if i % 5 == 4 else "success") for i in range(tc.height)]
    tc = tc.with_columns(status=pl.Series(status))
    w = fit_workload(mt["samples"], turns=mt["turns"], tool_calls=tc, run_id="mt", task="search")
    tool = w["variables"]["tools"]["search"]
    failed = [x for x in status if x != "success"]
    assert tool["failure_rate"] == pytest.approx(len(failed) / len(status))
    assert tool["failure_statuses"] == pytest.approx({"error": failed.count("error") / len(failed),
                                                      "timeout": failed.count("timeout") / len(failed)})
    calls = pl.concat([generate(w, [0, 1, 2, 3], seed=k).tool_calls for k in range(40)])
    got = calls["status"].value_counts()
    share = {r["status"]: r["count"] / calls.height for r in got.iter_rows(named=True)}
    assert share.get("success", 0) == pytest.approx(1 - tool["failure_rate"], abs=0.02)
    fails = calls.filter(pl.col("status") != "success")["status"]
    assert set(fails.unique()) == {"error", "timeout"}
    assert float((fails == "timeout").mean()) == pytest.approx(tool["failure_statuses"]["timeout"], abs=0.05)


def test_no_recorded_failure_no_generated_failure():
    mt = synth_multiturn(steps=2, prompts=8, n=4)  # every call a success
    w = fit_workload(mt["samples"], turns=mt["turns"], tool_calls=mt["tool_calls"], run_id="mt", task="search")
    assert w["variables"]["tools"]["search"]["failure_rate"] == 0.0
    assert generate(w, [0], seed=0).tool_calls["status"].unique().to_list() == ["success"]


def test_drift_makes_step_k_look_like_step_k():
    # log-scale trend 0.05/step over steps 0..11 (synth truth): step 11 is e^0.55 = 1.73x step 0
    s = synth_samples(steps=12, prompts=32, n=8, within=0.2, cap=None, slope=0.05, seed=4)
    w = fit_workload(s, run_id="drift", task="math")
    assert w["drift"]["kind"] == "linear_log_scale"
    g = pl.concat([generate(w, [0, 11], seed=k).samples for k in range(5)])
    med = g.group_by("step").agg(pl.col("response_tokens").median()).sort("step")["response_tokens"].to_list()
    assert med[1] / med[0] == pytest.approx(np.exp(0.55), rel=0.15)


def test_exports_are_at_the_fitted_level_forecasts_draw_its_uncertainty(workload):
    from analyses.fit.sampler import Compiled, replay_level

    c = Compiled(workload)
    assert replay_level(c, 3, "k", level_uncertainty=False) == ((0.0, c.drift.step_sd), (0.0, c.lat_drift.step_sd))
    drawn = {replay_level(c, s, "k")[0] for s in range(20)}
    assert len(drawn) == 20  # every forecast seed draws its own level offset and step sd


def test_a_tail_scale_effect_is_seeded_and_shared_by_both_entry_points(workload):
    # a step's tail-scale effect is drawn from the step's own stream, after its heavy-step draw
    r = workload["variables"]["response_tokens"]
    w = {**workload, "variables": {**workload["variables"], "response_tokens": {**r, "tail_sd": 0.5}}}
    a = generate(w, [0, 1], seed=3).samples
    assert a.equals(generate(w, [0, 1], seed=3).samples)
    assert a.equals(generate(w, [1, 0], seed=3).samples.sort("step", maintain_order=True))
    d = draw_steps(w, [0, 1], seeds=[3], level_uncertainty=False)
    assert d.response.astype(np.int64).ravel().tolist() == a["response_tokens"].to_list()
    # and it is drawn: the same seed gives other lengths than without the effect
    b = generate(workload, [0, 1], seed=3).samples
    assert not a["response_tokens"].equals(b["response_tokens"])
