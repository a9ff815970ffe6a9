"""The ingest spine: accounting, idempotence, atomic replacement, parallel runs, bad files."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from analyses.api import PolyTrace
from analyses.catalog import catalog_path
from analyses.ingest import ingest_run
from analyses.schema import TABLES
from analyses.warehouse import parquet_root, read_published, scan_table

STEP_LINE = "step:{s} - timing_s/gen:{g} - timing_s/step:{t} - response_length/mean:{r}\n"


def _verl_log(n: int, start: int = 1) -> str:
    return "".join(STEP_LINE.format(s=s, g=1.5 * s, t=3.0 * s, r=100 + s) for s in range(start, start + n))


def _run(tmp_path: Path, name: str, files: dict[str, bytes | str]) -> Path:
    d = tmp_path / "logs" / name
    d.mkdir(parents=True)
    for rel, content in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return d


def _tables(root: Path) -> dict[str, pl.DataFrame]:
    return {name: scan_table(root, name).collect() for name in TABLES}


def test_every_line_accounted_for(tmp_path: Path, warehouse: Path) -> None:
    # 2 banner lines + 5 step lines + 1 blank line = 8 lines
    log = "banner: starting\nconfig: {'a': 1}\n" + _verl_log(5) + "\n"
    rep = ingest_run(_run(tmp_path, "r", {"train.log": log}), warehouse)
    (f,) = rep.files
    assert f.format == "verl_console"
    assert f.lines == 8
    assert f.rows_ok + f.rows_rejected + f.rows_skipped == f.lines
    sf = scan_table(warehouse, "source_files").collect()
    assert sf.select((pl.col("rows_ok") + pl.col("rows_rejected") + pl.col("rows_skipped") == pl.col("lines")).all()).item()
    steps = scan_table(warehouse, "steps").collect()
    assert steps["step"].to_list() == [1, 2, 3, 4, 5]
    assert steps.filter(pl.col("step") == 2)["gen_time_s"].item() == pytest.approx(3.0)


def test_reingest_is_idempotent_and_replaces_whole_partition(tmp_path: Path, warehouse: Path) -> None:
    run = _run(tmp_path, "r", {"a.log": _verl_log(4), "b.log": _verl_log(3, start=10)})
    ingest_run(run, warehouse)
    first = _tables(warehouse)
    ingest_run(run, warehouse)
    second = _tables(warehouse)
    for name in TABLES:
        assert first[name].equals(second[name]), name
    # the run shrinks: a re-ingest must not leave the old rows of b.log behind
    (run / "b.log").unlink()
    ingest_run(run, warehouse)
    steps = scan_table(warehouse, "steps").collect()
    assert steps["step"].to_list() == [1, 2, 3, 4]
    assert scan_table(warehouse, "source_files").collect()["path"].to_list() == ["a.log"]
    # no staging directory and no file of an older version is left behind
    assert not any((warehouse / ".staging").iterdir())
    published = {warehouse / f.path for f in read_published(warehouse, "r").files()}
    assert set(parquet_root(warehouse).rglob("*.parquet")) == published


def test_bad_files_are_recorded_and_the_rest_lands(tmp_path: Path, warehouse: Path) -> None:
    good = _verl_log(3)
    truncated_gz = gzip.compress((_verl_log(20000)).encode())[:5000]
    run = _run(
        tmp_path,
        "r",
        {
            "good.log": good,
            "empty.log": b"",
            "binary.bin": bytes(range(256)) * 40,
            "utf16.log": good.encode("utf-16"),
            "cut.log.gz": truncated_gz,
        },
    )
    rep = ingest_run(run, warehouse)
    by = {f.path: f for f in rep.files}
    assert by["good.log"].status == "ok" and by["good.log"].rows_ok == 3
    assert by["empty.log"].status == "empty"
    assert by["binary.bin"].status == "unsupported"
    assert by["utf16.log"].status in ("unsupported", "error")
    assert by["cut.log.gz"].status == "error" and by["cut.log.gz"].error
    # rows from the truncated gzip are discarded with its error, not half-kept
    steps = scan_table(warehouse, "steps").collect()
    assert steps["step"].to_list() == [1, 2, 3]
    sf = scan_table(warehouse, "source_files").collect()
    assert sf.height == 5
    assert sf.filter(pl.col("status") == "error")["error"].str.len_chars().min() > 0


def test_a_partial_file_says_how_many_lines_and_the_first_reason(tmp_path: Path, warehouse: Path) -> None:
    run = _run(tmp_path, "r", {"mixed.log": "step:1 - a/b:1.0\nstep:x - a/b:2.0\nstep:y - a/b:3.0\nstep:2 - a/b:4.0\n",
                               "good.log": _verl_log(2)})
    by = {f.path: f for f in ingest_run(run, warehouse).files}
    assert by["mixed.log"].status == "partial"
    assert by["mixed.log"].error == ("2 line(s) rejected; first: malformed step line: step 'x' is not an integer "
                                     "(see rejects)")
    assert by["good.log"].status == "ok" and by["good.log"].error is None


def test_catalog_file_has_every_table_by_name(tmp_path: Path, warehouse: Path) -> None:
    ingest_run(_run(tmp_path, "r", {"a.log": _verl_log(2)}), warehouse)
    con = duckdb.connect(str(catalog_path(warehouse)), read_only=True)
    con.execute("SET file_search_path = $1", [str(warehouse)])  # paths in the catalog are relative to it
    try:
        for name in TABLES:
            con.execute(f'SELECT * FROM "{name}" LIMIT 1')
        assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 2
        assert con.execute("SELECT DISTINCT run_id FROM step_metrics").fetchall() == [("r",)]
    finally:
        con.close()


def test_a_moved_warehouse_opens(tmp_path: Path, warehouse: Path) -> None:
    PolyTrace(warehouse).ingest(_run(tmp_path, "r", {"a.log": _verl_log(3)}))
    moved = tmp_path / "elsewhere" / "wh"
    shutil.copytree(warehouse, moved)
    shutil.rmtree(warehouse)
    con = duckdb.connect(str(catalog_path(moved)), read_only=True)
    con.execute("SET file_search_path = $1", [str(moved)])
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 3
    assert con.execute("SELECT count(*) FROM length_quantiles").fetchone()[0] == 0  # derived views are there too
    con.close()
    assert PolyTrace(moved).connect().execute("SELECT count(*) FROM steps").fetchone()[0] == 3


def test_empty_warehouse_views_are_typed(warehouse: Path) -> None:
    warehouse.mkdir(parents=True)
    con = PolyTrace(warehouse).connect()
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    cols = [r[0] for r in con.execute("DESCRIBE samples").fetchall()]
    assert cols == list(TABLES["samples"].columns)


_CHILD = """
import sys
from pathlib import Path
from analyses.ingest import ingest_run
ingest_run(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_two_runs_ingested_concurrently_both_land(tmp_path: Path, warehouse: Path) -> None:
    runs = [_run(tmp_path, f"run{i}", {"a.log": _verl_log(200 + i)}) for i in range(2)]
    env = dict(os.environ, POLARS_MAX_THREADS="1")
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD, str(r), str(warehouse)], env=env, stderr=subprocess.PIPE, text=True)
        for r in runs
    ]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    con = PolyTrace(warehouse).connect()
    got = con.execute("SELECT run_id, count(*) FROM steps GROUP BY 1 ORDER BY 1").fetchall()
    assert got == [("run0", 200), ("run1", 201)]
    con2 = duckdb.connect(str(catalog_path(warehouse)), read_only=True)
    con2.execute("SET file_search_path = $1", [str(warehouse)])
    assert con2.execute("SELECT count(DISTINCT run_id) FROM runs").fetchone()[0] == 2
    con2.close()


def test_run_toml_fills_runs_table(tmp_path: Path, warehouse: Path) -> None:
    toml = 'task = "math"\nframework = "verl"\nmodel = "Qwen2.5-0.5B"\nn_gpus = 2\nmax_response_length = 512\nteam = "rl"\n'
    ingest_run(_run(tmp_path, "my run!", {"a.log": _verl_log(2), "run.toml": toml}), warehouse)
    runs = scan_table(warehouse, "runs").collect()
    row = runs.row(0, named=True)
    assert row["run_id"] == "my_run"  # sanitized for a hive partition
    assert (row["task"], row["n_gpus"], row["max_response_length"]) == ("math", 2, 512)
    assert '"team": "rl"' in row["tags"]
    # run.toml is configuration, not an input log: accounted for as skipped, with why
    sf = scan_table(warehouse, "source_files").collect()
    assert sf.select("path", "status", "error").rows() == [
        ("a.log", "ok", None), ("run.toml", "skipped", "the run's run.toml: read for the run's facts, not as a log")]


def test_step_metric_carried_by_two_files_is_stored_once_from_the_better_source(tmp_path: Path, warehouse: Path) -> None:
    # a wandb-style run directory: the console's output.log and a structured history of the same
    # steps; steps 1-2 in both (the console rounds 1.25 to 1.2), step 3 only in the console
    console = "step:1 - timing_s/gen:1.2 - timing_s/step:3.0\nstep:2 - timing_s/gen:2.5 - timing_s/step:5.0\nstep:3 - timing_s/gen:4.0\n"
    history = '{"step":1,"data":{"timing_s/gen":1.25,"timing_s/step":3.0}}\n{"step":2,"data":{"timing_s/gen":2.5}}\n'
    rep = ingest_run(_run(tmp_path, "r", {"files/output.log": console, "history.jsonl": history}), warehouse)
    by = {f.path: f for f in rep.files}
    # console: 5 metric rows, 3 of them (step 1 x2, step 2 gen) also in the JSONL history
    assert (by["files/output.log"].rows_out, by["files/output.log"].rows_superseded) == (2, 3)
    assert (by["history.jsonl"].rows_out, by["history.jsonl"].rows_superseded) == (3, 0)
    sm = scan_table(warehouse, "step_metrics").collect()
    assert sm.height == 5 and sm.select(pl.struct("step", "metric", "is_validation").is_unique().all()).item()
    assert sm.filter((pl.col("step") == 1) & (pl.col("metric") == "timing_s/gen"))["value"].item() == 1.25
    kept = {(r["step"], r["metric"]): r["path"] for r in sm.iter_rows(named=True)}
    assert kept[(2, "timing_s/step")] == "files/output.log"  # only the console has it: filled in, not lost
    assert kept[(3, "timing_s/gen")] == "files/output.log"
    sf = scan_table(warehouse, "source_files").collect()
    assert sf.filter(pl.col("path") == "files/output.log")["rows_superseded"].item() == 3
    assert scan_table(warehouse, "steps").collect()["step"].to_list() == [1, 2, 3]


def test_resumed_run_split_over_two_console_logs_keeps_the_relogged_step(tmp_path: Path, warehouse: Path) -> None:
    # the resumed log re-logs step 3 (crash after it was printed, restart from the step-2 checkpoint)
    first = _verl_log(3)  # steps 1-3, gen 1.5 s per step index
    second = "step:3 - timing_s/gen:9.0 - timing_s/step:9.0 - response_length/mean:9\n" + _verl_log(1, start=4)
    rep = ingest_run(_run(tmp_path, "r", {"train-1.log": first, "train-2.log": second}), warehouse)
    assert {f.path: f.rows_superseded for f in rep.files} == {"train-1.log": 3, "train-2.log": 0}
    sm = scan_table(warehouse, "step_metrics").collect().filter(pl.col("step") == 3)
    assert sm["path"].unique().to_list() == ["train-2.log"] and sm.height == 3
    assert scan_table(warehouse, "steps").collect().filter(pl.col("step") == 3)["gen_time_s"].item() == 9.0


def test_one_file_never_loses_rows_to_deduplication(tmp_path: Path, warehouse: Path) -> None:
    rep = ingest_run(_run(tmp_path, "r", {"train.log": _verl_log(3)}), warehouse)
    assert rep.files[0].rows_superseded == 0 and rep.files[0].rows_out == 9
