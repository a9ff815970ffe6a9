"""Fidelity protocol: baseline port, per-step statistics, the split, scores; the CLI on a real run."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_samples

from analyses.cli import main
from analyses.fit.baseline import histogram_resample
from analyses.fit.data import RunFrames
from analyses.fit.fidelity import fidelity, split_run, step_statistics


def test_histogram_resample_by_hand():
    # values 0,0,0,0,10: 2 distinct -> 2 bins of width 5; bin 0 gets int(4/5*5)=4 draws of 0, bin 1 gets 1 of 10
    out = histogram_resample(np.array([0, 0, 0, 0, 10.0]) , 5, np.random.default_rng(0))
    assert sorted(out.tolist()) == [0, 0, 0, 0, 10]
    # asking for at least as many as recorded: the recorded values (shuffled) plus draws from them
    out = histogram_resample(np.array([1.0, 2.0, 3.0]), 5, np.random.default_rng(0))
    assert len(out) == 5 and {1.0, 2.0, 3.0} <= set(out.tolist())
    # the baseline never leaves the recorded range
    big = np.random.default_rng(1).lognormal(5, 1, 1000)
    r = histogram_resample(big, 200, np.random.default_rng(2))
    assert r.min() >= big.min() and r.max() <= big.max() and len(r) == 200


def test_step_statistics_by_hand():
    s = pl.DataFrame({
        "step": [0, 0, 0, 0], "dp_rank": [0, 0, 1, 1], "prompt_tokens": [10, 10, 20, 20],
        "response_tokens": [100, 300, 50, 50], "n_turns": [1, 2, 1, 1], "tool_time_s": [0.0, 1.5, 0.0, 0.5],
    })
    st = step_statistics(s, multi=True, has_ranks=True).row(0, named=True)
    assert st["total_tokens"] == 60 + 500  # prompts 10+10+20+20, responses 100+300+50+50
    assert st["longest_response"] == 300
    assert st["p99_response"] == pytest.approx(300 - 0.03 * 200)  # linear interpolation at 0.99 of [50,50,100,300]
    assert st["makespan_tokens"] == 400  # dp 0 carries 100+300
    assert st["turns"] == 5 and st["tool_time_s"] == 2.0


def test_split_by_steps_excludes_partial_steps():
    s = synth_samples(steps=7, prompts=8, n=4, seed=0)
    partial = s.filter((pl.col("step") == 6) & (pl.col("local_index") == 0))  # 8 of 32 samples
    s = pl.concat([s.filter(pl.col("step") < 6), partial])
    sp = split_run(RunFrames("r", s))
    assert sp.mode == "steps" and sp.partial_steps == [6]
    assert sp.train_steps == [0, 1, 2, 3] and sp.heldout_steps == [4, 5]  # round(6 * 2/3) = 4 fitted


def test_short_run_is_split_by_prompt_groups():
    s = synth_samples(steps=1, prompts=64, n=4, seed=0)
    sp = split_run(RunFrames("r", s))
    assert sp.mode == "prompt_groups"
    assert sp.train_steps == [0, 1, 2, 3, 4] and sp.heldout_steps == [5, 6, 7]
    assert sp.frames.samples.group_by("step").len()["len"].to_list() == [32] * 8  # 8 groups x 4 per pseudo-step


def test_stationary_synthetic_run_scores_high_and_reports_both_methods():
    s = synth_samples(steps=9, prompts=32, n=8, within=0.3, cap=None, sigma=0.4, seed=5)
    r = fidelity(RunFrames("synth", s), seeds=(0, 1, 2))
    for k in ("run_id", "accuracy_pct", "baseline_accuracy_pct", "errors_pct", "baseline_errors_pct",
              "single_replay_accuracy_pct", "level_accuracy_pct", "monte_carlo_se_pct", "ceiling_accuracy_pct",
              "recorded_mean_accuracy_pct", "in_sample_level_accuracy_pct", "baseline_in_sample_level_accuracy_pct"):
        assert k in r
    # the recorded mean is one constant prediction: it cannot beat the hindsight ceiling
    assert r["recorded_mean_accuracy_pct"] <= r["ceiling_accuracy_pct"] <= 100
    assert r["monte_carlo_se_pct"] >= 0 and r["in_sample_seeds"] == 3
    assert r["in_sample_level_accuracy_pct"] > 90  # the generating model reproduces the steps it was fitted on
    assert r["statistics"] == ["total_tokens", "longest_response", "p99_response", "makespan_tokens"]
    assert r["train_steps"] == [0, 1, 2, 3, 4, 5] and r["heldout_steps"] == [6, 7, 8]
    assert r["accuracy_pct"] > 90  # the model is the generating one up to fitting noise
    assert 0 < r["baseline_accuracy_pct"] <= 100


@pytest.mark.real_logs
def test_fidelity_cli_on_a_real_polytrace_run(real_file, tmp_path, capsys):
    run = real_file("polytrace/rllm/profile/packed_length_log/20260616_024512")
    wh = tmp_path / "wh"
    assert main(["ingest", str(run), "--warehouse", str(wh), "-q"]) == 0
    assert main(["fidelity", "20260616_024512", "--warehouse", str(wh), "--format", "json", "--seeds", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 5 packed steps (ls packed_lengths_step_*.jsonl | wc -l): 3 fitted, 2 held out
    assert out["train_steps"] == [0, 1, 2] and out["heldout_steps"] == [3, 4]
    assert {"total_tokens", "longest_response", "p99_response", "makespan_tokens"} == set(out["errors_pct"])
    assert 50 < out["accuracy_pct"] <= 100 and 50 < out["baseline_accuracy_pct"] <= 100
    # every response of this run is capped at 16000 (max of the output lists); both methods reproduce the cap
    assert out["errors_pct"]["longest_response"] == 0.0
    # the held-out steps 3 and 4 total 983,758 and 1,371,186 tokens, makespans 615,243 and 674,818
    # (input x n + outputs, and the larger dp rank's outputs, in packed_lengths_step_{3,4}.jsonl):
    # the best constant is the smaller one, costing (1371186 - 983758) / 1371186 / 2 = 14.13 % and
    # (674818 - 615243) / 674818 / 2 = 4.41 %; longest and p99 are 16000 on both steps (0 %)
    assert out["ceiling_errors_pct"]["total_tokens"] == pytest.approx(100 * (1371186 - 983758) / 1371186 / 2)
    assert out["ceiling_errors_pct"]["makespan_tokens"] == pytest.approx(100 * (674818 - 615243) / 674818 / 2)
    assert out["ceiling_accuracy_pct"] == pytest.approx(100 - (14.128 + 4.414) / 4, abs=0.01)
    assert main(["fit", "--warehouse", str(wh), "--out", str(tmp_path / "spec.json")]) == 0
    spec = json.loads((tmp_path / "spec.json").read_text())
    w = spec["workloads"]["20260616_024512"]
    assert w["variables"]["response_tokens"]["censor_at"] == 16000
    # 96 responses are exactly 16000 (grep -o '16000' packed_lengths_step_*.jsonl | wc -l)
    assert w["variables"]["response_tokens"]["n_censored"] == 96
    assert "reward_time_per_sample_s" in w["variables"]
    assert main(["sample", "--spec", str(tmp_path / "spec.json"), "--steps", "2", "--seed", "1", "--out", str(tmp_path / "g")]) == 0
    assert sorted(p.name for p in (tmp_path / "g").iterdir())[:2] == ["packed_lengths_step_0.jsonl", "packed_lengths_step_1.jsonl"]
    assert main(["fidelity", "nope", "--warehouse", str(wh)]) == 2


def test_a_run_too_small_to_split_is_an_error_not_a_crash():
    s = synth_samples(steps=1, prompts=2, n=2, seed=0)  # 2 prompts: 8 pseudo-steps cannot be filled
    with pytest.raises(ValueError):
        fidelity(RunFrames("tiny", s), seeds=(0,))


def test_held_out_steps_cannot_influence_the_model_choice():
    # the response model is chosen by rolling-origin validation on the fitted steps only: tripling
    # every held-out response changes the score, not the model or its validation scores
    s = synth_samples(steps=6, prompts=16, n=4, cap=4096, seed=7)
    a = fidelity(RunFrames("r", s), seeds=(0,))
    held = pl.col("step").is_in(a["heldout_steps"])
    s3 = s.with_columns(response_tokens=pl.when(held).then(pl.col("response_tokens") * 3).otherwise(pl.col("response_tokens")))
    b = fidelity(RunFrames("r", s3), seeds=(0,))
    assert a["train_steps"] == [0, 1, 2, 3] and a["heldout_steps"] == [4, 5]  # round(6 * 2/3) = 4 fitted
    assert a["model"]["selected"] in a["model"]["validation_accuracy_pct"]
    assert a["model"] == b["model"]
    assert a["accuracy_pct"] != b["accuracy_pct"]
