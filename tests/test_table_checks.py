"""The table checks and metadata helpers as plain functions, on hand-made frames whose answers
are written out below (no Dagster here)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from analyses import table_checks as tc
from analyses.markdown import counts_markdown
from analyses.markdown import markdown_table as markdown_preview
from analyses.metadata import column_schema, dtype_name, partition_rows, run_row_counts
from analyses.schema import STEPS, TABLES, conform
from analyses.warehouse import RunStaging, partition_files

# --- schema ------------------------------------------------------------------------------------


def test_schema_of_conformed_frame_passes() -> None:
    passed, meta = tc.check_schema({"part-0.parquet": STEPS.stored_columns}, "steps")
    assert passed and meta["files"] == 1 and meta["files_failing"] == 0


def test_schema_reports_missing_extra_and_dtype() -> None:
    schema = dict(STEPS.stored_columns)
    del schema["gen_time_s"]
    schema["step"] = pl.String()
    schema["bogus"] = pl.Int64()
    passed, meta = tc.check_schema({"a.parquet": STEPS.stored_columns, "b.parquet": schema}, STEPS)
    assert not passed
    assert meta["files_failing"] == 1 and meta["first_failing_file"] == "b.parquet"
    assert meta["problems"] == [
        "missing column gen_time_s",
        "unexpected column bogus",
        "step: String, contract says Int64",
    ]


def test_schema_reports_column_order() -> None:
    cols = list(STEPS.stored_columns.items())
    swapped = dict([cols[1], cols[0], *cols[2:]])
    passed, meta = tc.check_schema({"a.parquet": swapped}, "steps")
    assert not passed and meta["problems"] == ["columns out of contract order"]


def test_schema_without_files_fails() -> None:
    passed, meta = tc.check_schema({}, "steps")
    assert not passed and meta["problems"] == ["partition has no Parquet file"]


def _commit_run(root: Path, run_id: str, tables: dict[str, pl.DataFrame]) -> None:
    st = RunStaging(root, run_id)
    for name, df in tables.items():
        st.add(name, df)
    st.commit()


def test_schema_partition_on_disk(tmp_path: Path) -> None:
    _commit_run(tmp_path, "r1", {"steps": pl.DataFrame({"step": [1, 2], "step_time_s": [1.0, 2.0]})})
    for name in TABLES:  # commit writes every table, empty ones typed
        assert tc.check_schema_partition(tmp_path, name, "r1")[0], name
    # the published file rewritten behind the contract's back (step as text) fails the check
    (published,) = partition_files(tmp_path, "steps", "r1")
    pl.DataFrame({"step": ["3"]}).write_parquet(published)
    passed, meta = tc.check_schema_partition(tmp_path, "steps", "r1")
    assert not passed and meta["files"] == 1 and meta["first_failing_file"] == published.name
    assert meta["run_id"] == "r1"


def test_blocking_problems_name_what_stops_a_publish(tmp_path: Path) -> None:
    t = TABLES["steps"]
    good = tmp_path / "good.parquet"
    conform(pl.DataFrame({"step": [1, 2]}), t).select(list(t.stored_columns)).write_parquet(good)
    files = {name: good for name in TABLES}
    assert tc.blocking_problems({"steps": good}) != []  # the other tables are missing
    dup = tmp_path / "dup.parquet"
    conform(pl.DataFrame({"step": [1, 1]}), t).select(list(t.stored_columns)).write_parquet(dup)
    wrong = tmp_path / "wrong.parquet"
    pl.DataFrame({"step": ["3"]}).write_parquet(wrong)
    probs = tc.blocking_problems({**files, "steps": dup, "runs": wrong})
    assert any(p.startswith("runs: missing column") for p in probs)
    assert "steps: 0 null, 1 duplicated, 1 out-of-order step(s)" in probs


# --- steps -------------------------------------------------------------------------------------


def _steps(run_ids: list[str], steps: list[int | None]) -> pl.DataFrame:
    return pl.DataFrame({"run_id": run_ids, "step": steps}, schema={"run_id": pl.String, "step": pl.Int64})


def test_steps_unique_ordered_pass_per_run() -> None:
    # two runs each with steps 1, 2: unique and ordered within each run
    passed, meta = tc.check_steps_unique_ordered(_steps(["a", "a", "b", "b"], [1, 2, 1, 2]))
    assert passed
    assert meta == {
        "rows": 4,
        "distinct_steps": 4,
        "null_steps": 0,
        "duplicated_steps": 0,
        "out_of_order_rows": 0,
        "min_step": 1,
        "max_step": 2,
    }


def test_steps_duplicate_fails() -> None:
    passed, meta = tc.check_steps_unique_ordered(_steps(["a"] * 4, [1, 2, 2, 3]))
    # row 2 repeats step 2: one duplicated step, and it is not above its predecessor
    assert not passed
    assert meta["duplicated_steps"] == 1 and meta["duplicate_examples"] == [2]
    assert meta["out_of_order_rows"] == 1 and meta["first_out_of_order_row"] == 2


def test_steps_disorder_and_null_fail() -> None:
    passed, meta = tc.check_steps_unique_ordered(_steps(["a"] * 3, [2, 1, 3]))
    assert not passed and meta["duplicated_steps"] == 0 and meta["first_out_of_order_row"] == 1
    passed, meta = tc.check_steps_unique_ordered(_steps(["a"] * 2, [1, None]))
    assert not passed and meta["null_steps"] == 1


def test_steps_empty_passes() -> None:
    passed, meta = tc.check_steps_unique_ordered(STEPS.empty())
    assert passed and meta["rows"] == 0


# --- times -------------------------------------------------------------------------------------


def test_time_columns_follow_the_contract() -> None:
    cols = tc.time_columns("steps")
    assert "step_time_s" in cols and "gen_time_s" in cols and "update_actor_time_s" in cols
    assert "throughput_tokens_per_s" not in cols  # a rate, not a duration
    assert tc.time_columns("tool_calls") == ("latency_s",)
    assert tc.time_columns("turns") == ("engine_latency_s",)
    assert tc.time_columns("rank_times") == ("seconds",)
    assert tc.time_columns("samples") == ()
    assert tc.TIME_TABLES == ("steps", "turns", "tool_calls", "rank_times")


def test_non_negative() -> None:
    ok = pl.DataFrame({"gen_time_s": [1.0, None, 0.0], "step_time_s": [2.0, 3.0, 4.0]})
    passed, meta = tc.check_non_negative(ok, ["gen_time_s", "step_time_s"])
    assert passed and meta["negative_values"] == {} and meta["nan_values"] == {}
    bad = pl.DataFrame({"gen_time_s": [1.0, -0.5, -2.0], "step_time_s": [2.0, float("nan"), 1.0]})
    passed, meta = tc.check_non_negative(bad, ["gen_time_s", "step_time_s", "not_there"])
    assert not passed
    assert meta["negative_values"] == {"gen_time_s": 2} and meta["nan_values"] == {"step_time_s": 1}
    assert meta["min_value"] == -2.0 and meta["columns_checked"] == ["gen_time_s", "step_time_s"]


# --- line accounting and rejects ---------------------------------------------------------------


def _files(rows: list[tuple[str, str, int, int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema=["path", "status", "lines", "rows_ok", "rows_rejected", "rows_skipped"], orient="row"
    )


def test_lines_accounted() -> None:
    sf = _files(
        [("a.log", "ok", 10, 7, 1, 2), ("b.log", "error", 0, 0, 0, 0), ("c.log", "partial", 5, 3, 2, 0)]
    )
    passed, meta = tc.check_lines_accounted(sf)
    assert passed and meta == {"files": 3, "files_read": 2, "files_unaccounted": 0, "lines": 15}
    sf = _files([("a.log", "ok", 10, 7, 1, 1)])  # 7 + 1 + 1 = 9 != 10
    passed, meta = tc.check_lines_accounted(sf)
    assert not passed and meta["unaccounted_examples"] == ["a.log: lines=10 ok=7 rejected=1 skipped=1"]


def test_reject_share_threshold_and_reasons() -> None:
    # 95 parsed + 5 rejected = 5% exactly, at the threshold; 900 skipped lines do not dilute it
    sf = _files([("a.log", "partial", 1000, 95, 5, 900)])
    rejects = pl.DataFrame({"reason": ["bad number", "bad number", "cut line", "bad number", "cut line"]})
    passed, meta = tc.check_reject_share(sf, rejects, max_share=0.05)
    assert passed and meta["reject_share"] == 0.05 and meta["rows_rejected"] == 5
    assert meta["top_reasons"] == {"bad number": 3, "cut line": 2}
    assert meta["worst_files"] == ["a.log: 5.00% (5)"]
    # one more reject: 6 / 100 = 6%
    passed, meta = tc.check_reject_share(
        _files([("a.log", "partial", 1000, 94, 6, 900)]), None, max_share=0.05
    )
    assert not passed and meta["reject_share"] == 0.06


def test_reject_share_of_nothing_passes() -> None:
    passed, meta = tc.check_reject_share(_files([("x.bin", "unsupported", 0, 0, 0, 0)]))
    assert passed and meta["reject_share"] == 0.0


# --- metadata ----------------------------------------------------------------------------------


def test_markdown_preview_escapes_and_truncates() -> None:
    df = pl.DataFrame({"a": [1, 2, 3], "raw": ["x|y", "z" * 100, None], "v": [0.123456789, None, 2.0]})
    md = markdown_preview(df, n=2, max_chars=10)
    lines = md.splitlines()
    assert lines[0] == "| a | raw | v |"
    assert lines[1] == "| --- | --- | --- |"
    assert lines[2] == "| 1 | x\\|y | 0.123457 |"
    assert lines[3] == "| 2 | zzzzzzzzz… |  |"
    assert lines[-1] == "_first 2 of 3 rows_"
    assert markdown_preview(df.head(2), total_rows=1000).endswith("_first 2 of 1,000 rows_")
    assert markdown_preview(df.clear()).endswith("_(no rows)_")


def test_markdown_preview_datetime() -> None:
    df = pl.DataFrame({"ts": [datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)]})
    assert "| 2025-01-02 03:04:05+00:00 |" in markdown_preview(df)


def test_column_schema_and_dtype_names() -> None:
    cols = column_schema("steps")
    assert [c[0] for c in cols] == list(STEPS.columns)
    assert cols[0][2] and "partition" in cols[0][2]  # run_id
    assert cols[1] == ("step", "Int64", "key column; training step")
    assert dict((n, t) for n, t, _ in cols)["ts"] == "Datetime(us, UTC)"
    assert dtype_name(pl.Datetime("ns")) == "Datetime(ns)"


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_contract_column_is_described(table: str) -> None:
    # the Dagster UI and docs show these: a column without one is a contract gap
    bare = [name for name, _t, doc in column_schema(table) if not doc or doc == "key column"]
    assert bare == [], f"{table}: describe {bare} in analyses/schema.py"


def test_row_counts(tmp_path: Path) -> None:
    _commit_run(tmp_path, "r1", {"steps": conform(pl.DataFrame({"step": [1, 2, 3]}), "steps")})
    assert partition_rows(tmp_path, "steps", "r1") == 3
    assert partition_rows(tmp_path, "steps", "nope") == 0
    counts = run_row_counts(tmp_path, "r1", ["steps", "samples"])
    assert counts == {"steps": 3, "samples": 0}
    assert counts_markdown(counts).splitlines() == [
        "| table | rows |",
        "| --- | ---: |",
        "| steps | 3 |",
        "| samples | 0 |",
    ]


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_table_has_a_schema_check_input(table: str) -> None:
    # the contract's empty frame passes its own schema check: the check and conform agree
    passed, _ = tc.check_schema({"p": TABLES[table].empty().drop("run_id").schema}, table)
    assert passed
