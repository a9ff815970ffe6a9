"""verl rollout dumps (``trainer.rollout_data_dir``) and token counting (tokenizer or estimate).

The tokenizer fixture (``fixtures/verl_rollout/tokenizer_json_with_limit/tokenizer.json``) was built
offline with ``tokenizers``: a WordLevel model with the Whitespace pre-tokenizer trained on
"how many apples ? three apples , I think" and "one two three four five six seven eight nine"
(``[UNK]`` for the rest), so a text costs one token per word or punctuation run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers.base import Chunk, FileContext
from analyses.readers.tokens import ESTIMATE_SOURCE, estimate_tokens
from analyses.readers.verl_rollout import VerlRolloutDumpReader
from analyses.warehouse import scan_table

FIX = Path(__file__).parent / "fixtures" / "verl_rollout"
HECATE = "verl_rollout_dump/hecate_verl_rollouts"
ZYQIU = "verl_rollout_dump/ZyQiu6_verl_dev"


def _read(path: Path, manifest: RunManifest | None = None) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, dict]:
    chunks: list[Chunk] = list(VerlRolloutDumpReader().read(FileContext("r", path, path.name, manifest or RunManifest())))
    tables = {k: pl.concat([c.tables[k] for c in chunks]) for k in chunks[0].tables}
    rej = pl.concat([c.rejects for c in chunks if c.rejects is not None])
    acc = {k: sum(getattr(c, k) for c in chunks) for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")}
    assert acc["rows_ok"] + acc["rows_rejected"] + acc["rows_skipped"] == acc["lines"]
    return tables, rej, acc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # letter runs 2 -> 2 * 1.06 = 2.12 -> 2
        ("Hello world", 2),
        # 6 digits + 2 punctuation runs + 1 newline run = 9 -> 9.54 -> 10
        ("12 + 34 = 46\n", 10),
        # 1 letter run + 2 per-10-letters extras = 3 -> 3.18 -> 3
        ("internationalization", 3),
        # 2 CJK characters -> 2.12 -> 2
        ("東京", 2),
        # 1 punctuation run + 1 per-4-characters extra = 2 -> 2.12 -> 2
        ("####", 2),
        ("", 0),
    ],
)
def test_estimate_tokens_by_hand(text: str, expected: int) -> None:
    assert pl.select(estimate_tokens(pl.lit(text))).item() == expected


def test_estimate_tokens_keeps_nulls() -> None:
    assert pl.select(estimate_tokens(pl.lit(None, dtype=pl.String))).item() is None


@pytest.mark.parametrize(
    ("head", "name", "expected"),
    [
        ('{"input": "user\\nhi", "output": "yo", "score": 1.0, "step": 2}\n', "2.jsonl", True),
        ('{"input": 12, "output": [3, 4], "step": 2, "local_index": 0}\n', "2.jsonl", False),  # PolyTrace v2
        ('{"step": 2, "data": {"timing_s/gen": 1.0}}\n', "metrics.jsonl", False),  # verl file logger
        ('{"input": "a", "output": 5}\n', "notes.jsonl", False),
    ],
)
def test_sniff(head: str, name: str, expected: bool) -> None:
    assert VerlRolloutDumpReader().sniff(head, Path(name)) is expected


def test_multiturn_tool_calls_turns_and_bad_records() -> None:
    tables, rej, acc = _read(FIX / "multiturn_tool_calls_and_bad_records" / "3.jsonl", RunManifest(max_response_length=4))
    assert acc == {"lines": 7, "rows_ok": 3, "rows_rejected": 4, "rows_skipped": 0}
    assert dict(zip(rej["line_no"], rej["reason"], strict=True)) == {
        4: "step 4 contradicts the file name (step 3)",
        5: "duplicate request_id",
        6: "missing field: output",
        7: "wrong type for output: UBIGINT",
    }
    s = tables["samples"].sort("line_no")
    # a: two calls, then a tool response and a second assistant turn; b: a bare 'assistant' line the
    # model wrote itself and an unterminated <tool_call> (neither counts); c: special tokens kept
    assert s.select("sample_id", "group_id", "n_turns", "n_tool_calls", "reward", "validate").rows() == [
        ("a", "g1", 2, 2, 1.0, False),
        ("b", "g1", 1, 0, 0.0, False),
        ("c", "g3", 2, 1, 1.0, False),
    ]
    # estimated counts: truncation unknown even though a limit is known, nothing rejected for it
    assert s["truncated"].null_count() == 3 and set(s["token_source"]) == {ESTIMATE_SOURCE}
    t = tables["turns"].sort("sample_id", "turn")
    assert t.select("sample_id", "turn").rows() == [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1)]
    # a turn's context = the prompt + everything before it, so it grows past the prompt
    a = t.filter(pl.col("sample_id") == "a")
    assert a["prompt_tokens"][0] == s["prompt_tokens"][0] < a["prompt_tokens"][1]
    c = tables["tool_calls"].sort("sample_id", "call_index")
    assert c.select("sample_id", "turn", "call_index", "tool_name").rows() == [
        ("a", 0, 0, "calc"), ("a", 0, 1, "check"), ("c", 0, 0, "calc"),
    ]


def test_tokenizer_counts_exact_truncation_and_over_limit(warehouse: Path) -> None:
    run = FIX / "tokenizer_json_with_limit"
    report = ingest_run(run, warehouse, run_id="tok")
    # run.toml and tokenizer.json are not logs: accounted for as skipped, with why; 5.jsonl: 3 lines,
    # the third has 9 tokens > 8
    by = {f.path: f for f in report.files}
    assert {p: (by[p].status, by[p].error.split(":")[0]) for p in ("run.toml", "tokenizer.json")} == {
        "run.toml": ("skipped", "the run's run.toml"), "tokenizer.json": ("skipped", "the run's tokenizer (run.toml tokenizer)")}
    f = by["5.jsonl"]
    assert (f.path, f.lines, f.rows_ok, f.rows_rejected) == ("5.jsonl", 3, 2, 1)
    rej = scan_table(warehouse, "rejects").collect()
    assert rej["reason"].to_list() == ["response has 9 tokens, over max_response_length 8"]
    s = scan_table(warehouse, "samples").collect().sort("line_no")
    # "user\nhow many apples ?\nassistant\n" -> [UNK] how many apples ? [UNK] = 6 tokens;
    # "three apples , I think" -> 5; the eight number words -> 8 = the limit, so truncated
    assert s.select("prompt_tokens", "response_tokens", "truncated", "token_source", "task").rows() == [
        (6, 5, False, "tokenizer", "math"),
        (6, 8, True, "tokenizer", "math"),
    ]
    t = scan_table(warehouse, "turns").collect().sort("sample_id")
    assert t.select("turn", "prompt_tokens", "completion_tokens").rows() == [(0, 6, 5), (0, 6, 8)]


def test_named_tokenizer_missing_is_a_file_error(warehouse: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIX / "tokenizer_json_with_limit" / "5.jsonl", run / "5.jsonl")
    (run / "run.toml").write_text('tokenizer = "nope/tokenizer.json"\n')
    f = {f.path: f for f in ingest_run(run, warehouse).files}["5.jsonl"]
    assert f.status == "error" and "nope/tokenizer.json" in f.error


@pytest.mark.real_logs
def test_real_hecate_multiturn_dump(real_file, warehouse: Path) -> None:  # noqa: ANN001
    ingest_run(real_file(HECATE), warehouse, run_id="hecate")
    s = scan_table(warehouse, "samples").collect()
    # 1024 lines; 64 distinct inputs x 16 samples; python re over the outputs:
    # 1750 complete <tool_call>...</tool_call> blocks, 1024 + 1213 '</tool_response>\nassistant\n' = 2237 turns
    assert s.height == 1024 and s["sample_id"].n_unique() == 1024
    assert s.group_by("group_id").len()["len"].unique().to_list() == [16] and s["group_id"].n_unique() == 64
    assert s["n_tool_calls"].sum() == 1750 and s["n_turns"].sum() == 2237
    calls = scan_table(warehouse, "tool_calls").collect()
    assert calls.height == 1750 and scan_table(warehouse, "turns").collect().height == 2237
    # python re '"name"\s*:\s*"([^"]*)"' per block: 1748 calc_gsm8k_reward, 1 misspelt by the model,
    # 1 block without a name (a bare "#### 30")
    assert calls.group_by("tool_name").len().sort("tool_name", nulls_last=True).rows() == [
        ("calc_gsm8k_reward", 1748), ("calc_gsmsk_reward", 1), (None, 1),
    ]
    assert s["reward"].sum() == 691  # scores: 691 x 1.0, 333 x 0.0


@pytest.mark.real_logs
def test_real_zyqiu_single_turn_dump_and_estimate_calibration(real_file, warehouse: Path) -> None:  # noqa: ANN001
    ingest_run(real_file(ZYQIU), warehouse, run_id="zyqiu")
    s = scan_table(warehouse, "samples").collect()
    assert s.height == 128 and set(s["n_turns"]) == {1} and set(s["n_tool_calls"]) == {0}
    assert s["group_id"].n_unique() == 128 and set(s["token_source"]) == {ESTIMATE_SOURCE}
    # calibration target (tokens.py): Qwen2.5 prompt_length/mean 103.6 in verl's GSM8K baseline log,
    # minus the 5 stripped chat special tokens = ~98.6; response_length/mean of its first 5 steps 309.6
    assert s["prompt_tokens"].mean() == pytest.approx(98.6, rel=0.05)
    assert s["response_tokens"].mean() == pytest.approx(309.6, rel=0.10)


def test_batch_boundaries_keep_groups_and_duplicates(monkeypatch) -> None:  # noqa: ANN001
    # one line per decode batch: line 5 repeats request_id "a" of line 1, and lines 1 and 2 share
    # a prompt (group g1): both span batches and must read exactly as the whole file does
    import functools

    import analyses.readers.verl_rollout as mod
    from analyses.readers.typed_jsonl import decode_jsonl

    path = FIX / "multiturn_tool_calls_and_bad_records" / "3.jsonl"
    whole = _read(path, RunManifest(max_response_length=4))
    monkeypatch.setattr(mod, "decode_jsonl", functools.partial(decode_jsonl, batch_lines=1))
    tiny = _read(path, RunManifest(max_response_length=4))
    assert tiny[2] == whole[2] == {"lines": 7, "rows_ok": 3, "rows_rejected": 4, "rows_skipped": 0}
    assert tiny[1].sort("line_no").equals(whole[1].sort("line_no"))
    assert tiny[0]["samples"].select("sample_id", "group_id").rows() == [("a", "g1"), ("b", "g1"), ("c", "g3")]
    for table, df in whole[0].items():
        assert tiny[0][table].equals(df), table
