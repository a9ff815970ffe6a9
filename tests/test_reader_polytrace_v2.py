"""PolyTrace v2 readers: packed lengths, reward timings, multi-turn workload, DAPO filter batches."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import Chunk, FileContext, read_head
from analyses.readers.polytrace_v2 import (
    DapoFilterReader,
    MultiturnWorkloadReader,
    PackedLengthsReader,
    RewardTimingsReader,
)
from analyses.warehouse import scan_table

FIX = Path(__file__).parent / "fixtures" / "polytrace"
PT = "polytrace"
VIDEO = f"{PT}/verl-video/profile/packed_length_log/20260609_033329"
DEEPCODER = f"{PT}/rllm/profile/packed_length_log/20260616_024512"
SEARCH = f"{PT}/search_r1/profile/multiturn_workload_log/0617_0223"
DAPO = f"{PT}/verl/profile/packed_length_log/20260614_023133"


def _read(reader, path: Path, manifest: RunManifest | None = None) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, dict]:  # noqa: ANN001
    chunks: list[Chunk] = list(reader.read(FileContext("r", path, path.name, manifest or RunManifest())))
    tables: dict[str, pl.DataFrame] = {}
    for c in chunks:
        for k, v in c.tables.items():
            tables[k] = pl.concat([tables[k], v]) if k in tables else v
    rej = pl.concat([c.rejects for c in chunks if c.rejects is not None])
    acc = {k: sum(getattr(c, k) for c in chunks) for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")}
    assert acc["rows_ok"] + acc["rows_rejected"] + acc["rows_skipped"] == acc["lines"]
    return tables, rej, acc


# ------------------------------------------------------------------ sniffing


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("packed_validate_record/packed_lengths_step_3.jsonl", "polytrace_packed_lengths"),
        ("packed_bad_records_each_kind/packed_lengths_step_1.jsonl", "polytrace_packed_lengths"),
        ("multiturn_two_calls_in_one_turn/multiturn_workload_step_4.jsonl", "polytrace_multiturn"),
        ("reward_validation_pass/reward_timings_step_0.jsonl", "polytrace_reward_timings"),
        ("dapo_inconsistent_counts/dapo_filter_indices.jsonl", "polytrace_dapo_filter"),
        ("v1_flat_n_per_prompt.json", "polytrace_v1"),
        ("mixed_formats_one_dir/2.jsonl", "verl_rollout_dump"),
    ],
)
def test_detect_picks_the_right_reader(path: str, expected: str) -> None:
    reader = detect(FIX / path)
    assert reader is not None and reader.name == expected


def test_sniff_is_strict() -> None:
    verl_filelogger = '{"step": 1, "data": {"timing_s/gen": 1.0}}\n'
    for reader in (PackedLengthsReader(), RewardTimingsReader(), MultiturnWorkloadReader(), DapoFilterReader()):
        assert not reader.sniff(verl_filelogger, Path("metrics.jsonl"))
        assert not reader.sniff("step:1 - timing_s/gen:1.0\n", Path("x.log"))
    # a verl rollout dump has text input/output, not token counts
    assert not PackedLengthsReader().sniff('{"input": "hi", "output": "yo", "step": 1}\n', Path("1.jsonl"))
    head = read_head(FIX / "reward_validation_pass" / "reward_timings_step_0.jsonl")
    assert not PackedLengthsReader().sniff(head, Path("x.jsonl"))


# ------------------------------------------------------------------ packed lengths


def test_packed_lengths_one_row_per_output_and_validate_kept() -> None:
    tables, rej, acc = _read(PackedLengthsReader(), FIX / "packed_validate_record" / "packed_lengths_step_3.jsonl")
    s = tables["samples"].sort("line_no", "sample_id")
    # 3 + 3 + 1 outputs in the file
    assert acc == {"lines": 3, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 0} and rej.height == 0
    assert s["sample_id"].to_list() == ["0-0-0", "0-0-1", "0-0-2", "1-0-0", "1-0-1", "1-0-2", "val-0-0-0"]
    assert s["group_id"].to_list() == ["0-0"] * 3 + ["1-0"] * 3 + ["val-0-0"]
    assert s["prompt_tokens"].to_list() == [100] * 3 + [200] * 3 + [300]
    assert s["response_tokens"].to_list() == [10, 20, 30, 40, 50, 60, 70]
    assert s["validate"].to_list() == [False] * 6 + [True]
    assert s["rank"].to_list() == [0, 0, 0, 4, 4, 4, 0]
    # no limit known -> truncation unknown, never guessed
    assert s["truncated"].null_count() == 7
    assert set(s["token_source"]) == {"recorded"}


def test_packed_lengths_truncation_and_over_limit_from_run_toml() -> None:
    path = FIX / "packed_validate_record" / "packed_lengths_step_3.jsonl"
    tables, _, _ = _read(PackedLengthsReader(), path, RunManifest(max_response_length=70, task="video"))
    s = tables["samples"]
    assert s.filter(pl.col("truncated"))["response_tokens"].to_list() == [70]  # 70 >= 70, nothing else
    assert set(s["task"]) == {"video"}
    # limit 60: the 70-token output is impossible -> its record (line 3) is rejected; 60 is truncated
    tables, rej, acc = _read(PackedLengthsReader(), path, RunManifest(max_response_length=60))
    assert acc["rows_ok"] == 2 and acc["rows_rejected"] == 1
    assert rej.row(0)[:2] == (3, "response length 70 exceeds max_response_length 60")
    assert tables["samples"].filter(pl.col("truncated"))["response_tokens"].to_list() == [60]


def test_packed_lengths_bad_records_each_kind() -> None:
    tables, rej, acc = _read(PackedLengthsReader(), FIX / "packed_bad_records_each_kind" / "packed_lengths_step_1.jsonl")
    # 11 lines: 2 good (lines 1, 11), 1 blank (line 2), 8 rejected, one reason each
    assert acc == {"lines": 11, "rows_ok": 2, "rows_rejected": 8, "rows_skipped": 1}
    assert dict(zip(rej["line_no"], rej["reason"], strict=True)) == {
        3: "invalid JSON",
        4: "missing field: input",
        5: "wrong type for input: VARCHAR",
        6: "negative value in output",
        7: "non-integer element in output",
        8: "step 2 contradicts the file name (step 1)",
        9: "duplicate record for this dp_rank and local_index",
        10: "empty output list",
    }
    assert tables["samples"]["response_tokens"].to_list() == [1, 2, 4]
    assert rej.filter(pl.col("line_no") == 3)["raw"].item().startswith('{"step": 1')


def test_packed_lengths_tensor_parallel_peers_are_duplicates() -> None:
    path = FIX / "packed_tp_peers_log_same_prompt" / "packed_lengths_step_0.jsonl"
    tables, rej, acc = _read(PackedLengthsReader(), path)
    # line 2 is tp_rank 1 of dp_rank 0 repeating line 1's prompt: counting it would double the prompt
    assert acc == {"lines": 3, "rows_ok": 2, "rows_rejected": 1, "rows_skipped": 0}
    assert rej.row(0)[:2] == (2, "duplicate record for this dp_rank and local_index")
    assert tables["samples"]["sample_id"].to_list() == ["0-0-0", "0-0-1", "1-0-0", "1-0-1"]


def test_packed_lengths_windows_crlf_and_bom() -> None:
    path = FIX / "packed_windows_crlf_and_bom" / "packed_lengths_step_0.jsonl"
    assert detect(path) is not None and detect(path).name == "polytrace_packed_lengths"
    tables, rej, acc = _read(PackedLengthsReader(), path)
    assert acc == {"lines": 2, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 0}
    assert tables["samples"]["response_tokens"].to_list() == [1, 2, 3]


# ------------------------------------------------------------------ reward timings


def test_reward_timings_rank_rows_and_validation_phase() -> None:
    tables, rej, acc = _read(RewardTimingsReader(), FIX / "reward_validation_pass" / "reward_timings_step_0.jsonl")
    assert acc == {"lines": 4, "rows_ok": 3, "rows_rejected": 1, "rows_skipped": 0}
    assert rej.row(0)[:2] == (4, "negative value: reward_time_s")
    rt = tables["rank_times"].sort("phase", "rank")
    assert rt.select("rank", "dp_rank", "phase", "seconds", "tokens", "tokens_max", "n_samples").rows() == [
        (0, 0, "reward", 12.5, 400, 250, 4),
        (4, 1, "reward", 30.0, 800, 300, 4),
        (0, 0, "reward_validation", 3.0, 90, 60, 2),
    ]
    assert set(rt["source"]) == {"polytrace_reward_timings"}


# ------------------------------------------------------------------ multi-turn workload


def test_multiturn_samples_turns_tool_calls() -> None:
    path = FIX / "multiturn_two_calls_in_one_turn" / "multiturn_workload_step_4.jsonl"
    tables, rej, acc = _read(MultiturnWorkloadReader(), path, RunManifest(task="search"))
    assert acc == {"lines": 5, "rows_ok": 2, "rows_rejected": 3, "rows_skipped": 0}
    assert dict(zip(rej["line_no"], rej["reason"], strict=True)) == {
        3: "final_response_len 501 exceeds max response length 500",
        4: "wrong type for turns[].completion_tokens: VARCHAR",
        5: "step 5 contradicts the file name (step 4)",
    }
    s = tables["samples"].sort("sample_id")
    assert s.select("sample_id", "group_id", "prompt_tokens", "response_tokens", "generated_tokens", "n_turns",
                    "n_tool_calls", "finish_reason", "truncated", "task").rows() == [
        ("0-0", "0", 100, 200, 50, 2, 2, "stop", False, "search"),
        ("0-1", "0", 100, 500, 500, 1, 0, "length", True, "search"),  # reached max_response_len exactly
    ]
    t = tables["turns"].sort("sample_id", "turn")
    assert t.select("sample_id", "turn", "prompt_tokens", "cached_tokens", "completion_tokens", "engine_latency_s",
                    "finish_reason").rows() == [
        ("0-0", 0, 100, 0, 20, 1.5, "tool_calls"),
        ("0-0", 1, 300, 119, 30, 2.0, "stop"),
        ("0-1", 0, 100, 99, 500, 9.0, "length"),
    ]
    c = tables["tool_calls"].sort("call_index")
    assert c.select("sample_id", "turn", "call_index", "tool_name", "latency_s", "status", "response_tokens").rows() == [
        ("0-0", 0, 0, "search", 0.1, "success", 80),
        ("0-0", 0, 1, "search", 0.3, "unknown", 70),
    ]


# ------------------------------------------------------------------ DAPO filter


def test_dapo_filter_batches_and_inconsistent_counts() -> None:
    tables, rej, acc = _read(DapoFilterReader(), FIX / "dapo_inconsistent_counts" / "dapo_filter_indices.jsonl")
    assert acc == {"lines": 6, "rows_ok": 2, "rows_rejected": 4, "rows_skipped": 0}
    assert dict(zip(rej["line_no"], rej["reason"], strict=True)) == {
        3: "kept_prompt_count 9 exceeds prompt_count 8",
        4: "used_prompt_count 3 exceeds kept_prompt_count 2",
        5: "kept_prompt_indices has 1 entries, kept_prompt_count says 2",
        6: "duplicate record for this trainer_step and gen_batch_index",
    }
    fb = tables["filter_batches"].sort("trainer_step", "gen_batch")
    assert fb.select("trainer_step", "gen_batch", "workload_step", "prompts_generated", "prompts_kept", "prompts_used",
                     "train_batch_size", "samples_generated", "samples_kept").rows() == [
        (1, 1, 0, 8, 3, 3, 4, 32, 12),
        (1, 2, 1, 8, 2, 1, 4, 32, 8),
    ]


# ------------------------------------------------------------------ a directory of mixed formats


def test_mixed_formats_each_file_with_its_reader(warehouse: Path) -> None:
    report = ingest_run(FIX / "mixed_formats_one_dir", warehouse, run_id="mixed")
    formats = {f.path: (f.format, f.status, f.rows_ok) for f in report.files}
    assert formats == {
        "2.jsonl": ("verl_rollout_dump", "ok", 1),
        "packed_lengths_step_0.jsonl": ("polytrace_packed_lengths", "ok", 1),
        "reward_timings_step_0.jsonl": ("polytrace_reward_timings", "ok", 1),
        "workload_v1.json": ("polytrace_v1", "ok", 1),
    }
    s = scan_table(warehouse, "samples").collect()
    # 2 packed outputs + 3 v1 outputs + 1 rollout sample
    assert s.group_by("path").len().sort("path").rows() == [
        ("2.jsonl", 1), ("packed_lengths_step_0.jsonl", 2), ("workload_v1.json", 3),
    ]
    assert scan_table(warehouse, "rank_times").collect()["seconds"].to_list() == [1.25]


# ------------------------------------------------------------------ real files


@pytest.mark.real_logs
def test_real_video_run_21_steps_64_prompts_8_samples(real_file, warehouse: Path) -> None:  # noqa: ANN001
    report = ingest_run(real_file(VIDEO), warehouse, run_id="video")
    # 21 files x 64 lines (wc -l), each line one prompt with 8 outputs
    assert {f.format for f in report.files} == {"polytrace_packed_lengths"}
    assert sum(f.lines for f in report.files) == 1344 and report.rows_rejected == 0
    s = scan_table(warehouse, "samples").collect()
    assert s.height == 10_752
    assert s.group_by("step").len()["len"].to_list() == [512] * 21
    assert s.select(pl.struct("step", "sample_id").is_unique().all()).item()


@pytest.mark.real_logs
def test_real_deepcoder_reward_timings_two_dp_ranks(real_file, warehouse: Path, tmp_path: Path) -> None:  # noqa: ANN001
    # the run directory with a run.toml naming its 16k cap (16000, the max in every file)
    run = tmp_path / "deepcoder"
    run.mkdir()
    for p in real_file(DEEPCODER).iterdir():
        shutil.copyfile(p, run / p.name)  # a symlink out of the run would not be read
    (run / "run.toml").write_text('task = "code"\nmax_response_length = 16000\n')
    ingest_run(run, warehouse)
    rt = scan_table(warehouse, "rank_times").collect()
    # reward_timings_step_{0..4}.jsonl have 2 lines each: dp_rank 0 (rank 0) and dp_rank 1 (rank 4)
    assert rt.group_by("step").agg(pl.col("dp_rank").sort()).sort("step")["dp_rank"].to_list() == [[0, 1]] * 5
    assert rt.filter((pl.col("step") == 0) & (pl.col("rank") == 4))["seconds"].item() == pytest.approx(87.05907697230577)
    s = scan_table(warehouse, "samples").collect()
    # 5 files x 16 prompts x 8 outputs; 96 outputs equal 16000 (python: sum(x >= 16000 ...))
    assert s.height == 640 and s["truncated"].sum() == 96 and set(s["task"]) == {"code"}


@pytest.mark.real_logs
def test_real_search_r1_trajectories_turns_and_calls(real_file, warehouse: Path) -> None:  # noqa: ANN001
    ingest_run(real_file(SEARCH), warehouse, run_id="search")
    s = scan_table(warehouse, "samples").collect()
    t = scan_table(warehouse, "turns").collect()
    c = scan_table(warehouse, "tool_calls").collect()
    # step 0: 2048 lines; sum(turn_count) 5455 and sum(tool_call_count) 3469 (python json over the file)
    assert s.filter(pl.col("step") == 0).height == 2048
    assert t.filter(pl.col("step") == 0).height == 5455 == s.filter(pl.col("step") == 0)["n_turns"].sum()
    assert c.filter(pl.col("step") == 0).height == 3469 == s.filter(pl.col("step") == 0)["n_tool_calls"].sum()
    # step 5: a partial step of 47 single-turn trajectories without tool calls
    assert s.filter(pl.col("step") == 5).height == 47 and c.filter(pl.col("step") == 5).height == 0
    # 37 trajectories reached max_response_len 3000 (final_response_len == 3000), 3 of them finish_reason length
    assert s["truncated"].sum() == 37
    assert set(c["tool_name"]) == {"search"} and c.filter(pl.col("status") != "success").height == 13


@pytest.mark.real_logs
def test_real_dapo_filter_one_row_per_generation_batch(real_file, warehouse: Path) -> None:  # noqa: ANN001
    ingest_run(real_file(DAPO), warehouse, run_id="dapo")
    fb = scan_table(warehouse, "filter_batches").collect().sort("workload_step")
    # dapo_filter_indices.jsonl: 6 lines, trainer steps 1,1,2,2,3,4
    assert fb["trainer_step"].to_list() == [1, 1, 2, 2, 3, 4]
    assert fb["prompts_kept"].to_list() == [27, 33, 27, 31, 34, 30]
    assert fb["prompts_used"].to_list() == [27, 5, 27, 5, 32, 30]
    assert set(fb["samples_generated"]) == {96 * 8}
    assert scan_table(warehouse, "samples").collect().height == 6 * 96 * 8


def test_invalid_utf8_byte_does_not_sink_the_file(tmp_path: Path) -> None:
    # one undecodable byte inside a string of line 2 (replaced by U+FFFD, as the console reader
    # does) and a bad record on line 3: by hand 2 parsed (1 + 2 outputs), 1 rejected
    p = tmp_path / "packed_lengths_step_0.jsonl"
    p.write_bytes(
        b'{"step": 0, "local_index": 0, "input": 3, "output": [1]}\n'
        b'{"step": 0, "local_index": 1, "input": 4, "output": [2, 5], "note": "\xff"}\n'
        b'{"step": 0, "local_index": 2, "input": "x", "output": [1]}\n'
    )
    tables, rej, acc = _read(PackedLengthsReader(), p)
    assert acc == {"lines": 3, "rows_ok": 2, "rows_rejected": 1, "rows_skipped": 0}
    assert tables["samples"]["response_tokens"].to_list() == [1, 2, 5]
    assert rej.row(0)[:2] == (3, "wrong type for input: VARCHAR")


@pytest.mark.parametrize("batch_lines", [1, 2])
@pytest.mark.parametrize(
    ("reader", "rel"),
    [
        (PackedLengthsReader(), "packed_bad_records_each_kind/packed_lengths_step_1.jsonl"),
        (PackedLengthsReader(), "packed_tp_peers_log_same_prompt/packed_lengths_step_0.jsonl"),
        (RewardTimingsReader(), "reward_validation_pass/reward_timings_step_0.jsonl"),
        (MultiturnWorkloadReader(), "multiturn_two_calls_in_one_turn/multiturn_workload_step_4.jsonl"),
        (DapoFilterReader(), "dapo_inconsistent_counts/dapo_filter_indices.jsonl"),
    ],
)
def test_batch_boundaries_do_not_hide_duplicates(monkeypatch, reader, rel: str, batch_lines: int) -> None:  # noqa: ANN001
    # a file longer than one decode batch: the duplicate of line 1 on line 2 (tp peers) or of
    # line 8 on line 9 (bad records) sits in another batch and must still be rejected, so every
    # small-batch read equals the whole-file read (whose counts the tests above pin by hand)
    import functools

    import analyses.readers.polytrace_v2 as mod
    from analyses.readers.typed_jsonl import decode_jsonl

    whole = _read(reader, FIX / rel)
    monkeypatch.setattr(mod, "decode_jsonl", functools.partial(decode_jsonl, batch_lines=batch_lines))
    tiny = _read(reader, FIX / rel)
    assert tiny[2] == whole[2]
    assert tiny[1].sort("line_no").equals(whole[1].sort("line_no"))
    for table, df in whole[0].items():
        assert tiny[0][table].equals(df), table


def test_multiturn_record_without_tool_calls_has_no_phantom_call(tmp_path: Path) -> None:
    # tool_calls is optional: line 1 omits it, line 2 has an empty list; by hand: 2 samples,
    # 1 turn, 0 tool calls (before, line 1 exploded into one all-null tool_calls row)
    p = tmp_path / "multiturn_workload_step_0.jsonl"
    p.write_text(
        '{"step": 0, "prompt_len": 5, "final_response_len": 7, "turns": [{"turn": 0, "completion_tokens": 7}],'
        ' "prompt_group_id": 0, "sample_id": 0}\n'
        '{"step": 0, "prompt_len": 5, "final_response_len": 0, "turns": [], "tool_calls": [],'
        ' "prompt_group_id": 0, "sample_id": 1}\n'
    )
    tables, _, acc = _read(MultiturnWorkloadReader(), p)
    assert acc == {"lines": 2, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 0}
    assert tables["samples"]["n_tool_calls"].to_list() == [0, 0]
    assert tables["turns"].height == 1
    assert tables["tool_calls"].height == 0
