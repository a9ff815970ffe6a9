"""Run facts the logs imply when run.toml is silent: the response cap and the GPUs used (issue 13, items 1-2)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.run_facts import (
    ConfigFacts,
    clip_ratio_cap,
    config_dump_facts,
    infer_run_facts,
    point_mass_cap,
    telemetry_gpus_used,
    with_truncation,
)
from analyses.schema import GPU_SAMPLES, SAMPLES, STEP_METRICS, conform
from analyses.warehouse import scan_table

# a verl config dump as the console prints it: the reward-model pool's n_gpus_per_node 0 comes first
DUMP = """\x1b[36m(TaskRunner pid=1)\x1b[0m {'actor_rollout_ref': {'model': {'path': '/mnt/models/Qwen3-VL-2B-Thinking',
(TaskRunner pid=1)  'critic': {'model': {'path': '~/models/deepseek-llm-7b-chat'}},
(TaskRunner pid=1)  'data': {'max_prompt_length': 1024,
\x1b[36m(TaskRunner pid=1)\x1b[0m           'max_response_length': 20480,
(TaskRunner pid=1)  'reward_model': {'n_gpus_per_node': 0,
(TaskRunner pid=1)                   'nnodes': 0},
(TaskRunner pid=1)  'trainer': {'balance_batch': True,
(TaskRunner pid=1)              'n_gpus_per_node': 8,
(TaskRunner pid=1)              'nnodes': 2,
"""


def test_config_dump_takes_the_trainer_sections_gpus_not_the_reward_pools_zero() -> None:
    # the actor's model, not the critic's; data's prompt cap
    assert config_dump_facts(DUMP) == ConfigFacts(20480, 16, "/mnt/models/Qwen3-VL-2B-Thinking", 1024)


def test_config_from_command_line_overrides_when_no_dump() -> None:
    cmd = ("python3 -m verl.trainer.main_ppo data.max_response_length=512 trainer.n_gpus_per_node=2 trainer.nnodes=1 "
           "actor_rollout_ref.model.path=google/gemma-2-2b-it")
    assert config_dump_facts(cmd) == ConfigFacts(512, 2, "google/gemma-2-2b-it")
    assert config_dump_facts("step:1 - x:1") == ConfigFacts(None, None, None)


def test_point_mass_needs_repeats_among_many_values() -> None:
    assert point_mass_cap(16000, 96, 540) == 16000  # the rllm run
    assert point_mass_cap(16000, 1, 540) is None  # one longest response is just the longest
    assert point_mass_cap(8, 5, 6) is None  # too few distinct values to tell


def _metrics(rows: list[tuple[int, str, float]]) -> pl.LazyFrame:
    return conform(pl.DataFrame(rows, schema=["step", "metric", "value"], orient="row")
                   .with_columns(is_validation=pl.lit(False)), STEP_METRICS).lazy()


def test_clip_ratio_cap_is_the_max_of_steps_that_clipped() -> None:
    sm = _metrics([(1, "response_length/max", 700.0), (1, "response_length/clip_ratio", 0.0),
                   (2, "response_length/max", 1024.0), (2, "response_length/clip_ratio", 0.25)])
    assert clip_ratio_cap(sm) == 1024  # step 1 clipped nothing: its max is not the cap
    assert clip_ratio_cap(_metrics([(1, "response_length/max", 700.0)])) is None


def test_sources_in_priority_order_and_truncation_filled() -> None:
    s = conform(pl.DataFrame({"step": [1] * 60, "response_tokens": [*range(1, 58), 100, 100, 100]}), SAMPLES).lazy()
    sm = _metrics([(1, "response_length/max", 90.0), (1, "response_length/clip_ratio", 0.1)])
    empty_gpu = GPU_SAMPLES.empty().lazy()
    assert infer_run_facts(None, None, ConfigFacts(), s, STEP_METRICS.empty().lazy(), empty_gpu).max_response_length == 100
    f = infer_run_facts(None, None, ConfigFacts(), s, sm, empty_gpu)
    assert (f.max_response_length, f.max_response_length_source) == (90, "clip_ratio")
    f = infer_run_facts(None, 4, ConfigFacts(512, 2), s, sm, empty_gpu)
    assert (f.max_response_length, f.max_response_length_source, f.n_gpus, f.n_gpus_source) == (512, "config_dump", 4, "run.toml")
    trunc = with_truncation(s, 100).collect()["truncated"]
    assert trunc.sum() == 3 and trunc.null_count() == 0


def test_implausible_inferred_cap_passes_to_the_next_source() -> None:
    # a corrupt TRL line claimed completions/max_length 1e23 at a clipped step: int64 cannot hold it
    s = conform(pl.DataFrame({"step": [1] * 60, "response_tokens": [*range(1, 58), 100, 100, 100]}), SAMPLES).lazy()
    sm = _metrics([(1, "response_length/max", 1e23), (1, "response_length/clip_ratio", 0.9)])
    f = infer_run_facts(None, None, ConfigFacts(n_gpus=0), s, sm, GPU_SAMPLES.empty().lazy())
    assert (f.max_response_length, f.max_response_length_source) == (100, "point_mass")
    assert (f.n_gpus, f.n_gpus_source) == (None, None)  # a dump's 0 GPUs is not a count either
    assert infer_run_facts(20_000_000, None, ConfigFacts(), s, sm, GPU_SAMPLES.empty().lazy()).max_response_length == 20_000_000


def test_telemetry_counts_only_gpus_that_ever_worked() -> None:
    g = pl.DataFrame({"gpu": ["0", "0", "1", "1", "2"], "metric": "gpu_util_pct", "value": [0.0, 4.9, 0.0, 80.0, 5.0]})
    assert telemetry_gpus_used(conform(g, GPU_SAMPLES).lazy()) == 2  # GPU 0 never reached 5 %


def test_rllm_cap_inferred_from_point_mass_at_16000(real_file, tmp_path: Path) -> None:  # noqa: ANN001
    run = real_file("polytrace/rllm/profile/packed_length_log/20260616_024512")
    ingest_run(run, tmp_path / "wh", run_id="coder")
    r = scan_table(tmp_path / "wh", "runs").collect().row(0, named=True)
    assert (r["max_response_length"], r["max_response_length_source"]) == (16000, "point_mass")
    s = scan_table(tmp_path / "wh", "samples").collect()
    # raw: 96 of the 640 training responses are exactly 16000 tokens
    assert s["truncated"].sum() == 96 and s["truncated"].null_count() == 0


def test_verl_config_dump_gives_cap_and_gpus(real_file, tmp_path: Path) -> None:  # noqa: ANN001
    log = real_file("verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log")
    ingest_run(log, tmp_path / "wh", run_id="gemma")
    r = scan_table(tmp_path / "wh", "runs").collect().row(0, named=True)
    # the dump: 'max_response_length': 512 (line 87), trainer 'n_gpus_per_node': 2, 'nnodes': 1 (lines 169-170)
    assert (r["max_response_length"], r["max_response_length_source"]) == (512, "config_dump")
    assert (r["n_gpus"], r["n_gpus_source"]) == (2, "config_dump")
    assert r["model"] == "sft_model_path/global_step_58"  # line 33: the actor's 'path' (an SFT checkpoint of gemma)


@pytest.mark.parametrize("run", ["run-20251129_221801-i80f2v90"])
def test_agentic_cap_from_clip_ratio(real_file, tmp_path: Path, run: str) -> None:  # noqa: ANN001
    ingest_run(real_file(f"verl_agentic_open-agentrl/{run}/files/output.log"), tmp_path / "wh", run_id="a")
    r = scan_table(tmp_path / "wh", "runs").collect().row(0, named=True)
    # grep: the steps with response_length/clip_ratio > 0 (1-7) all have response_length/max:8096.0
    assert (r["max_response_length"], r["max_response_length_source"]) == (8096, "clip_ratio")


def test_duplicate_dcgm_scrape_counted_once(real_file, tmp_path: Path) -> None:  # noqa: ANN001
    # each .prom is cut verbatim from the scrape quoted in the .md beside it (PROVENANCE): 20 and 23 samples
    ingest_run(real_file("dcgm_prometheus"), tmp_path / "wh", run_id="dcgm")
    g = scan_table(tmp_path / "wh", "gpu_samples").collect()
    assert g.height == 20 + 23
    sf = {r["path"]: r for r in scan_table(tmp_path / "wh", "source_files").collect().iter_rows(named=True)}
    assert sf["ericsson-ccd_T4_scrape.prom"]["rows_out"] == 20 and sf["upcloud_L40S_scrape.prom"]["rows_out"] == 23
    assert sf["ericsson-ccd_accelerator_metrics.md"]["rows_superseded"] == 20
    assert sf["upcloud_accelerator-metrics.md"]["rows_superseded"] == 23
    assert sf["upcloud_accelerator-metrics.md"]["rows_out"] == 0


def test_framework_from_the_logs_when_run_toml_does_not_say(tmp_path: Path) -> None:
    """runs.framework was NULL for a verl log without run.toml; the readers know their framework."""
    from analyses.readers import reader_by_name
    from analyses.run_facts import framework_of

    fw = {f: reader_by_name(f).framework for f in ("verl_console", "trl_console", "nvidia_smi_csv", "wandb_offline")}
    assert fw == {"verl_console": "verl", "trl_console": "trl", "nvidia_smi_csv": None, "wandb_offline": None}
    assert framework_of([("verl_console", 10), ("nvidia_smi_csv", 900)], fw) == "verl"
    assert framework_of([("verl_console", 0), ("trl_console", 3)], fw) == "trl"  # a file that parsed nothing says nothing
    assert framework_of([("nvidia_smi_csv", 9)], fw) is None
    wh = tmp_path / "wh"
    for name, toml in (("plain", None), ("declared", 'framework = "my-fork"\n')):
        d = tmp_path / name
        d.mkdir()
        (d / "train.log").write_text("step:1 - timing_s/gen:1.0\n")
        if toml:
            (d / "run.toml").write_text(toml)
        ingest_run(d, wh)
    got = dict(scan_table(wh, "runs").select("run_id", "framework").collect().rows())
    assert got == {"plain": "verl", "declared": "my-fork"}
