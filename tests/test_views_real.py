"""The views on the real PolyTrace logs (../shared/real_logs/polytrace), ingested once per module.

Expected numbers were computed straight from the raw JSONL with DuckDB, independently of our
readers, e.g. for the video run:
  SELECT step, max(o) / avg(o) FROM (SELECT step, unnest(output) o FROM read_json_auto('.../packed_lengths_step_*.jsonl')
  WHERE NOT validate) GROUP BY step
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _ci import skip_or_fail
from _views_util import rows

from analyses.api import PolyTrace
from analyses.ingest import ingest_run

# one worker runs the module: its module fixture (five real runs ingested) is built once, not on each worker
pytestmark = [pytest.mark.real_logs, pytest.mark.xdist_group("views_real")]

VIDEO = "polytrace/verl-video/profile/packed_length_log/20260609_033329"
CODER = "polytrace/rllm/profile/packed_length_log/20260616_024512"
DAPO = "polytrace/verl/profile/packed_length_log/20260614_023133"
SEARCH = "polytrace/search_r1/profile/multiturn_workload_log/0617_0223"
AGENTIC = "verl_agentic_open-agentrl/run-20251129_221801-i80f2v90/files/output.log"


@pytest.fixture(scope="module")
def con(real_logs: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("real") / "wh"
    for rel, rid in ((VIDEO, "video"), (CODER, "coder"), (DAPO, "dapo"), (SEARCH, "search"), (AGENTIC, "agentic")):
        path = real_logs / rel
        assert path.exists(), f"{path} missing from the real logs"
        ingest_run(path, root, run_id=rid)
    return PolyTrace(root).connect()


def test_video_longest_over_mean_response_per_step(con) -> None:  # noqa: ANN001
    got = rows(con, "SELECT step, max_over_mean, idle_share FROM rank_imbalance "
                    "WHERE run_id = 'video' AND phase = 'rollout_batch' ORDER BY step")
    assert len(got) == 21  # packed_lengths_step_1..21
    ratios = [r["max_over_mean"] for r in got]
    # raw DuckDB: min 1.9425 (step 13: 324 / 166.797), max 81.673 (step 2: 16000 / 195.904)
    assert min(ratios) == pytest.approx(1.942482, rel=1e-5) and got[12]["step"] == 13
    assert max(ratios) == pytest.approx(81.672532, rel=1e-5) and ratios.index(max(ratios)) == 1
    assert got[1]["idle_share"] == pytest.approx(1 - 195.904296875 / 16000)


def test_video_length_quantiles(con) -> None:  # noqa: ANN001
    q = rows(con, "SELECT * FROM length_quantiles WHERE run_id = 'video' AND kind = 'response'")[0]
    # raw DuckDB: quantile_disc(o, [0.5, 0.9, 0.99, 0.999]) = [159, 227, 316, 5581], max 16000, 10752 responses
    assert (q["n"], q["p50"], q["p90"], q["p99"], q["p999"], q["max"]) == (10752, 159, 227, 316, 5581, 16000)
    prompts = rows(con, "SELECT n FROM length_quantiles WHERE run_id = 'video' AND kind = 'prompt'")[0]
    assert prompts["n"] == 21 * 64  # 64 prompt records (x 8 samples) per step file


def test_deepcoder_reward_time_across_dp_ranks(con) -> None:  # noqa: ANN001
    got = rows(con, "SELECT step, max_over_min FROM rank_imbalance WHERE run_id = 'coder' AND phase = 'reward' "
                    "AND quantity = 'seconds' ORDER BY step")
    # reward_timings_step_2.jsonl: dp0 113.013 s, dp1 43.272 s -> 2.6117; steps 0..4
    assert [r["step"] for r in got] == [0, 1, 2, 3, 4]
    assert max(r["max_over_min"] for r in got) == pytest.approx(113.01303508505225 / 43.27239538356662)
    assert got[2]["max_over_min"] == pytest.approx(2.6117, abs=1e-4)


def test_search_r1_tools_and_turns(con) -> None:  # noqa: ANN001
    t = rows(con, "SELECT * FROM tool_latency WHERE run_id = 'search'")[0]
    # raw: 3469 tool calls, 13 with status 'unknown' (the rest 'success'); quantile_disc p50 0.182468, p99 2.124486
    assert (t["tool_name"], t["calls"], t["failures"]) == ("search", 3469, 13)
    assert t["p50"] == pytest.approx(0.18246793746948242) and t["p99"] == pytest.approx(2.124485731124878)
    assert t["max_s"] == pytest.approx(2.454470634460449)
    m = rows(con, "SELECT * FROM multiturn WHERE run_id = 'search'")[0]
    # step 5 is partial (47 trajectories after 2048): counted, left out of the means and pmfs.
    # raw multiturn_workload_step_0.jsonl: 2048 records, 5455 turns, sum(cached_tokens) / sum(prompt_tokens)
    assert (m["trajectories"], m["partial_trajectories"]) == (2048, 47)
    assert m["prefix_cache_share"] == pytest.approx(0.603457399013598)
    pmf = rows(con, "SELECT value, n FROM multiturn_pmf WHERE run_id = 'search' AND variable = 'turns' ORDER BY value")
    # raw step 0: len(turns) -> count
    assert [(r["value"], r["n"]) for r in pmf] == [(1, 137), (2, 871), (3, 701), (4, 222), (5, 117)]


def test_dapo_filter_waste(con) -> None:  # noqa: ANN001
    r = rows(con, "SELECT * FROM filter_waste_run WHERE run_id = 'dapo'")[0]
    # raw dapo_filter_indices.jsonl: 6 lines, 4 trainer steps, sum prompt_count 576, kept 182, used 126
    assert (r["gen_batches"], r["trainer_steps"], r["prompts_generated"], r["prompts_kept"], r["prompts_used"]) == (
        6, 4, 576, 182, 126)
    assert r["filtered_share"] == pytest.approx(1 - 182 / 576) and r["gen_batches_per_step"] == 1.5


def test_agentic_verl_stage_breakdown(con) -> None:  # noqa: ANN001
    s = rows(con, "SELECT * FROM stage_breakdown WHERE run_id = 'agentic' AND step = 1")[0]
    # grep 'step:1 - ' output.log: timing_s/gen 179.7128, reward 0.000216, old_log_prob 24.6669, ref 140.4912,
    # update_actor 82.0379, step 427.0493
    step = 427.04932610318065
    assert s["rollout_share"] == pytest.approx(179.71282542217523 / step)
    assert s["inference_share"] == pytest.approx((0.0002156500704586506 + 24.6669406730216 + 140.4912470590789) / step)
    assert s["training_share"] == pytest.approx(82.03789220796898 / step)
    assert s["rollout_share"] + s["inference_share"] + s["training_share"] + s["other_share"] == pytest.approx(1.0)


def test_agentic_verl_step_variance_and_seqlen(con) -> None:  # noqa: ANN001
    v = rows(con, "SELECT * FROM step_variance WHERE run_id = 'agentic' AND metric = 'step_time_s'")[0]
    # grep -c 'timing_s/step:' output.log = 235 (the 26 validation-step lines cut at 4096 chars lost it);
    # the longest is step 1 (427.049 s, warm-up). The responses collapse at step 11 (health_alerts): steps 1-10
    # (427 -> 88 s as responses shorten) and 11-261 (~36 s) are fenced apart, so no healthy step is an outlier;
    # step 11 (43.8 s, mean response 4.8 tokens) is the collapse regime's transition step
    assert v["n_steps"] == 235 and v["max"] == pytest.approx(427.04932610318065)
    assert v["n_regimes"] == 2 and [s for s in v["outlier_steps"] if s <= 11] == [11]
    r = rows(con, "SELECT * FROM rank_imbalance WHERE run_id = 'agentic' AND phase = 'train_batch' AND step = 52")[0]
    # grep 'step:52 - ': global_seqlen/max 64592, min 39904, mean 46848.0 (the run's worst max/mean)
    assert r["max_over_mean"] == pytest.approx(64592 / 46848) and r["max_minus_min"] == 64592 - 39904
    worst = rows(con, "SELECT max(max_over_mean) AS m FROM rank_imbalance WHERE run_id = 'agentic' AND phase = 'train_batch'")
    assert worst[0]["m"] == pytest.approx(64592 / 46848)


def test_wandb_gpu_utilization_aligned_to_steps(real_logs: Path, tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        skip_or_fail("the wandb offline reader needs the optional wandb package (pip install '.[wandb]')")
    run = real_logs / "verl_agentic_open-agentrl/run-20251130_144822-gjvwlq13"
    ingest_run(run, tmp_path / "wh", run_id="w")
    c = PolyTrace(tmp_path / "wh").connect()
    per_gpu = {r["gpu"]: r for r in rows(c, "SELECT * FROM gpu_utilization WHERE scope = 'run'")}
    # PROVENANCE: about 540 system samples per GPU for 8 GPUs (the reader finds 539 each); GPUs 0-3 report
    # 0 % throughout (the job used 4 of the 8), GPUs 4-7 run at about 80 %
    assert sorted(per_gpu) == [str(i) for i in range(8)]
    assert {r["n_samples"] for r in per_gpu.values()} == {539}
    assert all(per_gpu[str(i)]["mean_util_pct"] == 0 and per_gpu[str(i)]["idle_share"] == 1 for i in range(4))
    assert all(75 < per_gpu[str(i)]["mean_util_pct"] < 90 for i in range(4, 8))
    # GPUs 0-3 are idle for the whole run: reported, left out of the run's utilization and spread
    used = [per_gpu[str(i)]["mean_util_pct"] for i in range(4, 8)]
    assert [per_gpu[str(i)]["idle_whole_run"] for i in range(8)] == [True] * 4 + [False] * 4
    r = per_gpu["0"]
    assert (r["n_gpus"], r["gpus_used"], r["gpus_idle_whole_run"]) == (8, 4, 4)
    assert r["used_gpus_mean_util_pct"] == pytest.approx(sum(used) / 4) and 75 < r["used_gpus_mean_util_pct"] < 90
    assert r["gpu_spread_pct"] == pytest.approx(max(used) - min(used))
    steps = rows(c, "SELECT count(DISTINCT step) AS n, max(n_gpus) AS g, max(gpus_used) AS u FROM gpu_utilization "
                    "WHERE scope = 'step'")[0]
    assert steps["g"] == 8 and steps["u"] == 4 and steps["n"] >= 50  # 59 trainer steps, telemetry covers all but the edges
    run = rows(c, "SELECT n_gpus, n_gpus_source FROM runs")[0]
    assert (run["n_gpus"], run["n_gpus_source"]) == (4, "telemetry")
    o = rows(c, "SELECT * FROM run_overview")[0]
    assert (o["gpus_used"], o["gpus_idle_whole_run"], o["steps"]) == (4, 4, 59)
    assert o["formats"] == "verl_console, wandb_offline" and o["alerts"].startswith("response_length_collapse (steps 40-")


def test_coder_truncation_share_from_the_inferred_cap(con) -> None:  # noqa: ANN001
    # no run.toml: the cap is the point mass at 16000 (raw: 96 of 640 responses), so 15 % are truncated
    q = rows(con, "SELECT truncation_share FROM length_quantiles WHERE run_id = 'coder' AND kind = 'response'")[0]
    assert q["truncation_share"] == pytest.approx(96 / 640)
    r = rows(con, "SELECT max_response_length, max_response_length_source FROM runs WHERE run_id = 'coder'")[0]
    assert (r["max_response_length"], r["max_response_length_source"]) == (16000, "point_mass")


def test_search_r1_partial_last_step_shown_not_averaged(con) -> None:  # noqa: ANN001
    h = rows(con, "SELECT step, n_samples, partial FROM training_health WHERE run_id = 'search' ORDER BY step")
    # 2048 trajectories at step 0, 47 at step 5: 47 < 0.5 x median(2048, 47) = 523.75
    assert [(r["step"], r["n_samples"], r["partial"]) for r in h] == [(0, 2048, False), (5, 47, True)]
    q = rows(con, "SELECT n, n_partial FROM length_quantiles WHERE run_id = 'search' AND kind = 'response'")[0]
    assert (q["n"], q["n_partial"]) == (2048, 47)
    d = rows(con, "SELECT step, partial, n, run_log_p50_slope_per_step AS slope FROM length_drift "
                  "WHERE run_id = 'search' ORDER BY step")
    # shown per step, but a slope over one full step is no slope
    assert [(r["step"], r["partial"], r["n"]) for r in d] == [(0, False, 2048), (5, True, 47)]
    assert all(r["slope"] is None for r in d)
