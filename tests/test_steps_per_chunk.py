"""``StepsAccumulator`` (steps derived chunk by chunk while a file is read) gives exactly what
``derive_steps`` gives on the staged rows: on small frames, on a resumed run that re-logs a step
in a later chunk, and on the real logs read in many small chunks."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analyses import categorical_codes
from analyses import steps as steps_mod
from analyses.manifest import RunManifest
from analyses.readers import detect, read_file
from analyses.readers.base import FileContext
from analyses.readers.verl_console import VerlConsoleReader
from analyses.schema import STEP_METRICS, conform
from analyses.steps import STEP_INPUT_METRICS, StepsAccumulator, derive_steps, metric_ids


def _rows(step: list[int], metric: list[str], value: list[float], line_no: list[int], val: bool = False) -> pl.DataFrame:
    return pl.DataFrame({"step": step, "metric": metric, "value": value, "line_no": line_no,
                         "is_validation": [val] * len(step), "raw_metric": metric})


def _old(chunks: list[pl.DataFrame], path: str = "a.log", attrs: pl.DataFrame | None = None) -> pl.DataFrame:
    staged = pl.concat([conform(c.with_columns(path=pl.lit(path)), STEP_METRICS) for c in chunks])
    return derive_steps(staged.lazy(), attrs.lazy() if attrs is not None else None)


def _new(chunks: list[pl.DataFrame], path: str = "a.log", attrs: pl.DataFrame | None = None) -> StepsAccumulator:
    acc = StepsAccumulator()
    for c in chunks:
        acc.add(c, path)
    if attrs is not None:
        acc.add_attrs(attrs, path)
    return acc


def test_resumed_step_relogged_in_a_later_chunk_takes_the_later_values() -> None:
    first = _rows([1, 1, 2, 2, 3], ["timing_s/gen", "timing_s/step", "timing_s/gen", "timing_s/step", "timing_s/gen"],
                  [1.0, 2.0, 1.5, 2.5, 1.7], [10, 10, 11, 11, 12])
    # the restart re-logs step 3 (gen only) and goes on; step 2 gets a step time again, gen not
    second = _rows([2, 3, 3, 4], ["timing_s/step", "timing_s/gen", "timing_s/step", "timing_s/gen"],
                   [9.0, 3.0, 4.0, 5.0], [20, 21, 21, 22])
    val = _rows([3], ["val-core/acc"], [0.5], [23], val=True)
    acc = _new([first, second, val])
    assert acc.exact
    got = acc.finish()
    assert_frame_equal(got, _old([first, second, val]))
    by_step = {r["step"]: r for r in got.iter_rows(named=True)}
    assert (by_step[2]["gen_time_s"], by_step[2]["step_time_s"]) == (1.5, 9.0)  # gen from chunk 1, step from 2
    assert (by_step[3]["gen_time_s"], by_step[3]["step_time_s"], by_step[3]["has_validation"]) == (3.0, 4.0, True)
    assert by_step[4]["step_time_source"] == "sum_of_stages"


def test_a_step_relogged_within_one_chunk_keeps_the_last_line() -> None:
    rows = _rows([5, 5], ["timing_s/step", "timing_s/step"], [1.0, 7.0], [3, 1])  # rows out of line order
    assert _new([rows]).finish()["step_time_s"].to_list() == [1.0]
    assert_frame_equal(_new([rows]).finish(), _old([rows]))


def test_chunks_out_of_line_order_or_two_metric_files_are_not_exact() -> None:
    a = _rows([1], ["timing_s/gen"], [1.0], [10])
    b = _rows([2], ["timing_s/gen"], [2.0], [5])
    assert not _new([a, b]).exact
    acc = _new([a])
    acc.add(b, "b.log")
    assert not acc.exact
    acc.discard("b.log")  # a file that failed: its rows were not staged
    assert acc.exact and acc.finish()["gen_time_s"].to_list() == [1.0]


def test_a_null_value_makes_the_staged_path_decide() -> None:
    rows = _rows([1, 1], ["timing_s/gen", "timing_s/gen"], [1.0, None], [1, 2])  # type: ignore[list-item]
    assert not _new([rows]).exact


REAL = [
    "verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log",
    "verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log",
    "verl/GUI-Cursor-Moving_verl_demo.log",
    "verl_agentic_open-agentrl/run-20251129_221801-i80f2v90/files/output.log",
    "unsloth_grpo/run-20251217-122231.log",
    "trl_grpo_terminal/20251022_181457/run_terminal.md",
    "verl_jsonl_filelogger/HanlinDu_verl/verl_examples/gsm8k.jsonl",
]


@pytest.mark.parametrize("rel", REAL)
def test_real_log_in_small_chunks_matches_derive_steps(real_file, rel: str) -> None:
    path: Path = real_file(rel)
    reader = detect(path)
    assert reader is not None
    if isinstance(reader, VerlConsoleReader):
        reader = VerlConsoleReader(batch_lines=64, max_workers=1)  # many chunks, steps split across them
    ctx = FileContext(run_id="r", path=path, rel_path=rel, manifest=RunManifest())
    chunks, attrs, summaries = [], [], []
    for chunk in read_file(reader, ctx):
        if "step_metrics" in chunk.tables:
            chunks.append(chunk.tables["step_metrics"])
            summaries.append(chunk.step_summary)
        if chunk.step_attrs is not None and chunk.step_attrs.height:
            attrs.append(chunk.step_attrs)
    assert chunks
    acc = _new(chunks, rel)
    # the verl console reader summarizes its chunks on its parsing threads: the same steps
    assert all(s is not None for s in summaries) == isinstance(reader, VerlConsoleReader)
    given = StepsAccumulator()
    for c, s in zip(chunks, summaries, strict=True):
        given.add(c, rel, s)
    for a in attrs:
        acc.add_attrs(a, rel)
        given.add_attrs(a, rel)
    assert acc.exact and given.exact and given.repeated_paths == acc.repeated_paths
    assert_frame_equal(given.finish(), acc.finish())
    # the staged attrs as the ingest used to read them back (every column, typed)
    typed = {"step": pl.Int64, "ts": pl.Datetime("us", "UTC"), "truncated_line": pl.Boolean}
    staged = [a.select([(pl.col(c).cast(t) if c in a.columns else pl.lit(None, dtype=t)).alias(c)
                        for c, t in typed.items()]) for a in attrs]
    old = _old(chunks, rel, pl.concat(staged) if staged else None)
    assert old.height > 0
    assert_frame_equal(acc.finish(), old)


@pytest.mark.parametrize("dense", [True, False])
def test_metric_ids_equal_for_equal_names_and_step_input_codes(monkeypatch: pytest.MonkeyPatch, dense: bool) -> None:
    if not dense:  # the sort path, taken when the global categories hold many more names than the chunk
        monkeypatch.setattr(categorical_codes, "DENSE_CODES_PER_ROW", 0)
        monkeypatch.setattr(categorical_codes, "DENSE_CODES_SLACK", 0)
    names = ["timing_s/gen", "x/y", None, "timing_s/gen", "timing_s/step", None]
    gen, step = STEP_INPUT_METRICS.index("timing_s/gen"), STEP_INPUT_METRICS.index("timing_s/step")
    ids, code = metric_ids(pl.Series(names, dtype=pl.Categorical))
    assert code.tolist() == [gen, -1, -1, gen, step, -1]
    assert ids[0] == ids[3] and ids[2] == ids[5]  # a null name is a name too
    assert len({int(ids[i]) for i in (0, 1, 2, 4)}) == 4
    names_again, code = metric_ids(pl.Series(names, dtype=pl.String))  # names are their own ids
    assert code.tolist() == [gen, -1, -1, gen, step, -1] and names_again.to_list() == names


def test_categorical_chunk_with_steps_going_back_a_validation_line_and_a_null_name() -> None:
    # one chunk, line by line: steps 7, 8 then (a restart) 1, 2 (no key twice: the fast path); line 4
    # holds a validation metric of step 1 beside its training ones; line 5 a name the reader lost (step 2
    # has no timing_s/step: its step time is the sum of its stages, gen)
    rows = pl.DataFrame({
        "step": [7, 7, 8, 8, 1, 1, 1, 2, 2],
        "metric": ["timing_s/gen", "timing_s/step", "timing_s/gen", "timing_s/step", "timing_s/gen",
                   "timing_s/step", "val-core/acc", "timing_s/gen", None],
        "value": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.5, 7.0, 8.0],
        "line_no": [1, 1, 2, 2, 4, 4, 4, 5, 5],
        "is_validation": [False] * 6 + [True, False, False],
    }).with_columns(pl.col("metric").cast(pl.Categorical))
    acc = _new([rows])
    assert acc.exact and acc.repeated_paths == []
    got = acc.finish()
    assert got.select("step", "gen_time_s", "step_time_s", "has_validation").rows() == [
        (1, 5.0, 6.0, True), (2, 7.0, 7.0, False), (7, 1.0, 2.0, False), (8, 3.0, 4.0, False)]
    assert_frame_equal(got, _old([rows.with_columns(pl.col("metric").cast(pl.String))]))


def test_a_metric_twice_on_a_categorical_line_is_a_repeat() -> None:
    # lines 2 and 3 share a sequence that names timing_s/gen twice: the first of them is checked
    rows = pl.DataFrame({
        "step": [1, 1, 2, 2, 3, 3], "line_no": [1, 1, 2, 2, 3, 3], "value": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        "metric": ["timing_s/gen", "timing_s/step", "timing_s/gen", "timing_s/gen", "timing_s/gen", "timing_s/gen"],
        "is_validation": [False] * 6,
    }).with_columns(pl.col("metric").cast(pl.Categorical))
    acc = _new([rows])
    assert acc.repeated_paths == ["a.log"]
    assert acc.exact  # the last value still wins, through the path that dedupes
    got = acc.finish()
    assert got.select("step", "gen_time_s", "step_time_s").rows() == [(1, 1.0, 2.0), (2, 4.0, 4.0), (3, 6.0, 6.0)]
    assert_frame_equal(got, _old([rows.with_columns(pl.col("metric").cast(pl.String))]))


def test_join_steps_side_by_side_equals_the_hash_join() -> None:
    left = pl.DataFrame({"step": [1, 2, 3]})
    same = pl.DataFrame({"step": [1, 2, 3], "x": [10.0, None, 30.0]})
    assert steps_mod._join_steps(left, same).to_dict(as_series=False) == {"step": [1, 2, 3], "x": [10.0, None, 30.0]}
    other = pl.DataFrame({"step": [3, 1], "x": [30.0, 10.0]})  # other steps, other order: the hash join
    got = steps_mod._join_steps(left, other).sort("step")
    assert got.to_dict(as_series=False) == {"step": [1, 2, 3], "x": [10.0, None, 30.0]}


@pytest.mark.parametrize("order", [[1, 2, 3], [3, 1, 2, 1]])
def test_step_attrs_one_row_per_step_or_many(order: list[int]) -> None:
    # ascending attrs (one row per step) skip the group_by: the same ts and truncated_line either way
    ts = pl.Series([None, "2024-01-01 00:00:01", "2024-01-01 00:00:02", None]).str.to_datetime(time_zone="UTC")
    attrs = pl.DataFrame({"step": order, "ts": ts[: len(order)], "truncated_line": [None, True, False, None][: len(order)]})
    wide = pl.DataFrame({"step": [1, 2, 3], "timing_s/step": [1.0, 2.0, 3.0]})
    flags = pl.DataFrame({"step": [1, 2, 3], "is_training": [True] * 3, "is_val": [False] * 3})
    got = steps_mod.steps_from_wide(wide, flags, attrs.lazy())
    want_ts = {1: [None, None], 2: ["2024-01-01 00:00:01", None], 3: ["2024-01-01 00:00:02", None]}
    if order == [1, 2, 3]:
        assert got.get_column("truncated_line").to_list() == [False, True, False]
        assert got.get_column("ts").dt.to_string("%Y-%m-%d %H:%M:%S").to_list() == [
            want_ts[1][0], want_ts[2][0], want_ts[3][0]]
    else:  # step 1 twice: its last non-null ts (the fourth row has none: the second row's), any() of its flags
        assert got.get_column("truncated_line").to_list() == [True, False, False]
        assert got.get_column("ts").dt.to_string("%Y-%m-%d %H:%M:%S").to_list() == [
            "2024-01-01 00:00:01", "2024-01-01 00:00:02", None]


@pytest.mark.parametrize("attrs", [None, pl.DataFrame({"step": [1, 2], "ts": [None, None], "truncated_line": [False, True]},
                                                      schema_overrides={"ts": pl.Datetime("us", "UTC")})])
def test_a_run_without_step_metrics_has_no_steps_rows_without_deriving_them(monkeypatch: pytest.MonkeyPatch,
                                                                              attrs: pl.DataFrame | None) -> None:
    """Workload logs alone (no step metric, maybe step attributes): the empty ``steps`` the derivation
    gives, typed as it types them, without running it."""
    acc = _new([], attrs=attrs)
    derived = steps_mod.steps_from_wide(pl.DataFrame(schema={"step": pl.Int64}),
                                        pl.DataFrame(schema={"step": pl.Int64, "is_training": pl.Boolean,
                                                             "is_val": pl.Boolean}), acc.step_attrs())
    staged = _old([_rows([], [], [], [])], attrs=attrs)  # derive_steps on the (no) staged rows
    monkeypatch.setattr(steps_mod, "steps_from_wide", lambda *_a, **_k: pytest.fail("derived"))
    got = acc.finish()
    assert got.height == 0
    assert_frame_equal(got, derived)
    assert_frame_equal(got, staged)
