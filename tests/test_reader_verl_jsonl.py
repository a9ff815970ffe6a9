"""verl JSONL file logger reader (``{"step": N, "data": {...}}``)."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import Chunk, FileContext, read_head
from analyses.readers.verl_jsonl import VerlFileLoggerReader
from analyses.warehouse import scan_table

FIX = Path(__file__).parent / "fixtures" / "verl_jsonl"
REAL = "verl_jsonl_filelogger/HanlinDu_verl/verl_examples/gsm8k.jsonl"


def _read(path: Path, batch_lines: int | None = None) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
    reader = VerlFileLoggerReader()
    if batch_lines is not None:
        reader.batch_lines = batch_lines
    chunks: list[Chunk] = list(reader.read(FileContext("r", path, path.name, RunManifest())))
    sm = pl.concat([c.tables["step_metrics"] for c in chunks])
    rej = pl.concat([c.rejects for c in chunks if c.rejects is not None])
    acc = {
        k: sum(getattr(c, k) for c in chunks) for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")
    }
    assert acc["rows_ok"] + acc["rows_rejected"] + acc["rows_skipped"] == acc["lines"]
    return sm, rej, acc


def _value(sm: pl.DataFrame, step: int, metric: str) -> float:
    return sm.filter((pl.col("step") == step) & (pl.col("metric") == metric))["value"].item()


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('{"step":0,"data":{"val-core/x/acc/mean@1":0.0}}\n', True),  # orjson, compact
        ('{"step": 12, "data": {"timing/gen": 1.5}}\n', True),  # json.dumps, spaces
        ('\n{"step": 1, "data": {}}\n', True),  # leading blank line
        ('{"_step": 1, "loss": 0.5}\n', False),  # generic metrics export
        ('{"step": 1, "rank": 0, "dp_rank": 0, "input": 12, "output": [30]}\n', False),  # PolyTrace v2
        ('{"data": {"a": 1}, "step": 1}\n', False),  # not verl's key order
        ("step:1 - timing_s/gen:1.0 - timing_s/step:2.0\n", False),  # console log
        ("", False),
    ],
)
def test_sniff(head: str, expected: bool) -> None:
    assert VerlFileLoggerReader().sniff(head, Path("x.jsonl")) is expected


def test_json_dumps_generation_spaces_nan_and_old_timing_keys() -> None:
    sm, rej, acc = _read(FIX / "json_dumps_spaces_nan.jsonl")
    # 3 lines, all parsed; 2 + 7 + 7 values, all numeric (NaN/Infinity included)
    assert acc == {"lines": 3, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 0}
    assert rej.height == 0
    assert sm.height == 16
    assert sm.group_by("step").len().sort("step")["len"].to_list() == [2, 7, 7]
    # timing/ (verl < 0.3) is canonicalised, the raw name is kept
    gen = sm.filter((pl.col("step") == 1) & (pl.col("metric") == "timing_s/gen"))
    assert gen["raw_metric"].item() == "timing/gen"
    assert gen["value"].item() == 12.0
    assert _value(sm, 1, "actor/pg_loss") != _value(sm, 1, "actor/pg_loss")  # NaN
    assert _value(sm, 1, "actor/grad_norm") == float("inf")
    assert _value(sm, 2, "actor/grad_norm") == float("-inf")
    assert sm.filter(pl.col("step") == 0)["is_validation"].all()
    assert not sm.filter(pl.col("step") > 0)["is_validation"].any()
    assert sm["line_no"].to_list() == [1] * 2 + [2] * 7 + [3] * 7


def test_orjson_generation_nulls_strings_bools(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="analyses.readers.flat_metrics"):
        sm, rej, acc = _read(FIX / "orjson_compact_nulls_strings.jsonl")
    assert acc == {"lines": 3, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 0}
    assert rej.height == 0  # a word among the values does not reject its line
    # step 1: gen, step, target_ratio "0.5", eps "1e-3", applied true, throughput -> 6
    #         (pg_loss null, mode "schedule", budget_reason "" are not metrics)
    # step 2: gen, step, pg_loss, target_ratio, eps, applied false, val acc -> 7
    #         (throughput null, mode "hold", budget_reason "disabled" are not metrics)
    assert sm.group_by("step").len().sort("step")["len"].to_list() == [2, 6, 7]
    assert _value(sm, 1, "resize/target_ratio") == 0.5
    assert _value(sm, 1, "resize/eps") == pytest.approx(1e-3)
    assert _value(sm, 1, "resize/applied") == 1.0
    assert _value(sm, 2, "resize/applied") == 0.0
    assert (
        sm.filter(
            pl.col("metric").is_in(["resize/mode", "resize/budget_reason", "actor/pg_loss"])
            & (pl.col("step") == 1)
        ).height
        == 0
    )
    val = sm.filter((pl.col("step") == 2) & (pl.col("metric") == "val-core/openai/gsm8k/acc/mean@1"))
    assert val["is_validation"].item() is True
    # what was dropped is counted in the per-file log: 2 nulls, 4 words
    assert "'null': 2, 'non_numeric_string': 4" in caplog.text


def test_bad_lines_rejected_with_reasons() -> None:
    sm, rej, acc = _read(FIX / "bad_lines.jsonl")
    # 13 lines: 1 and 13 parsed; 2 blank, 11 ({}), 12 (only null/word) skipped; 8 rejected
    assert acc == {"lines": 13, "rows_ok": 2, "rows_rejected": 8, "rows_skipped": 3}
    assert dict(zip(rej["line_no"].to_list(), rej["reason"].to_list(), strict=True)) == {
        3: "invalid JSON",
        4: "not a JSON object",
        5: "missing key 'step'",
        6: "missing key 'data'",
        7: "step is not an integer: 4",
        8: "step is not an integer: 5.5",
        9: "negative step: -6",
        10: "'data' is not a JSON object",
    }
    assert rej.filter(pl.col("line_no") == 3)["raw"].item() == '{"step":2,"data":{"timing_s/gen":11.0,'
    assert sorted(sm["step"].unique().to_list()) == [1, 10]  # 10.0 reads as step 10


def test_small_batches_same_result() -> None:
    whole = _read(FIX / "bad_lines.jsonl")
    tiny = _read(FIX / "bad_lines.jsonl", batch_lines=2)  # two lines per batch
    reader = VerlFileLoggerReader()
    reader.batch_lines = 2
    path = FIX / "bad_lines.jsonl"
    assert len(list(reader.read(FileContext("r", path, path.name, RunManifest())))) > 3
    assert tiny[2] == whole[2]
    assert tiny[0].equals(whole[0])
    assert tiny[1].equals(whole[1])


def test_resumed_run_relogged_step_last_wins(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    ingest_run(FIX / "resumed_relogged_step.jsonl", wh, run_id="resumed")
    steps = scan_table(wh, "steps").collect().sort("step")
    assert steps["step"].to_list() == [1, 2, 3]
    assert steps["gen_time_s"].to_list() == [10.0, 11.0, 12.0]  # line 3 re-logged step 2


@pytest.mark.real_logs
def test_real_file_counts(real_file) -> None:
    path = real_file(REAL)
    assert detect(path, read_head(path)).name == "verl_jsonl"
    sm, rej, acc = _read(path)
    assert acc == {"lines": 4, "rows_ok": 4, "rows_rejected": 0, "rows_skipped": 0}
    assert rej.height == 0
    # python3: for each line, count data values that are int/float (not None, not str):
    #   step 0: 5, step 1: 132 (142 keys - 10 strings), step 2: 121 (- 11 nulls - 10 strings),
    #   step 3: 119 (- 13 nulls - 10 strings); no bools, no numeric strings
    assert sm.group_by("step").len().sort("step")["len"].to_list() == [5, 132, 121, 119]
    assert sm.height == 377
    assert sm.filter(pl.col("step") == 0)["is_validation"].all()
    assert not sm.filter(pl.col("step") > 0)["is_validation"].any()
    assert sm.filter(pl.col("raw_metric") == "resize/mode").height == 0
    # jq -c '.data["timing_s/gen"]' gsm8k.jsonl -> null, 15.242993264924735, 0.061001008143648505, 218.38081195298582
    gen = sm.filter(pl.col("metric") == "timing_s/gen").sort("step")
    assert gen["step"].to_list() == [1, 2, 3]
    assert gen["value"].to_list() == [15.242993264924735, 0.061001008143648505, 218.38081195298582]
    # jq '.data["actor/pg_loss"]' -> step 3 is null: no row
    assert sm.filter(pl.col("metric") == "actor/pg_loss")["step"].sort().to_list() == [1, 2]


@pytest.mark.real_logs
def test_real_file_ingest(real_file, tmp_path: Path) -> None:
    path = real_file(REAL)
    wh = tmp_path / "wh"
    rep = ingest_run(path, wh, run_id="hanlin")  # a single-file run, read in place
    (f,) = rep.files
    assert (f.format, f.status, f.lines, f.rows_ok, f.rows_rejected, f.rows_skipped) == (
        "verl_jsonl",
        "ok",
        4,
        4,
        0,
        0,
    )
    sf = scan_table(wh, "source_files").collect()
    assert sf.select(
        (pl.col("rows_ok") + pl.col("rows_rejected") + pl.col("rows_skipped") == pl.col("lines")).all()
    ).item()
    assert sf["rows_out"].item() == 377
    steps = scan_table(wh, "steps").collect().sort("step")
    assert steps["step"].to_list() == [1, 2, 3]  # step 0 is validation only: not a training step
    # jq '.data["timing_s/step"]' -> 130.3738914320711, 54.33354720589705, 313.34782788995653
    assert steps["step_time_s"].to_list() == [130.3738914320711, 54.33354720589705, 313.34782788995653]
    assert steps["step_time_source"].to_list() == ["logged"] * 3
    # jq '.data["perf/total_num_tokens"]' -> 87195, 548864, 549941; throughput = tokens / step time
    assert steps["total_tokens"].to_list() == [87195.0, 548864.0, 549941.0]
    assert steps["throughput_tokens_per_s"][0] == pytest.approx(87195 / 130.3738914320711)
    assert steps["response_clip_ratio"].to_list() == [0.0166015625, 1.0, 0.9903100728988647]
    assert not steps["has_validation"].any()
    sm = scan_table(wh, "step_metrics").collect()
    assert sm.height == 377
    assert sm["path"].unique().to_list() == ["gsm8k.jsonl"]
