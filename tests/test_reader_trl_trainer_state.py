"""transformers ``trainer_state.json``: log_history entries -> step metrics under canonical names,
steps from ``step`` / ``epoch`` / ``logging_steps``, the summary skipped, bad entries rejected.
The fixture is written by ``tests/fixtures/trl_trainer_state/make_fixtures.py`` (invented values)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers import detect, limits
from analyses.readers.base import Chunk, FileContext, UnreadableFile
from analyses.readers.trl_trainer_state import TrainerStateReader
from analyses.warehouse import scan_table
from tests.conftest import FIXTURES

STATE = FIXTURES / "trl_trainer_state" / "nan_eval_summary_entry_without_step.json"


def _read(path: Path) -> list[Chunk]:
    return list(TrainerStateReader().read(FileContext("r", path, path.name, RunManifest())))


def test_log_history_entries() -> None:
    assert detect(STATE).name == "trl_trainer_state"
    (c,) = _read(STATE)
    # 6 entries: 3 training logs and the eval log parsed, "not an entry" rejected, the summary skipped
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (6, 4, 1, 1)
    assert c.rejects.select("line_no", "reason").rows() == [(5, "log_history entry is not an object but VARCHAR")]
    sm = c.tables["step_metrics"]

    def v(step: int, metric: str) -> float:
        return sm.filter((pl.col("step") == step) & (pl.col("metric") == metric))["value"].item()

    assert v(1, "response_length/mean") == 100.0
    assert v(2, "critic/score/mean") == 0.5
    assert v(2, "actor/kl_loss") == 0.002
    assert v(1, "timing_s/step") == 12.5  # TRL's step_time
    assert math.isnan(v(1, "grad_norm"))  # json.dumps wrote a bare NaN
    assert v(3, "response_length/mean") == 120.0  # no "step": epoch 0.75 of a 4-step epoch
    assert sm.filter(pl.col("is_validation")).select("step", "metric").rows() == [(2, "eval_loss"), (2, "eval_reward")]
    assert not sm["raw_metric"].is_in(["epoch", "step", "train_runtime", "total_flos"]).any()
    assert sm.filter(pl.col("metric") == "response_length/mean").height == 3  # completion_length kept apart
    assert set(sm.filter(pl.col("raw_metric") == "completion_length")["metric"]) == {"completion_length"}


def test_run_steps_from_trainer_state(tmp_path: Path) -> None:
    run = tmp_path / "grpo_out"
    (run / "checkpoint-4").mkdir(parents=True)
    (run / "checkpoint-4" / "trainer_state.json").write_bytes(STATE.read_bytes())
    wh = tmp_path / "wh"
    ingest_run(run, wh)
    steps = scan_table(wh, "steps").sort("step").collect()
    assert steps.select("step", "step_time_s", "step_time_source", "total_tokens").rows() == [
        (1, 12.5, "logged", None), (2, 13.0, "logged", 1100.0), (3, 14.0, "logged", 1200.0),
    ]
    assert steps["throughput_tokens_per_s"].to_list() == [None, pytest.approx(1100 / 13.0), pytest.approx(1200 / 14.0)]
    assert steps["response_clip_ratio"].to_list() == [0.125] * 3
    assert steps.filter(pl.col("step") == 2)["has_validation"].item()


def test_order_rule_when_entries_have_no_step_or_epoch(tmp_path: Path) -> None:
    doc = {"global_step": 20, "logging_steps": 10, "log_history": [{"loss": 1.0}, {"eval_loss": 2.0}, {"loss": 0.5}]}
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    (c,) = _read(p)
    assert (c.lines, c.rows_ok, c.rows_rejected) == (3, 2, 1)  # an eval log has no training order
    assert c.tables["step_metrics"].select("step", "metric").rows() == [(10, "loss"), (20, "loss")]


def test_document_nested_too_deep_or_too_large_is_refused_before_parsing(tmp_path: Path) -> None:
    # a fuzzed trainer_state.json with one entry nested 100,000 deep took DuckDB's JSON functions 6.7 GB
    doc = json.loads(STATE.read_text(encoding="utf-8"))
    p = tmp_path / "trainer_state.json"
    text = json.dumps(doc, indent=2, sort_keys=True)
    p.write_text(text.replace('"log_history": [', '"log_history": [' + "[" * 200 + "]" * 200 + ",", 1))
    assert detect(p).name == "trl_trainer_state"
    with pytest.raises(UnreadableFile, match=r"json_too_deep: nested 202 levels, over 127"):
        _read(p)
    p.write_text(text)
    with limits.override(max_json_values=2):  # the document's cap is 4 x the per-record limit
        with pytest.raises(UnreadableFile, match=r"json_too_large: about \d+ values, over 8"):
            _read(p)
    with limits.override(max_document_bytes=100):
        with pytest.raises(UnreadableFile, match="over the 100-byte document limit"):
            _read(p)
    assert _read(p)  # within the limits it reads


def test_cut_document_fails_the_file(tmp_path: Path) -> None:
    p = tmp_path / "trainer_state.json"
    p.write_text(STATE.read_text(encoding="utf-8")[:700], encoding="utf-8")
    assert detect(p).name == "trl_trainer_state"
    with pytest.raises(UnreadableFile, match="not a valid JSON document"):
        _read(p)
