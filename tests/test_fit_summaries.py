"""The fit from per-step summaries (issue 23): the statistics each framework prints, read from the
warehouse of real step-only runs (verl old and new keys, agentic verl, verl's JSONL file logger, TRL
and Unsloth consoles, trainer_state.json); the shared-shape model recovered from summaries computed
by hand from known distributions; the spec entry, the sampler and the exports it feeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_samples

from analyses.cli import main
from analyses.export.registry import ExportError, export
from analyses.export.spec import build_spec, validate_spec
from analyses.fit.data import load_summaries, training_samples
from analyses.fit.drift import step_variance
from analyses.fit.sampler import draw_steps, generate, replay_spread
from analyses.fit.select import fit_summaries_selected
from analyses.fit.stepshape import StepShape, capped_mean, mid_mean, solve_levels
from analyses.fit.summaries import BatchFacts, summaries_from_metrics, summaries_from_samples
from analyses.fit.summary_fit import (
    SPELLINGS,
    LengthSummaries,
    fit_levels,
    fit_workload_from_summaries,
    summary_check,
    within_from_seqlen,
)
from analyses.ingest import ingest_run
from analyses.run_facts import config_dump_facts
from analyses.warehouse import scan_table

# ------------------------------------------------------------------ the shape's arithmetic, by hand


def test_a_normal_body_has_the_lognormal_moments():
    # log length ~ N(mu, s^2): E[length] = exp(mu + s^2 / 2); the level solved from it is mu again
    sh = StepShape("normal", 0.5, 0.0, 0.0, 5.0, 5.0)
    mu = np.array([5.0, 6.0])
    assert capped_mean(sh, mu, None) == pytest.approx(np.exp(mu + 0.125), rel=1e-6)
    tgt = mid_mean(sh, mu, np.array([10.0, 10.0]), np.array([900.0, 900.0]))
    assert solve_levels(sh, tgt, np.array([10.0, 10.0]), np.array([900.0, 900.0])) == pytest.approx(mu, abs=1e-6)
    # a cap at the median: E[min(X, cap)] = E[X; X < cap] + cap / 2
    cap = math.exp(5.0)
    assert capped_mean(sh, np.array([5.0]), cap)[0] < cap


def test_a_log_logistic_run_is_recovered_from_its_summaries():
    """Lengths exp(mu_k + 0.3 L), L standard logistic, 512 per step, a cap at 4000: the summaries
    verl would print (mean, min, max, clip ratio, n) give the scale and each step's level back."""
    rng = np.random.default_rng(7)
    steps, n, s_true = 8, 512, 0.3
    mu = 6.0 + 0.05 * rng.standard_normal(steps)
    rows = []
    for k in range(steps):
        x = np.minimum(np.rint(np.exp(mu[k] + s_true * rng.logistic(size=n))), 4000)
        rows.append({"step": k, "n": float(n), "response_mean": x.mean(), "response_min": x.min(), "response_max": x.max(),
                     "response_clip_ratio": float(np.mean(x >= 4000)), "averaged_steps": 1.0})
    d = LengthSummaries.from_frame(pl.DataFrame(rows), "response", "n", 4000.0, SPELLINGS)
    fit = fit_levels(d)
    assert fit.shape.s == pytest.approx(s_true, abs=0.05)  # 15% of the scale, from 16 extremes
    # each level within 3 of its stated standard errors (~0.027: a mean of 510 draws with sd 0.54 on the log axis)
    se = np.sqrt(fit.mu_var)
    assert np.all(se < 0.04) and np.all(np.abs(fit.mu - mu) < 3 * se)
    assert set(d.statistics) == {"response_length/mean", "response_length/min", "response_length/max",
                                 "response_length/clip_ratio"}


def test_a_runaway_is_contamination_not_the_bodys_spread():
    # the same run with a 16,000-token runaway in two steps: the body's scale stays, eps_hi takes it
    rng = np.random.default_rng(3)
    rows = []
    for k in range(8):
        x = np.rint(np.exp(5.0 + 0.2 * rng.logistic(size=512)))
        if k in (2, 5):
            x[0] = 15000
        rows.append({"step": k, "n": 512.0, "response_mean": x.mean(), "response_min": x.min(), "response_max": x.max(),
                     "response_clip_ratio": 0.0, "averaged_steps": 1.0})
    fit = fit_levels(LengthSummaries.from_frame(pl.DataFrame(rows), "response", "n", None, SPELLINGS))
    assert fit.shape.s == pytest.approx(0.2, abs=0.04)
    assert fit.shape.eps_hi > 1e-4


def test_step_variance_is_the_residual_variance_minus_sampling_with_equal_weights():
    resid = np.array([0.1, -0.1, 0.2, -0.2])
    # equal v: (sum r^2 / dof) - v = (0.1 / 3) - 0.01
    assert step_variance(resid, np.full(4, 0.01), 3.0) == pytest.approx(0.1 / 3 - 0.01)
    # a noisy step (v = 1) no longer hides the others' spread
    v = np.array([0.001, 0.001, 0.001, 1.0])
    assert step_variance(resid, v, 3.0) > step_variance(resid, np.full(4, float(v.mean())), 3.0)


# ------------------------------------------------------------------ the fit on per-sample truth


@pytest.fixture(scope="module")
def synth_run() -> pl.DataFrame:
    return training_samples(synth_samples(steps=6, prompts=16, n=8, within=0.3, sigma=0.5, cap=3000, seed=11))


def test_summaries_from_samples_are_what_verl_prints(synth_run):
    summ = summaries_from_samples(synth_run, 3000.0, samples_per_prompt=8)
    s0 = synth_run.filter(pl.col("step") == 0)
    row = summ.row(0, named=True)
    r = s0["response_tokens"].cast(pl.Float64)
    assert (row["n"], row["response_min"], row["response_max"]) == (128.0, r.min(), r.max())
    assert row["response_mean"] == pytest.approx(r.mean())
    # global_seqlen: prompt + response tokens of each DP rank's contiguous chunk (2 ranks here)
    per_rank = s0.group_by("dp_rank").agg(t=(pl.col("prompt_tokens") + pl.col("response_tokens")).sum())["t"]
    assert (row["seqlen_min"], row["seqlen_max"], row["seqlen_ranks"]) == (per_rank.min(), per_rank.max(), 2.0)
    assert row["n_prompts"] == 16.0


def test_spec_from_summaries_validates_and_says_where_it_came_from(synth_run):
    summ = summaries_from_samples(synth_run, 3000.0, samples_per_prompt=8)
    w = fit_workload_from_summaries(summ, run_id="synth", task="math", max_response_length=3000.0, samples_per_prompt=8)
    assert validate_spec(build_spec({"synth": w}, ["synth"])) == []
    r = w["variables"]["response_tokens"]
    assert r["fitted_from"] == "summaries" and "response_length/max" in r["statistics"]
    assert r["censor_at"] == 3000.0 and r["scipy_fallback"]["family"] in ("fisk", "weibull_min", "burr12")
    assert w["source"]["kind"] == "summaries" and w["source"]["n_source"] == "samples"
    assert w["source"]["within_group_corr"] == "global_seqlen"
    assert w["batch"]["prompts_per_step"] == 16 and w["batch"]["samples_per_prompt"] == 8 and w["batch"]["dp_ranks"] == [0, 1]
    # the fitted per-step quantiles against the logged ones: the median sits between min and max
    chk = summary_check(w, summ)
    assert chk.height == 6
    assert (chk["fitted_p50"] > chk["logged_min"]).all() and (chk["fitted_p50"] < chk["logged_max"]).all()
    assert ((chk["fitted_mean"] - chk["logged_mean"]).abs() / chk["logged_mean"] < 0.1).all()


def test_within_group_correlation_from_global_seqlen(synth_run):
    # strongly correlated groups (rho 0.9) against independent ones (0): the ranks' sums say which
    def rho_of(within: float) -> float:
        s = training_samples(synth_samples(steps=8, prompts=32, n=8, dp=4, within=within, sigma=0.6, cap=None, seed=2))
        summ = summaries_from_samples(s, None, samples_per_prompt=8)
        resp = LengthSummaries.from_frame(summ, "response", "n", None, SPELLINGS)
        return within_from_seqlen(summ, fit_levels(resp, per_prompt=8), None, 8)

    assert rho_of(0.9) > rho_of(0.0) + 0.3


def test_sampler_draws_a_multi_turn_summary_workload_with_whole_responses():
    summ = pl.DataFrame({"step": [1, 2, 3], "n": [64.0] * 3, "response_mean": [900.0, 950.0, 920.0],
                         "response_min": [40.0, 35.0, 50.0], "response_max": [4000.0, 3800.0, 4100.0],
                         "response_clip_ratio": [0.0] * 3, "prompt_mean": [300.0] * 3, "prompt_min": [250.0] * 3,
                         "prompt_max": [400.0] * 3, "turns_mean": [3.0, 3.2, 2.9], "turns_min": [1.0] * 3,
                         "turns_max": [6.0] * 3, "tool_time_mean": [0.8, 0.9, 0.7], "tool_time_min": [0.0] * 3,
                         "tool_time_max": [6.0, 5.5, 7.0], "averaged_steps": [1.0] * 3, "n_source": ["config"] * 3})
    w = fit_workload_from_summaries(summ, run_id="agent", samples_per_prompt=8)
    assert w["batch"]["multi_turn"] and w["batch"]["trajectory_response"] == "marginal"
    assert w["variables"]["n_turns"]["support"] == [1, 2, 3, 4, 5, 6]
    assert w["variables"]["tools"]["tool"]["latency_s"]["fitted_from"] == "summaries"
    g = generate(w, [1, 2], seed=0)
    per = g.turns.group_by("step", "group", "sample_index").agg(c=pl.col("completion_tokens").sum())
    joined = g.samples.join(per, on=["step", "group", "sample_index"])
    assert (joined["c"] == joined["response_tokens"]).all()  # the turns share the whole response
    assert (g.tool_calls["response_tokens"] == 0).all()
    assert (g.samples["n_turns"] - 1 == g.samples["n_tool_calls"]).all()


def test_spread_uncertainty_is_drawn_only_by_summary_workloads(synth_run):
    summ = summaries_from_samples(synth_run, 3000.0, samples_per_prompt=8)
    w = fit_workload_from_summaries(summ, run_id="synth", max_response_length=3000.0, samples_per_prompt=8)
    from analyses.fit.sampler import Compiled

    c = Compiled(w)
    assert c.mr.spread_se > 0
    assert len({replay_spread(c, sd, "k") for sd in range(5)}) == 5
    assert replay_spread(c, 0, "k", level_uncertainty=False) == 1.0  # an export is the workload as fitted
    d = draw_steps(w, [6, 7], seeds=range(3))
    assert d.response.shape == (6, 128)


def test_selection_between_smooth_and_heavy_uses_the_logged_statistics(synth_run):
    summ = summaries_from_samples(synth_run, 3000.0, samples_per_prompt=8)
    w = fit_summaries_selected(summ, run_id="synth", max_response_length=3000.0, samples_per_prompt=8)
    sel = w["selection"]
    assert sel["selected"] in ("smooth", "heavy", "iid") and set(sel["relative_crps"]) == {"smooth", "heavy", "iid"}
    assert len(sel["origins"]) == 3


# ------------------------------------------------------------------ every summary source, real logs


def _summaries(path: Path, tmp_path: Path, run_id: str):
    wh = tmp_path / "wh"
    ingest_run(path, wh, run_id=run_id)
    return load_summaries(wh, run_id)


@pytest.mark.real_logs
def test_verl_old_keys_console(real_file, tmp_path):
    sf = _summaries(real_file("verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"), tmp_path, "old")
    # the dump: data.train_batch_size 256, rollout n 1, max_prompt_length 1024; step 1 as logged
    assert (sf.facts.train_batch_size, sf.facts.rollout_n, sf.facts.max_prompt_length) == (256, 1, 1024)
    row = sf.summaries.filter(pl.col("step") == 1).row(0, named=True)
    assert (row["n"], row["n_source"]) == (256.0, "config")
    assert (row["response_mean"], row["response_max"], row["response_min"]) == (303.625, 512.0, 73.0)
    assert row["prompt_mean"] == 105.523 and row["seqlen_min"] is None
    w = fit_workload_from_summaries(sf.summaries.head(12), run_id="old", max_response_length=sf.max_response_length,
                                    samples_per_prompt=sf.facts.rollout_n)
    assert w["variables"]["response_tokens"]["censor_at"] == 512 and w["batch"]["prompts_per_step"] == 256


@pytest.mark.real_logs
def test_agentic_verl_turns_tool_time_and_tokens(real_file, tmp_path):
    sf = _summaries(real_file("verl_agentic_open-agentrl/run-20251130_144822-gjvwlq13/files/output.log"), tmp_path, "ag")
    row = sf.summaries.filter(pl.col("step") == 1).row(0, named=True)
    # perf/total_num_tokens 668901 / (prompt 336.438 + response 970.01) = 512; / global_seqlen/mean 167225.25 = 4 ranks
    assert (row["n"], row["n_source"], row["seqlen_ranks"]) == (512.0, "tokens", 4.0)
    # num_turns min 2 / mean 6.598 / max 16 are messages: 1 / 3.299 / 8 assistant turns
    assert (row["turns_min"], row["turns_max"]) == (1.0, 8.0) and row["turns_mean"] == pytest.approx(3.299, abs=1e-3)
    assert row["tool_time_max"] == pytest.approx(5.063, abs=1e-3)
    w = fit_workload_from_summaries(sf.summaries.head(10), run_id="ag", max_response_length=sf.max_response_length)
    assert w["batch"]["multi_turn"] and "tools" in w["variables"] and "tool_latency_drift" in w
    assert "samples_per_prompt" in w["source"]["assumed"]


@pytest.mark.real_logs
def test_verl_jsonl_file_logger(real_file, tmp_path):
    sf = _summaries(real_file("verl_jsonl_filelogger/HanlinDu_verl/verl_examples/gsm8k.jsonl"), tmp_path, "jl")
    assert sf.summaries["step"].to_list() == [1, 2, 3]  # step 0 holds validation only
    assert sf.summaries["n"].null_count() == 0


@pytest.mark.real_logs
def test_trl_console_averages_over_the_logging_interval(real_file, tmp_path):
    sf = _summaries(real_file("trl_grpo_terminal"), tmp_path, "trl")
    s = sf.summaries
    # four log dicts, every 10 steps: each averages 10 generation batches; no batch size in the log
    assert s["step"].to_list()[:4] == [10, 20, 30, 40] and s["averaged_steps"].to_list()[:4] == [10.0] * 4
    assert s["response_min"][0] == 47.4 and s["n"].null_count() == s.height
    with pytest.raises(ValueError, match="train_batch_size and rollout_n in run.toml"):
        fit_workload_from_summaries(s, run_id="trl")
    # with the batch declared (run.toml), it fits: min and max as means of per-step extremes
    w = fit_workload_from_summaries(summaries_from_metrics(scan_table(tmp_path / "wh", "step_metrics").collect(),
                                                           BatchFacts(step_samples=32)), run_id="trl",
                                    max_response_length=sf.max_response_length)
    assert w["source"]["n_source"] == "config" and "prompt_tokens" in w["variables"]


@pytest.mark.real_logs
def test_unsloth_console_banner_gives_the_batch(real_file, tmp_path):
    sf = _summaries(real_file("unsloth_grpo"), tmp_path, "un")
    assert (sf.facts.step_samples, sf.facts.rollout_n) == (4, 4)  # "Total batch size (4 x 1 x 1) = 4", num_generations 4
    w = fit_workload_from_summaries(sf.summaries, run_id="un", samples_per_prompt=4)
    # num_tokens 3127 after step 1: (3127 - 4 x 666.75) / 4 = 115 prompt tokens; step 2: (3350 - 2890) / 4 = 115
    assert w["variables"]["prompt_tokens"]["values"] == [115.0]
    assert w["batch"]["prompts_per_step"] == 1 and w["batch"]["samples_per_prompt"] == 4


def test_trainer_state_json(tmp_path):
    fixture = Path(__file__).parent / "fixtures" / "trl_trainer_state" / "nan_eval_summary_entry_without_step.json"
    sf = _summaries(fixture, tmp_path, "ts")
    assert sf.facts.step_samples == 8  # "train_batch_size": 8
    assert sf.summaries["response_mean"].to_list()[:3] == [100.0, 110.0, 120.0]
    w = fit_workload_from_summaries(sf.summaries, run_id="ts", max_response_length=sf.max_response_length)
    assert w["source"]["n_source"] == "config" and w["batch"]["prompts_per_step"] * w["batch"]["samples_per_prompt"] == 8
    # no min or max logged: the mean alone sets each level, the spread is not the summaries'
    assert w["variables"]["response_tokens"]["statistics"][0] == "response_length/mean"


def test_batch_facts_from_a_config_dump_a_banner_and_a_trainer_state():
    dump = ("'actor_rollout_ref': {'rollout': {'agent': {'num_workers': 8}, 'n': 12, 'val_kwargs': {'n': 1}}},\n"
            " 'data': {'max_prompt_length': 3072, 'max_response_length': 20480, 'train_batch_size': 32},")
    f = config_dump_facts(dump)
    assert (f.train_batch_size, f.rollout_n, f.max_prompt_length, f.max_response_length) == (32, 12, 3072, 20480)
    cmd = "python3 -m verl.trainer.main_ppo data.train_batch_size=512 actor_rollout_ref.rollout.n=5"
    assert (config_dump_facts(cmd).train_batch_size, config_dump_facts(cmd).rollout_n) == (512, 5)
    banner = "We will change the batch size of 1 to the `num_generations` of 4\n   \\\\   /|    Num examples = 104,155 | " \
             "Num Epochs = 1 | Total steps = 5\nO^O/ \\_/ \\    Batch size per device = 4 | Gradient accumulation steps = 1\n" \
             "\\        /    Data Parallel GPUs = 1 | Total batch size (4 x 1 x 1) = 4"
    assert (config_dump_facts(banner).samples_per_step, config_dump_facts(banner).rollout_n) == (4, 4)
    assert config_dump_facts('{"logging_steps": 1, "train_batch_size": 8}').samples_per_step == 8


# ------------------------------------------------------------------ exports and the CLI


def test_a_format_needing_what_the_logs_lack_exits_with_one_line(tmp_path, capsys):
    summ = pl.DataFrame({"step": [1, 2, 3], "n": [8.0] * 3, "response_mean": [100.0, 110.0, 120.0],
                         "averaged_steps": [1.0] * 3, "n_source": ["config"] * 3})
    w = fit_workload_from_summaries(summ, run_id="tiny")
    assert "prompt_tokens" not in w["variables"]  # no prompt length, no token count: the logs do not say
    spec = build_spec({"tiny": w}, ["tiny"])
    with pytest.raises(ExportError, match="'prompt_tokens'.*per-step summaries do not hold it"):
        export(spec, "aiperf", tmp_path / "out")
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec))
    assert main(["export", "--spec", str(p), "--format", "vidur", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prompt_tokens" in err[0]


@pytest.mark.real_logs
def test_fit_and_every_export_for_a_step_only_run(real_file, tmp_path, capsys):
    wh = tmp_path / "wh"
    assert main(["ingest", str(real_file("verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log")), "--warehouse",
                 str(wh), "--run-id", "gemma", "-q"]) == 0
    assert main(["fit", "--warehouse", str(wh), "--out", str(tmp_path / "spec.json"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "gemma: " in out and "from summaries (n: config" in out
    from analyses.export.registry import export_formats

    spec = json.loads((tmp_path / "spec.json").read_text())
    for f in export_formats():
        files = export(spec, f.name, tmp_path / "x" / f.name, steps=2)
        assert files and f.check(tmp_path / "x" / f.name) == [], f.name


def test_fidelity_from_summaries_cli(tmp_path, capsys):
    s = synth_samples(steps=5, prompts=16, n=8, within=0.3, sigma=0.5, cap=3000, seed=4)
    run = tmp_path / "logs" / "synth"
    run.mkdir(parents=True)
    for k in range(5):
        part = s.filter(pl.col("step") == k)
        recs = part.group_by("group_id", maintain_order=True).agg(
            rank=pl.col("rank").first(), dp_rank=pl.col("dp_rank").first(), tp_rank=pl.col("tp_rank").first(),
            local_index=pl.col("local_index").first(), input=pl.col("prompt_tokens").first(), output=pl.col("response_tokens"))
        recs = recs.with_columns(step=pl.lit(k), n_sampling=pl.col("output").list.len(), validate=pl.lit(False))
        recs.select("step", "rank", "dp_rank", "tp_rank", "local_index", "input", "output", "n_sampling",
                    "validate").write_ndjson(run / f"packed_lengths_step_{k}.jsonl")
    wh = tmp_path / "wh"
    assert main(["ingest", str(run), "--warehouse", str(wh), "-q"]) == 0
    assert main(["fidelity", "synth", "--from-summaries", "--seeds", "8", "--format", "json", "--warehouse", str(wh),
                 "-q"]) == 0
    b = json.loads(capsys.readouterr().out)["summary_fit"]
    assert b["origins"] == 3 and b["cells"] == 5 * 4  # 2 + 2 + 1 predicted steps x 4 statistics
    for k in ("ks_median", "ks_sample_fit", "crps_ratio", "crps_skill", "coverage90"):
        assert math.isfinite(b[k]), k
    assert 0.0 <= b["ks_median"] <= 1.0 and b["crps_ratio"] > 0


def test_run_workload_and_report_show_the_fitted_per_step_quantiles(tmp_path):
    from analyses.api import PolyTrace
    from pipelines.assets.fit import run_fit_metadata

    pt = PolyTrace(tmp_path / "wh")
    pt.ingest(Path(__file__).resolve().parents[1] / "sample_logs" / "verl-gsm8k-ppo-v0.1", run_id="gsm8k")
    f = pt.fit_run("gsm8k", seeds=(0, 1))
    assert f.from_summaries and f.spec_path is not None and f.spec_path.exists()
    chk = f.summary_check
    steps = scan_table(tmp_path / "wh", "steps").collect()["step"].to_list()
    assert chk is not None and chk["step"].to_list() == sorted(steps)  # every logged step, fitted beside it
    meta = run_fit_metadata(f)
    assert meta["fitted_from"].value == "fitted from summaries"
    assert "| step | n | logged_min |" in meta["summary_check"].value
    html = pt.report(png=False).path.read_text()
    assert "data-group='workload'" in html and "workload__summary_check__gsm8k" in html
