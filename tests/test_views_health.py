"""training_health / health_alerts and the regime fences of step_series (issue 13, item 3).

Hand-made runs with answers computed by hand, then every real run with step logs: the alerts
each raises are listed exactly (the i80 run collapses at step 11, its responses at 1 token from 12).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from _views_util import open_wh, rows, stage_run

from analyses.ingest import ingest_run
from analyses.views.training_health import ALERT_RULES, LEVEL_WINDOW


def _metrics(series: dict[str, list[float | None]]) -> pl.DataFrame:
    out = []
    for metric, values in series.items():
        out += [{"step": i + 1, "metric": metric, "value": v, "is_validation": False}
                for i, v in enumerate(values) if v is not None]
    return pl.DataFrame(out)


def _alerts(tmp_path: Path, series: dict[str, list[float | None]], steps: dict | None = None) -> dict[str, dict]:
    root = tmp_path / "wh"
    stage_run(root, "r", {"step_metrics": _metrics(series), **({"steps": steps} if steps else {})})
    return {r["kind"]: r for r in rows(open_wh(root), "SELECT * FROM health_alerts")}


def test_length_collapse_sustained_five_steps_from_its_first_step(tmp_path: Path) -> None:
    # earlier level at step 6 = median(100, 100, 100, 100, 100) = 100; 2 < 3 % x 100 from step 6 to 10
    a = _alerts(tmp_path, {"response_length/mean": [100.0] * 5 + [2.0] * 5})
    r = a["response_length_collapse"]
    assert (r["first_step"], r["last_step"], r["n_steps"], r["earlier_level"], r["first_value"]) == (6, 10, 5, 100.0, 2.0)
    assert "fell to 2 at step 6" in r["detail"]


def test_four_low_steps_are_not_a_collapse(tmp_path: Path) -> None:
    assert _alerts(tmp_path, {"response_length/mean": [100.0] * 5 + [2.0] * 4 + [100.0]}) == {}


def test_a_level_is_the_median_of_a_full_window(tmp_path: Path) -> None:
    # two long steps, then short ones: every 5-step median is 1, the run never had a level of 100
    assert _alerts(tmp_path, {"response_length/mean": [100.0] * 2 + [1.0] * 12}) == {}
    # three long ones are a majority of the window of steps 1-5: the level is 100, low from step 4
    r = _alerts(tmp_path / "b", {"response_length/mean": [100.0] * 3 + [1.0] * 12})["response_length_collapse"]
    assert (r["first_step"], r["n_steps"]) == (6, 10)  # steps 4-5 precede the first full window (step 5's level is for after it)


def test_clip_ratio_high_counts_the_sustained_stretch_only(tmp_path: Path) -> None:
    # steps 1-2 high (too short), 3 low, 4-6 high: one stretch of 3
    r = _alerts(tmp_path, {"response_length/clip_ratio": [0.2, 0.2, 0.05, 0.2, 0.1, 0.3]})["clip_ratio_high"]
    assert (r["first_step"], r["last_step"], r["n_steps"], r["stretches"]) == (4, 6, 3, 1)
    assert "max 0.3" in r["detail"]


def test_reward_collapse_of_a_non_negative_reward_is_half_its_earlier_level(tmp_path: Path) -> None:
    a = _alerts(tmp_path, {"critic/score/mean": [0.8] * 5 + [0.3] * 5})
    r = a["reward_collapse"]
    assert (r["first_step"], r["n_steps"], r["floor"]) == (6, 5, 0.0)  # 0.3 < 0.5 x 0.8
    assert "above its floor" not in r["detail"]
    assert _alerts(tmp_path / "flat", {"critic/score/mean": [-0.5] * 5 + [-0.9] * 5}) == {}  # no climb to lose


def test_reward_collapse_of_a_signed_reward_is_losing_half_its_climb(tmp_path: Path) -> None:
    # rewards in [-1, 1]: from -1 up to -0.2 (levels -1 .. -0.2), then back to -0.9: it lost 0.7 of a
    # 0.8 climb; low below -1 + 0.5 x 0.8 = -0.6. The old rule (a positive level required) said nothing
    up = [-1.0] * 5 + [-0.2] * 5
    r = _alerts(tmp_path, {"critic/score/mean": up + [-0.9] * 5})["reward_collapse"]
    assert (r["first_step"], r["n_steps"], r["earlier_level"], r["floor"]) == (11, 5, -0.2, -1.0)
    assert "fell to -0.9 at step 11, below 0.5 x its earlier level -0.2 above its floor -1" in r["detail"]
    # a dip that keeps most of the climb (-0.5 > -0.6) is no collapse
    assert _alerts(tmp_path / "dip", {"critic/score/mean": up + [-0.5] * 5}) == {}
    # noise around a small positive level, in a run that started negative: -0.01 is not below half of 0.02
    # measured from -0.3 (the old rule flagged it: -0.01 < 0.5 x 0.02)
    assert _alerts(tmp_path / "near0", {"critic/score/mean": [-0.3] * 5 + [0.02] * 5 + [-0.01] * 5}) == {}


def test_entropy_collapse_and_throughput_drop(tmp_path: Path) -> None:
    steps = {"step": list(range(1, 11)), "throughput_tokens_per_s": [1000.0] * 5 + [400.0] * 5}
    a = _alerts(tmp_path, {"actor/entropy": [0.4] * 5 + [0.01] * 5}, steps)
    assert a["entropy_collapse"]["first_step"] == 6 and a["throughput_drop"]["first_step"] == 6  # 0.01 < 0.02, 400 < 500
    assert a["throughput_drop"]["regime_change"] and not a["entropy_collapse"]["regime_change"]


def test_health_columns_from_samples_when_no_step_log(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    stage_run(root, "s", {"samples": {"step": [1, 1, 1, 1], "sample_id": ["a", "b", "c", "d"],
                                      "response_tokens": [10, 20, 30, 100], "truncated": [False, False, False, True],
                                      "reward": [1.0, 0.0, 1.0, 0.0]}})
    r = rows(open_wh(root), "SELECT * FROM training_health")[0]
    assert (r["source"], r["n_samples"], r["response_length_mean"], r["response_length_max"]) == ("samples", 4, 40.0, 100)
    assert r["clip_ratio"] == 0.25 and r["reward_mean"] == 0.5


def test_step_variance_fences_each_regime_apart(tmp_path: Path) -> None:
    # 10 healthy steps around 100 s, then a collapse at step 11: 10 steps around 10 s
    times = [100.0, 104.0, 96.0, 102.0, 98.0, 101.0, 99.0, 103.0, 97.0, 100.0] + [10.0, 10.5, 9.5] * 3 + [10.0]
    root = tmp_path / "wh"
    stage_run(root, "r", {"step_metrics": _metrics({"response_length/mean": [1000.0] * 10 + [1.0] * 10}),
                          "steps": {"step": list(range(1, 21)), "step_time_s": times}})
    c = open_wh(root)
    v = rows(c, "SELECT * FROM step_variance WHERE metric = 'step_time_s'")[0]
    assert v["n_regimes"] == 2 and v["n_outliers"] == 0
    regimes = rows(c, "SELECT regime, count(*) AS n FROM step_series GROUP BY 1 ORDER BY 1")
    assert [(r["regime"], r["n"]) for r in regimes] == [(0, 10), (1, 10)]


def test_rules_are_declared_once_and_documented() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "views.md").read_text()
    for r in ALERT_RULES:
        assert f"`{r.kind}`" in doc and f"`{r.column}`" in doc
    assert f"{LEVEL_WINDOW} consecutive steps" in doc


# --------------------------------------------------------------------------- real runs

AGENTIC = "verl_agentic_open-agentrl"
# every real run with a step log or samples -> the alerts it raises (kind: first step)
REAL = {
    "i80": (f"{AGENTIC}/run-20251129_221801-i80f2v90/files/output.log",
            {"response_length_collapse": 11, "entropy_collapse": 16}),
    # the same job's second run collapses too (970 -> 9 tokens); its step-40 line is cut at 4096 characters before
    # response_length/mean, so the console log shows it from 41 (the wandb history, from 40)
    "gjv": (f"{AGENTIC}/run-20251130_144822-gjvwlq13/files/output.log", {"response_length_collapse": 41}),
    "qwen": ("verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log", {}),
    "gemma": ("verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log", {}),
    "gui": ("verl/GUI-Cursor-Moving_verl_demo.log", {}),
    "jsonl": ("verl_jsonl_filelogger/HanlinDu_verl/verl_examples/gsm8k.jsonl", {}),
    "trl": ("trl_grpo_terminal/20251022_181457/run_terminal.md", {"clip_ratio_high": 10}),
    "unsloth": ("unsloth_grpo/run-20251217-122231.log", {}),
    "video": ("polytrace/verl-video/profile/packed_length_log/20260609_033329", {}),
    "coder": ("polytrace/rllm/profile/packed_length_log/20260616_024512", {}),
    "dapo": ("polytrace/verl/profile/packed_length_log/20260614_023133", {}),
    "search": ("polytrace/search_r1/profile/multiturn_workload_log/0617_0223", {}),
}


# one worker runs the module: its module fixture (the real runs ingested) is built once, not on each worker
pytestmark = pytest.mark.xdist_group("views_health")


@pytest.fixture(scope="module")
def real_con(real_logs: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("health") / "wh"
    for rid, (rel, _alerts) in REAL.items():
        ingest_run(real_logs / rel, root, run_id=rid)
    return open_wh(root)


@pytest.mark.real_logs
def test_i80_response_length_collapses_at_step_12_give_or_take_2(real_con) -> None:  # noqa: ANN001
    r = rows(real_con, "SELECT * FROM health_alerts WHERE run_id = 'i80' AND kind = 'response_length_collapse'")[0]
    # grep 'step:N - ' output.log: response_length/mean 1759.1 (1), 1921.9, 1751.0, 1353.4, 1233.5 (5), ...,
    # 87.9 (9, 5.0 % of 1751.0: not yet), 4.80 (11), 1.0 from 12 to the end (261)
    assert 10 <= r["first_step"] <= 14 and r["last_step"] == 261
    assert r["earlier_level"] == pytest.approx(1751.025390625) and r["first_value"] == pytest.approx(4.802734375)


@pytest.mark.real_logs
def test_every_real_run_raises_exactly_its_alerts(real_con) -> None:  # noqa: ANN001
    got: dict[str, dict[str, int]] = {rid: {} for rid in REAL}
    for r in rows(real_con, "SELECT run_id, kind, first_step FROM health_alerts"):
        got[r["run_id"]][r["kind"]] = r["first_step"]
    assert got == {rid: alerts for rid, (_rel, alerts) in REAL.items()}


@pytest.mark.real_logs
def test_health_columns_canonical_across_verl_generations_and_trl(real_con) -> None:  # noqa: ANN001
    h = {(r["run_id"], r["step"]): r for r in rows(real_con, "SELECT * FROM training_health")}
    # verl < 0.3 (Dec 2024) logs actor/entropy_loss; its step 0: entropy_loss 0.526, critic/score/mean 0.012,
    # response_length/mean 313.824
    q = h[("qwen", 0)]
    assert (q["entropy"], q["reward_mean"], q["response_length_mean"]) == (0.526, 0.012, 313.824)
    # TRL prints completions/mean_length and completions/clipped_ratio (step 10: 142.739..., 0.296875)
    t = h[("trl", 10)]
    assert t["response_length_mean"] == pytest.approx(142.7390625) and t["clip_ratio"] == pytest.approx(0.296875)
    # new verl: response/aborted_ratio, num_turns/mean, perf/mfu/actor, perf/max_memory_allocated_gb
    # (step 1: aborted_ratio 0.0, num_turns/mean 7.68359375, mfu/actor 0.35089, max_memory_allocated_gb 49.538)
    i = h[("i80", 1)]
    assert (i["response_length_mean"], i["aborted_ratio"], i["turns_mean"]) == (1759.12109375, 0.0, 7.68359375)
    assert i["mfu"] == pytest.approx(0.3508896583479419) and i["memory_allocated_gb"] == pytest.approx(49.53827714920044)


@pytest.mark.real_logs
def test_i80_healthy_steps_are_not_outliers(real_con) -> None:  # noqa: ANN001
    got = rows(real_con, "SELECT metric, list_filter(outlier_steps, lambda s: s <= 10) AS early, n_regimes "
                         "FROM step_variance WHERE run_id = 'i80'")
    # steps 1-10 (10 lost its timings to the 4096-char cut) are fenced among themselves; the collapse is another regime
    assert {r["metric"] for r in got} == {"throughput_tokens_per_s", "step_time_s", "gen_time_s"}
    assert all(r["early"] == [] and r["n_regimes"] == 2 for r in got)


@pytest.mark.real_logs
def test_run_overview_of_real_runs(real_con) -> None:  # noqa: ANN001
    o = {r["run_id"]: r for r in rows(real_con, "SELECT * FROM run_overview")}
    q = o["qwen"]
    # the config dump: actor model.path 'Qwen/Qwen2.5-0.5B-Instruct', trainer n_gpus_per_node 1 x nnodes 1;
    # 435 step lines (0..434), none rejected
    assert (q["model"], q["gpus_used"], q["gpus_used_source"], q["steps"]) == ("Qwen/Qwen2.5-0.5B-Instruct", 1, "config_dump", 435)
    assert (q["formats"], q["rejected_lines"], q["alerts"], q["duration_source"]) == ("verl_console", 0, "none", "sum_of_step_times")
    assert o["i80"]["alerts"] == "response_length_collapse (steps 11-261); entropy_collapse (steps 16-261)"
    s = o["search"]
    assert (s["steps"], s["partial_steps"], s["formats"]) == (2, 1, "polytrace_multiturn")
