"""Kaggle kernel logs (a JSON array of stdout/stderr records carrying a TRL/Unsloth console capture).

The fixture is written by ``tests/fixtures/kaggle/make_fixtures.py``: 100 step dicts whose values are
printed as strings, tqdm redraws on stderr, two dicts flushed in two records each, a summary dict.
Before this reader, the file was read as a TRL console capture: 0 of 100 dicts landed, 97 lines
rejected ("trainer log dict does not end the line")."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.readers import detect
from analyses.warehouse import scan_table
from tests.conftest import FIXTURES

KAGGLE = FIXTURES / "kaggle" / "trl_grpo_100_steps_values_as_strings.log"


def _ingest(tmp_path: Path, name: str, text: str | None = None, src: Path = KAGGLE):
    d = tmp_path / name
    d.mkdir()
    (d / "kernel.log").write_text(text if text is not None else src.read_text(encoding="utf-8"), encoding="utf-8")
    wh = tmp_path / "wh"
    rep = ingest_run(d, wh)
    return rep.files[0], wh


def test_detected_by_content() -> None:
    assert detect(KAGGLE).name == "kaggle_log"


def test_all_100_step_dicts_land_with_string_values_read_as_numbers(tmp_path: Path) -> None:
    f, wh = _ingest(tmp_path, "kg")
    # 210 record lines: 3 banners/warnings skipped, every other record holds a bar state or (part of) a dict
    assert (f.format, f.lines, f.rows_ok, f.rows_rejected, f.rows_skipped, f.status) == (
        "kaggle_log", 210, 207, 0, 3, "ok")
    sm = scan_table(wh, "step_metrics").collect()
    loss = sm.filter(pl.col("metric") == "loss").sort("step")
    assert loss["step"].to_list() == list(range(1, 101))  # step k: the bar's k/100 drawn before dict k
    assert loss["value"][0] == 0.005231 and loss["value"][-1] == 0.01513  # printed to 4 digits
    # the dicts flushed in two records (steps 25, 50, 75, 100) land whole, on the record where they start
    assert sm.filter((pl.col("step") == 25) & (pl.col("metric") == "response_length/mean"))["value"].item() == 625.0
    # transformers' names canonical; Unsloth's completion_length beside completions/mean_length keeps its own
    assert {"response_length/mean", "critic/score/mean", "actor/kl_loss", "completion_length"} <= set(sm["metric"])
    assert sm.filter(pl.col("metric") == "progress/step_time_s/tqdm_rate").height == 100
    assert scan_table(wh, "steps").collect()["step"].to_list() == list(range(1, 101))
    assert scan_table(wh, "rejects").collect().height == 0
    assert scan_table(wh, "runs").collect()["framework"].item() == "trl"


def test_a_bad_record_and_a_cut_dict_are_rejected_the_rest_lands(tmp_path: Path) -> None:
    lines = KAGGLE.read_text(encoding="utf-8").splitlines()
    lines[1] = ',{"stream_name":"stdout","time":13.9,"data":oops}'  # not JSON
    lines[2] = ',{"stream_name":"stdout","time":35.9}'  # no data
    text = "\n".join(lines[:-2]) + '\n,{"stream_name":"stdout","time":9999.0,"data":"{\'loss\': \'0.1\', \'gra"}\n]\n'
    f, wh = _ingest(tmp_path, "bad", text)
    assert (f.lines, f.rows_ok + f.rows_rejected + f.rows_skipped) == (210, 210)  # the summary gone, a cut dict and "]" added
    assert f.rows_rejected == 3 and f.status == "partial"
    rej = scan_table(wh, "rejects").collect().sort("line_no")
    assert rej.select("line_no", "reason").rows() == [
        (2, "invalid JSON"), (3, "missing field: data"),
        (209, "trainer log dict does not end the line (cut, nested or followed by text)")]
    assert scan_table(wh, "step_metrics").collect().filter(pl.col("metric") == "loss").height == 100


def _as_kaggle(text: str, seed: int) -> str:
    """A console capture as Kaggle would log it: records on stdout, cut at random places (a flush
    now and then mid-line) as well as at line ends."""
    rng = random.Random(seed)
    recs, i = [], 0
    while i < len(text):
        j = min(len(text), i + rng.randint(1, 400))
        recs.append({"stream_name": "stdout", "time": float(len(recs)), "data": text[i:j]})
        i = j
    return "[" + "\n,".join(json.dumps(r, ensure_ascii=False) for r in recs) + "]\n"


@pytest.mark.real_logs
@pytest.mark.parametrize("rel", ["trl_grpo_terminal/20251022_181457/run_terminal.md", "unsloth_grpo/run-20251217-122231.log"])
def test_a_real_capture_logged_by_kaggle_gives_the_captures_metrics(real_file, tmp_path: Path, rel: str) -> None:
    src = real_file(rel)
    plain, wh = _ingest(tmp_path, "plain", src=src)
    kg, _ = _ingest(tmp_path, "kaggle", _as_kaggle(src.read_text(encoding="utf-8"), seed=3))
    assert (plain.format, kg.format) == ("trl_console", "kaggle_log") and kg.rows_rejected == 0
    key = ["step", "metric", "value"]
    got = {r: scan_table(wh, "step_metrics", [r]).select(key).sort(key).collect() for r in ("plain", "kaggle")}
    assert got["plain"].height > 0 and got["kaggle"].equals(got["plain"])
