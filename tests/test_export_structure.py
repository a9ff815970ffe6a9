"""Our structural checks of exports (``ExportFormat.check``, what ``make demo`` reports): each catches the
defect a consumer complained about, on a hand-made directory."""

from __future__ import annotations

import json
from pathlib import Path

from analyses.export.registry import export_format
from analyses.export.structure import (
    check_aiperf,
    check_mooncake,
    check_polytrace_params,
    check_polytrace_v1,
    check_polytrace_v2,
    check_vidur,
)


def _jsonl(p: Path, recs: list[dict]) -> None:
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _mooncake(d: Path, recs: list[dict]) -> Path:
    _jsonl(d / "mooncake_trace.jsonl", recs)
    return d


def test_every_format_declares_its_structural_check():
    assert export_format("mooncake").check is check_mooncake and export_format("vidur").check is check_vidur


def test_mooncake_hash_id_materialised_at_two_block_sizes(tmp_path):
    # aiperf: "hash_id 0 requested at 512 tokens but was already materialized at 320 tokens"
    ok = [{"timestamp": 0, "input_length": 832, "output_length": 5, "hash_ids": [0, 1]},  # blocks 512 + 320
          {"timestamp": 0, "input_length": 832, "output_length": 5, "hash_ids": [0, 1]}]
    assert check_mooncake(_mooncake(tmp_path, ok)) == []
    bad = ok + [{"timestamp": 1, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]}]  # id 1 now 512
    assert check_mooncake(_mooncake(tmp_path, bad)) == ["line 3: hash id 1 stands for 512 tokens, earlier for 320"]


def test_mooncake_fractional_or_backward_timestamps(tmp_path):
    recs = [{"timestamp": 10.5, "input_length": 3, "output_length": 1, "hash_ids": [0]},
            {"timestamp": 9, "input_length": 3, "output_length": 1, "hash_ids": [0]}]
    assert check_mooncake(_mooncake(tmp_path, recs)) == ["fractional-millisecond timestamps", "timestamps go backwards"]


def test_mooncake_hash_count_must_cover_the_input(tmp_path):
    recs = [{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [0]}]  # ceil(513/512) = 2
    assert check_mooncake(_mooncake(tmp_path, recs)) == ["line 1: 1 hash ids for 513 tokens"]


def test_aiperf_probabilities_must_sum_to_100(tmp_path):
    (tmp_path / "aiperf_sequence_distribution.txt").write_text("100|10,20|2:33.333;200|10,40|2:66.666\n")
    (tmp_path / "aiperf_sequence_distribution.json").write_text(json.dumps({"pairs": [{"prob": 50.0}, {"prob": 50.0}]}))
    assert check_aiperf(tmp_path) == ["aiperf_sequence_distribution.txt: probabilities sum to 99.999000, not 100"]


def _turn(gpl: int, append: int, t: int) -> dict:
    return {"turn": t, "generation_prompt_len": gpl, "prompt_tokens": gpl, "assistant_append_len": append}


def _record(**over) -> dict:
    # prompt 100; turn 0 appends 10 + a tool call of 40 -> turn 1 starts at 150
    r = {"prompt_len": 100, "turns": [_turn(100, 10, 0), _turn(150, 20, 1)], "tool_calls": [{"turn": 0, "append_len": 40}],
         "final_response_len": 70, "response_loss_mask_rle": [[1, 10], [0, 40], [1, 20]], "prompt_group_id": 0, "sample_id": 0}
    return {**r, **over}


def test_v2_multiturn_steps_numbered_from_zero_with_replay_fields(tmp_path):
    _jsonl(tmp_path / "multiturn_workload_step_0.jsonl", [_record()])
    assert check_polytrace_v2(tmp_path) == []
    _jsonl(tmp_path / "multiturn_workload_step_2.jsonl", [_record(tool_calls=[{"turn": 0}])])
    assert check_polytrace_v2(tmp_path) == ["steps [0, 2] are not numbered 0..1",
                                            "multiturn_workload_step_2.jsonl tool_calls: no append_len"]


def test_v2_turn_context_must_be_the_claimed_prompt_tokens(tmp_path):
    t1 = {**_turn(150, 20, 1), "prompt_tokens": 160}
    _jsonl(tmp_path / "multiturn_workload_step_0.jsonl", [_record(turns=[_turn(100, 10, 0), t1])])
    assert check_polytrace_v2(tmp_path) == [
        "multiturn_workload_step_0.jsonl: 1 turn(s) whose generation_prompt_len is not their prompt_tokens"]


def test_v1_outputs_must_split_over_inputs(tmp_path):
    (tmp_path / "workload_v1.json").write_text(json.dumps({"0": {"input": [1, 2], "output": [1, 2, 3]}}))
    assert check_polytrace_v1(tmp_path) == ["step 0: outputs do not split over 2 inputs"]


def test_params_family_must_be_scipy(tmp_path):
    doc = {"math_task": {"input_distribution": {"type": "lognorm_mix", "parameters": [1]},
                         "output_distribution": {"type": "lognorm", "parameters": [0.5, 0, 100]}}}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    assert check_polytrace_params(tmp_path) == ["math_task.input_distribution: 'lognorm_mix' is not a scipy.stats distribution"]


def test_vidur_trace_replay_file_needs_date(tmp_path):
    (tmp_path / "vidur_trace.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,2\n")
    (tmp_path / "vidur_replay_trace.csv").write_text("Time,PromptTokenCount,CompletionTokenCount\n0,1,2\n")
    (tmp_path / "vidur_interval_trace.csv").write_text("arrival_time\n")
    assert check_vidur(tmp_path) == ["vidur_replay_trace.csv: no column Date", "vidur_interval_trace.csv: no rows"]


def test_check_exports_one_line_per_format_naming_the_failing_run(tmp_path):
    from analyses.export.registry import check_exports, format_names

    good, bad = tmp_path / "run-a" / "mooncake", tmp_path / "run-b" / "mooncake"
    for d in (good, bad):
        d.mkdir(parents=True)
    _mooncake(good, [{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}])
    _mooncake(bad, [{"timestamp": 0.5, "input_length": 3, "output_length": 1, "hash_ids": [0]}])
    verdicts = check_exports(tmp_path)
    assert [v.fmt.name for v in verdicts] == list(format_names())
    moon = next(v for v in verdicts if v.fmt.name == "mooncake")
    assert moon.passed == ["run-a"]
    assert moon.line().endswith("structural check passed for 1/2 run(s); failed run-b (fractional-millisecond timestamps)")
    assert next(v for v in verdicts if v.fmt.name == "vidur").line().endswith("no exported files")


def test_consumer_line_counts_the_runs_each_format_covered(tmp_path):
    from analyses.export.registry import check_exports

    d = tmp_path / "run-a" / "mooncake"
    d.mkdir(parents=True)
    _mooncake(d, [{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}])
    moon = next(v for v in check_exports(tmp_path, ["run-a", "trl-run"]) if v.fmt.name == "mooncake")
    # a step-only run whose logs hold no prompt length gets no mooncake trace: counted, named
    assert moon.uncovered == ["trl-run"]
    assert moon.line().endswith("covered 1/2 run(s) with a workload (not trl-run); structural check passed for 1/1 run(s)")
