"""Fidelity by rolling origin: the baseline port, the split, the origins, the criterion against a
deliberately bad generator, partial steps, no peeking at scored steps; the CLI on a real run."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_samples

from analyses.atomic_output import MARKER
from analyses.cli import main
from analyses.fit.baseline import HistogramBaseline, histogram_resample
from analyses.fit.data import RunFrames, batch_shape, split_run, training_samples
from analyses.fit.fidelity import fidelity
from analyses.fit.rolling import RealSteps, origins, score_draws
from analyses.fit.sampler import StepDraws
from analyses.fit.scores import summary


def test_histogram_resample_by_hand():
    # values 0,0,0,0,10: 2 distinct -> 2 bins of width 5; bin 0 gets int(4/5*5)=4 draws of 0, bin 1 gets 1 of 10
    out = histogram_resample(np.array([0, 0, 0, 0, 10.0]), 5, np.random.default_rng(0))
    assert sorted(out.tolist()) == [0, 0, 0, 0, 10]
    # asking for at least as many as recorded: the recorded values (shuffled) plus draws from them
    out = histogram_resample(np.array([1.0, 2.0, 3.0]), 5, np.random.default_rng(0))
    assert len(out) == 5 and {1.0, 2.0, 3.0} <= set(out.tolist())
    # the baseline never leaves the recorded range, and a sparse top bin gets no draw of its own
    big = np.random.default_rng(1).lognormal(5, 1, 1000)
    r = histogram_resample(big, 200, np.random.default_rng(2))
    assert r.min() >= big.min() and r.max() <= big.max() and len(r) == 200


def test_origins_by_hand():
    # every prefix of >= 2 steps that leaves a step to predict; the next two steps (one at the end)
    assert origins([3, 4, 5, 6]) == [([3, 4], [5, 6]), ([3, 4, 5], [6])]
    assert origins([0, 1]) == []
    assert len(origins(list(range(21)))) == 19


def test_split_keeps_partial_steps_out():
    s = synth_samples(steps=7, prompts=8, n=4, seed=0)
    partial = s.filter((pl.col("step") == 6) & (pl.col("local_index") == 0))  # 8 of 32 samples
    s = pl.concat([s.filter(pl.col("step") < 6), partial])
    sp = split_run(RunFrames("r", s))
    assert sp.mode == "steps" and sp.partial_steps == [6] and sp.steps == [0, 1, 2, 3, 4, 5]


def test_short_run_is_split_by_prompt_groups():
    s = synth_samples(steps=1, prompts=64, n=4, seed=0)
    sp = split_run(RunFrames("r", s))
    assert sp.mode == "prompt_groups" and sp.steps == list(range(8))
    assert sp.frames.samples.group_by("step").len()["len"].to_list() == [32] * 8  # 8 groups x 4 per pseudo-step
    with pytest.raises(ValueError):
        split_run(RunFrames("tiny", synth_samples(steps=1, prompts=2, n=2, seed=0)))  # 2 groups: no 8 pseudo-steps


def _real(s: pl.DataFrame) -> RealSteps:
    t = training_samples(s)
    return RealSteps.build(t, None, None, multi=False)


def test_a_constant_generator_scores_below_the_histogram():
    # a generator that always predicts the training median for every sample: no spread, no tail
    s = synth_samples(steps=6, prompts=16, n=8, within=0.4, cap=None, seed=11)
    real = _real(s)
    seeds = tuple(range(40))
    const, base = [], []
    for fitted, predicted in origins(sorted(real.stats)):
        fs, _, _ = real.frames(fitted)
        hb = HistogramBaseline(fs, batch_shape(training_samples(fs)) | {"multi_turn": False})
        b = hb.draw(predicted, seeds)
        rows = len(seeds) * len(predicted)
        c = StepDraws(list(seeds), list(predicted), np.full((rows, b.prompt.shape[1]), float(np.median(fs["prompt_tokens"]))),
                      np.full((rows, b.response.shape[1]), float(np.median(fs["response_tokens"]))), b.dp_index, b.n_dp)
        const.append(score_draws(c, real))
        base.append(score_draws(b, real))
    x = summary(const, base)
    assert x["crps_skill"] < 0
    assert x["coverage90"] < x["baseline_coverage90"]
    assert x["ks_mean"] > x["baseline_ks_mean"]  # one value is nothing like the sample shape


def test_our_generator_beats_the_histogram_on_its_own_kind_of_run():
    # GRPO groups (within-group correlation 0.5) and a step-level effect: the histogram resampler
    # draws samples independently, so its step totals are far too sure of themselves
    s = synth_samples(steps=7, prompts=16, n=8, within=0.5, cap=2000, sigma=0.6, seed=5)
    r = fidelity(RunFrames("synth", s), seeds=tuple(range(60)))
    ro = r["rolling_origin"]
    assert r["split"] == "steps" and ro["origins"] == 5 and ro["seeds"] == 60
    assert ro["cells"] == (2 * 4 + 1) * 4  # 4 origins predict 2 steps, the last one 1; 4 statistics
    assert ro["crps_skill"] > 0
    assert ro["coverage90"] > ro["baseline_coverage90"]
    assert ro["ks_mean"] <= ro["baseline_ks_mean"] + 0.01
    assert [o["fitted_steps"] for o in ro["per_origin"]][:2] == [[0, 1], [0, 1, 2]]
    assert 0 < ro["ceiling_accuracy_pct"] <= 100 and 0 < ro["mape_accuracy_pct"] <= 100


def test_partial_steps_are_never_fitted_or_scored():
    s = synth_samples(steps=5, prompts=8, n=4, cap=None, seed=3)
    # a cut-off step between full ones, with absurd lengths: if it entered any fit or score, it would show
    cut = s.filter((pl.col("step") == 4) & (pl.col("local_index") == 0)).with_columns(step=pl.lit(9, pl.Int64),
                                                                                     response_tokens=pl.lit(10**6, pl.Int64))
    a = fidelity(RunFrames("r", s), seeds=tuple(range(10)))
    b = fidelity(RunFrames("r", pl.concat([s, cut])), seeds=tuple(range(10)))
    assert b["partial_steps_excluded"] == [9] and a["partial_steps_excluded"] == []
    steps = {k for o in b["rolling_origin"]["per_origin"] for k in o["fitted_steps"] + o["predicted_steps"]}
    assert 9 not in steps
    assert a["rolling_origin"] == b["rolling_origin"]


def test_scored_steps_cannot_influence_the_choices_at_an_origin():
    # tripling the last step's responses changes its scores, not what any origin fitted before it chose
    s = synth_samples(steps=6, prompts=16, n=4, cap=4096, seed=7)
    a = fidelity(RunFrames("r", s), seeds=(0, 1))
    s3 = s.with_columns(response_tokens=pl.when(pl.col("step") == 5).then(pl.col("response_tokens") * 3)
                        .otherwise(pl.col("response_tokens")))
    b = fidelity(RunFrames("r", s3), seeds=(0, 1))
    before_last = [i for i, o in enumerate(a["rolling_origin"]["per_origin"]) if 5 not in o["fitted_steps"]]
    assert len(before_last) == 4  # 6 steps: every origin fits on steps before 5
    for i in before_last:
        assert a["rolling_origin"]["per_origin"][i] == b["rolling_origin"]["per_origin"][i]
    assert a["rolling_origin"]["crps_skill"] != b["rolling_origin"]["crps_skill"]


@pytest.mark.real_logs
def test_fidelity_cli_on_a_real_polytrace_run(real_file, tmp_path, capsys):
    run = real_file("polytrace/rllm/profile/packed_length_log/20260616_024512")
    wh = tmp_path / "wh"
    assert main(["ingest", str(run), "--warehouse", str(wh), "-q"]) == 0
    assert main(["fidelity", "20260616_024512", "--warehouse", str(wh), "--format", "json", "--seeds", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    ro = out["rolling_origin"]
    # 5 full packed steps (ls packed_lengths_step_*.jsonl | wc -l): origins fit 2, 3 and 4 of them
    assert out["steps"] == [0, 1, 2, 3, 4] and ro["origins"] == 3
    assert [(o["fitted_steps"], o["predicted_steps"]) for o in ro["per_origin"]] == [
        ([0, 1], [2, 3]), ([0, 1, 2], [3, 4]), ([0, 1, 2, 3], [4])]
    assert out["statistics"] == ["total_tokens", "longest_response", "p99_response", "makespan_tokens"]
    assert ro["cells"] == 5 * 4
    for k in ("crps_skill", "coverage90", "baseline_coverage90", "ks_mean", "baseline_ks_mean"):
        assert np.isfinite(ro[k])
    # every response of this run is capped at 16000 and every step has more than 1% at the cap:
    # longest and p99 are 16000 everywhere, both generators reproduce them (CRPS 0, covered)
    assert ro["by_statistic"]["longest_response"]["coverage90"] == 1.0
    # the predicted steps 2, 3, 4 total 1,029,171 / 983,758 / 1,371,186 tokens (input x n + outputs
    # in packed_lengths_step_{2,3,4}.jsonl): the best constant is 1,029,171, costing
    # (0 + 45,413 / 983,758 + 342,015 / 1,371,186) / 3 = 9.853 %; makespans 638,491 / 615,243 /
    # 674,818: the best is 638,491, (23,248 / 615,243 + 36,327 / 674,818) / 3 = 3.054 %
    assert ro["ceiling_errors_pct"]["total_tokens"] == pytest.approx(9.8531, abs=1e-3)
    assert ro["ceiling_errors_pct"]["makespan_tokens"] == pytest.approx(3.0540, abs=1e-3)
    assert ro["ceiling_accuracy_pct"] == pytest.approx(100 - (9.8531 + 3.0540) / 4, abs=1e-3)
    assert main(["fit", "--warehouse", str(wh), "--out", str(tmp_path / "spec.json"), "-q"]) == 0
    spec = json.loads((tmp_path / "spec.json").read_text())
    w = spec["workloads"]["20260616_024512"]
    assert w["variables"]["response_tokens"]["censor_at"] == 16000
    # 96 responses are exactly 16000 (grep -o '16000' packed_lengths_step_*.jsonl | wc -l)
    assert w["variables"]["response_tokens"]["n_censored"] == 96
    assert "reward_time_per_sample_s" in w["variables"]
    assert main(["sample", "--spec", str(tmp_path / "spec.json"), "--steps", "2", "--seed", "1", "--out", str(tmp_path / "g")]) == 0
    assert sorted(p.name for p in (tmp_path / "g").iterdir() if p.name != MARKER)[:2] == ["packed_lengths_step_0.jsonl",
                                                                                           "packed_lengths_step_1.jsonl"]
    assert main(["fidelity", "nope", "--warehouse", str(wh)]) == 2
