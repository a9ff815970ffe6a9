"""`polytrace query` runs in DuckDB's sandbox: the probes that once wrote files, attached databases,
corrupted the warehouse or read host files are refused with one line and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyses.api import PolyTrace
from analyses.cli import main


@pytest.fixture()
def wh(tmp_path: Path) -> Path:
    run = tmp_path / "logs" / "demo"
    run.mkdir(parents=True)
    (run / "train.log").write_text("".join(f"step:{s} - timing_s/step:{s}.5 - timing_s/gen:1.0\n" for s in range(3)))
    root = tmp_path / "wh"
    PolyTrace(root).ingest(run, run_id="demo")
    return root


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix != ".lock"}


def _refused(sql: str, wh: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = _files(wh)
    assert main(["query", sql, "--warehouse", str(wh)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert _files(wh) == before  # the warehouse is byte for byte what it was
    return err[0]


def test_copy_to_a_file_hidden_behind_a_comment_is_refused(wh: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "x.csv"
    assert "COPY statements are not allowed" in _refused(f"/* */ COPY (SELECT 1) TO '{out}'", wh, capsys)
    assert not out.exists()


def test_copy_over_a_warehouse_file_is_refused(wh: Path, capsys) -> None:
    # an allowed path is writable too: only the statement check stops this one
    (target,) = (wh / "parquet" / "runs").rglob("*.parquet")
    msg = _refused(f"COPY (SELECT 42 AS x) TO '{target}' (FORMAT parquet)", wh, capsys)
    assert "read-only" in msg


def test_attach_and_create_after_a_select_are_refused_before_anything_runs(wh: Path, tmp_path: Path,
                                                                          capsys) -> None:
    db = tmp_path / "a.duckdb"
    msg = _refused(f"SELECT 1; ATTACH '{db}' AS a; CREATE TABLE a.t AS SELECT 42", wh, capsys)
    assert msg.endswith("statement 2: ATTACH statements are not allowed (only queries)")
    assert not db.exists()


def test_host_files_and_unpublished_paths_cannot_be_read(wh: Path, tmp_path: Path, capsys) -> None:
    assert "Permission Error" in _refused("SELECT * FROM read_csv('/etc/passwd', sep=':')", wh, capsys)
    stray = tmp_path / "stray.csv"
    stray.write_text("a\n1\n")
    assert "Permission Error" in _refused(f"SELECT * FROM read_csv('{stray}')", wh, capsys)
    # a directory listing of the warehouse is not a published file either
    assert "Permission Error" in _refused(f"SELECT * FROM glob('{wh}/**')", wh, capsys)


def test_the_sandbox_cannot_be_switched_off(wh: Path, capsys) -> None:
    assert "SET statements are not allowed" in _refused("SET enable_external_access = true", wh, capsys)
    assert "read-only" in _refused("SELECT 1; RESET lock_configuration", wh, capsys)


def test_every_statement_prints_its_result(wh: Path, capsys) -> None:
    sql = "SELECT count(*) AS n FROM steps; SELECT max(step) AS last FROM steps"
    assert main(["query", sql, "--warehouse", str(wh)]) == 0
    out = capsys.readouterr().out
    assert "-- [1/2] SELECT count(*) AS n FROM steps" in out and "-- [2/2] SELECT max(step) AS last FROM steps" in out
    results = PolyTrace(wh).query(sql)
    assert [df.item() for _stmt, df in results] == [3, 2]
