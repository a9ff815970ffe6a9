"""A (step, metric) logged more than once within a run is stored once, the later occurrence kept
(docs/integrity.md, "Repeated steps"), every superseded row counted in ``source_files`` and shown
in ``run_overview``, and a warning check fires when a run repeats more than a small share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analyses.api import PolyTrace
from analyses.ingest import ingest_run
from analyses.steps import StepsAccumulator, metric_ids, step_keys_once
from analyses.table_checks import MAX_REPEATED_SHARE, check_repeated_partition, check_repeated_share
from analyses.warehouse import scan_table

QWEN = "verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
KEY = ["step", "metric", "is_validation"]


@pytest.fixture(params=[pl.String, pl.Categorical])
def _keys(request: pytest.FixtureRequest) -> Callable[..., np.ndarray | None]:
    """step_keys_once on string names and on categorical codes (the verl console reader's)."""

    def keys(line: list[int], metric: list[str], step: list[int] | None = None,
             is_val: list[bool] | None = None) -> np.ndarray | None:
        step = step if step is not None else line
        is_val = is_val if is_val is not None else [False] * len(line)
        ids = metric_ids(pl.Series(metric, dtype=request.param))[0]
        return step_keys_once(np.array(step), np.array(is_val), np.array(line), ids)

    return keys


def test_step_keys_once_finds_a_name_twice_on_one_line_and_a_step_on_two_lines(_keys: Callable) -> None:
    # three lines with the same names, one step each: the keys 2*step
    assert _keys([1, 1, 2, 2, 3, 3], ["a", "b"] * 3).tolist() == [2, 4, 6]
    # line 2 names `a` twice (its sequence differs from line 1's, so it is checked by itself)
    assert _keys([1, 1, 2, 2, 3, 3], ["a", "b", "a", "a", "a", "b"]) is None
    # a sequence seen before with a repeat in it: the first such line is checked, the next inherits
    assert _keys([1, 1, 2, 2], ["a", "a", "a", "a"]) is None
    # the same step on two lines (a step logged again), though each line is clean
    assert _keys([1, 1, 2, 2], ["a", "b", "a", "b"], step=[7, 7, 7, 7]) is None
    # one line holding training and validation metrics of one step: two keys, no repeat
    assert _keys([1, 1, 2], ["a", "val/x", "a"], step=[5, 5, 6], is_val=[False, True, False]).tolist() == [10, 11, 12]
    # rows not in line order cannot be told cheaply: treated as possibly repeated
    assert _keys([2, 1], ["a", "a"]) is None


def test_accumulator_compares_chunks_of_one_file() -> None:
    def chunk(steps: list[int], first_line: int) -> pl.DataFrame:
        return pl.DataFrame({"step": steps, "metric": ["a"] * len(steps), "value": [1.0] * len(steps),
                             "is_validation": [False] * len(steps),
                             "line_no": list(range(first_line, first_line + len(steps)))})

    acc = StepsAccumulator()
    acc.add(chunk([1, 2], 1), "a.log")
    acc.add(chunk([3, 4], 3), "a.log")
    acc.add(chunk([1, 2], 1), "b.log")  # another file: the cross-file dedupe's business, not a repeat
    assert acc.repeated_paths == []
    acc.add(chunk([4, 5], 5), "a.log")  # step 4 again, in a later chunk
    assert acc.repeated_paths == ["a.log"]


def _write(d: Path, name: str, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)
    return d


def test_a_step_logged_again_in_one_file_keeps_the_later_line(tmp_path: Path, warehouse: Path) -> None:
    # a run restarted from its step-2 checkpoint into the same log: steps 3-4 are logged twice, the
    # second time with other values; step 3's first line also has a metric the second lacks
    log = ("step:1 - timing_s/gen:1.0 - timing_s/step:2.0\n"
           "step:2 - timing_s/gen:1.0 - timing_s/step:2.0\n"
           "step:3 - timing_s/gen:1.0 - timing_s/step:2.0 - actor/lr:0.5\n"
           "step:4 - timing_s/gen:1.0 - timing_s/step:2.0\n"
           "restarting from checkpoint global_step_2\n"
           "step:3 - timing_s/gen:3.0 - timing_s/step:6.0\n"
           "step:4 - timing_s/gen:4.0 - timing_s/step:8.0\n")
    rep = ingest_run(_write(tmp_path / "r", "train.log", log), warehouse)
    (f,) = rep.files
    assert (f.rows_out, f.rows_superseded, f.rows_repeated) == (9, 4, 4)
    sm = scan_table(warehouse, "step_metrics").collect()
    assert sm.height == 9 and sm.select(pl.struct(KEY).is_unique().all()).item()
    got = {(r["step"], r["metric"]): (r["value"], r["line_no"]) for r in sm.iter_rows(named=True)}
    assert got[(3, "timing_s/gen")] == (3.0, 6) and got[(4, "timing_s/step")] == (8.0, 7)
    assert got[(3, "actor/lr")] == (0.5, 3)  # only the first copy had it: kept, not lost
    steps = scan_table(warehouse, "steps").collect()
    assert steps["step_time_s"].to_list() == [2.0, 2.0, 6.0, 8.0]
    sf = scan_table(warehouse, "source_files").collect()
    assert sf.select("rows_out", "rows_superseded", "rows_repeated").row(0) == (9, 4, 4)


def test_a_metric_named_twice_on_one_line_keeps_the_later_value(tmp_path: Path, warehouse: Path) -> None:
    log = "step:1 - a/b:1.0 - a/b:2.0 - timing_s/gen:3\nstep:2 - a/b:1.0 - timing_s/gen:3\n"
    jsonl = '{"step": 1, "data": {"a": 1, "a": 2}}\n{"step": 2, "data": {"a": 1}}\n'
    for name, text in (("v.log", log), ("f.jsonl", jsonl)):
        d = tmp_path / name.replace(".", "_")
        rep = ingest_run(_write(d, name, text), warehouse)
        assert rep.files[0].rows_repeated == 1
        sm = scan_table(warehouse, "step_metrics", [d.name]).collect()
        assert sm.select(pl.struct(KEY).is_unique().all()).item()
        metric = "a/b" if name == "v.log" else "a"
        assert sm.filter((pl.col("step") == 1) & (pl.col("metric") == metric))["value"].to_list() == [2.0]


def test_repeated_share_check_and_run_overview(tmp_path: Path, warehouse: Path) -> None:
    once = "".join(f"step:{s} - timing_s/gen:1.0 - timing_s/step:2.0\n" for s in range(1, 101))
    resumed = once + "".join(f"step:{s} - timing_s/gen:1.5 - timing_s/step:2.5\n" for s in range(100, 102))
    ingest_run(_write(tmp_path / "twice", "train.log", once + once), warehouse)
    ingest_run(_write(tmp_path / "resumed", "train.log", resumed), warehouse)
    ok, meta = check_repeated_partition(warehouse, "twice")
    assert not ok and meta["rows_repeated"] == 200 and meta["repeated_share"] == 0.5
    assert meta["files_repeating_steps"] == ["train.log: 200 row(s) logged again later in the file"]
    ok, meta = check_repeated_partition(warehouse, "resumed")  # one step re-logged of 101: 2 of 202 rows
    assert ok and meta["rows_repeated"] == 2 and meta["repeated_share"] <= MAX_REPEATED_SHARE
    pt = PolyTrace(warehouse)
    pt.refresh_catalog()
    ov = pt.view("run_overview").sort("run_id")
    assert ov.select("run_id", "superseded_rows", "repeated_rows", "steps").rows() == [
        ("resumed", 2, 2, 101), ("twice", 200, 200, 100)]


def test_repeated_share_on_a_frame() -> None:
    sf = pl.DataFrame({"path": ["a", "b"], "rows_repeated": [3, 0], "rows_superseded": [3, 10]})
    assert check_repeated_share(sf, 97)[0] is False  # 3 of 100
    assert check_repeated_share(sf, 197)[0] is True  # 3 of 200: 1.5 %
    assert check_repeated_share(sf.with_columns(rows_repeated=pl.lit(0)), 0) == (True, {
        "step_metric_rows": 0, "rows_repeated": 0, "repeated_share": 0.0, "max_share": MAX_REPEATED_SHARE,
        "rows_superseded": 13})


@pytest.mark.slow
@pytest.mark.real_logs
def test_real_verl_log_concatenated_200_times_lands_once(real_file, tmp_path: Path, warehouse: Path) -> None:
    """The issue's shape: the Qwen2.5-0.5B GSM8K log (435 steps) 200 times in one file landed 3,497,200
    step_metrics rows (200 copies of each); now the 17,486 of one copy, equal to the log ingested once."""
    src = real_file(QWEN).read_bytes()
    d = tmp_path / "rep200"
    d.mkdir()
    (d / "train.log").write_bytes(src * 200)
    once = tmp_path / "once"
    once.mkdir()
    (once / "train.log").write_bytes(src)
    rep = ingest_run(d, warehouse)
    ingest_run(once, warehouse)
    (f,) = rep.files
    assert (f.rows_out, f.rows_superseded, f.rows_repeated) == (17_486, 199 * 17_486, 199 * 17_486)
    sm = {r: scan_table(warehouse, "step_metrics", [r]).collect() for r in ("rep200", "once")}
    assert sm["rep200"].height == 17_486
    assert sm["rep200"].select(pl.struct(KEY).is_unique().all()).item()
    # the values are the last copy's (its line numbers 199 copies in), equal to the log's own
    assert sm["rep200"]["line_no"].min() > 199 * src.count(b"\n")
    joined = sm["once"].join(sm["rep200"], on=KEY, suffix="_r")
    assert joined.height == 17_486 and (joined["value"] == joined["value_r"]).all()
    steps = {r: scan_table(warehouse, "steps", [r]).collect().drop("run_id") for r in ("rep200", "once")}
    assert steps["rep200"].equals(steps["once"])
    assert not check_repeated_partition(warehouse, "rep200")[0]
