"""`polytrace query` runs in DuckDB's sandbox: the probes that once wrote files, attached databases,
corrupted the warehouse or read host files are refused with one line and change nothing; the
statement an EXPLAIN would run is the one classified; the command's own process cannot write a
file (Landlock) even where DuckDB would."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyses import landlock
from analyses.api import PolyTrace
from analyses.cli import main

REPO = Path(__file__).resolve().parents[1]
# the statement of issue 25, verbatim but for the file it names
EXPLAIN_ANALYZE_COPY = "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{}' (FORMAT parquet, USE_TMP_FILE false)"


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("sandbox")
    run = tmp_path / "logs" / "demo"
    run.mkdir(parents=True)
    (run / "train.log").write_text("".join(f"step:{s} - timing_s/step:{s}.5 - timing_s/gen:1.0\n" for s in range(3)))
    root = tmp_path / "wh"
    PolyTrace(root).ingest(run, run_id="demo")
    return root


def _published(wh: Path, table: str = "steps") -> Path:
    (target,) = (wh / "parquet" / table).rglob("*.parquet")
    return target


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _command(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``polytrace ...`` as its own process (``python -m analyses.cli``): the way it confines itself."""
    return subprocess.run([sys.executable, "-m", "analyses.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=300)


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
    target = _published(wh, "runs")
    msg = _refused(f"COPY (SELECT 42 AS x) TO '{target}' (FORMAT parquet)", wh, capsys)
    assert "read-only" in msg


def test_explain_analyze_copy_over_a_published_file_is_refused(wh: Path, capsys) -> None:
    # issue 25: EXPLAIN ANALYZE runs the statement it explains; on main this rewrote the file, exit 0
    target = _published(wh)
    before = _sha(target)
    msg = _refused(EXPLAIN_ANALYZE_COPY.format(target), wh, capsys)
    assert msg.endswith("read-only: EXPLAIN COPY statements are not allowed (only queries)")
    assert _sha(target) == before


@pytest.mark.parametrize("explain", [
    "EXPLAIN", "explain analyse", "EXPLAIN (ANALYZE)", "EXPLAIN (FORMAT json, ANALYZE)", "EXPLAIN (ANALYZE false)",
    "/* ( */ ExPlAiN -- ANALYZE (\n ( /*)*/ analyze ) /* x */", "EXPLAIN(ANALYZE)",
])
def test_every_form_of_explain_is_judged_by_the_statement_it_runs(wh: Path, explain: str, capsys) -> None:
    target = _published(wh)
    msg = _refused(f"{explain} COPY steps TO '{target}' (FORMAT parquet, USE_TMP_FILE false)", wh, capsys)
    assert "EXPLAIN COPY statements are not allowed" in msg
    assert "EXPLAIN INSERT statements" in _refused(f"SELECT 1; {explain} INSERT INTO steps SELECT * FROM steps", wh,
                                                  capsys)


@pytest.mark.parametrize("sql", ["EXPLAIN SELECT count(*) FROM steps", "EXPLAIN ANALYZE SELECT count(*) FROM steps",
                                 "EXPLAIN (FORMAT json) FROM steps", "EXPLAIN (SELECT 1)",
                                 "explain /* c */ (analyze) WITH s AS (FROM steps) SELECT max(step) FROM s"])
def test_explain_of_a_query_still_runs(wh: Path, sql: str, capsys) -> None:
    assert main(["query", sql, "--warehouse", str(wh)]) == 0
    assert capsys.readouterr().err == ""


def test_the_command_refuses_the_issue_statement_as_its_own_process(wh: Path) -> None:
    target = _published(wh)
    before = _sha(target)
    out = _command(["query", EXPLAIN_ANALYZE_COPY.format(target), "--warehouse", str(wh)])
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines() == [
        "polytrace query: error: read-only: EXPLAIN COPY statements are not allowed (only queries)"]
    assert _sha(target) == before


_WRITE_THROUGH_DUCKDB = """
import sys
from pathlib import Path
from analyses import catalog, landlock
from analyses.cli.query import query_scratch
wh, target, confine = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
with query_scratch(wh) as spill:
    if confine:
        assert landlock.confine(spill) > 0
    con = catalog.connect(wh, sandbox=True, spill=spill)
    try:  # straight to DuckDB: no statement check
        con.execute(f"COPY (SELECT 1 AS x) TO '{target}' (FORMAT parquet, USE_TMP_FILE false)")
        print("written")
    except Exception as exc:
        print(type(exc).__name__, exc)
    con.close()
"""


def test_landlock_stops_a_write_that_duckdbs_own_sandbox_allows(wh: Path, tmp_path: Path) -> None:
    """Defence in depth: were the statement check passed, DuckDB's allowed_paths would let a COPY
    overwrite a published file; the command's Landlock domain does not."""
    if landlock.abi() < 1:
        pytest.skip("this kernel has no Landlock")
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(wh, copy)
    target = _published(copy)
    before = _sha(target)
    run = [sys.executable, "-c", _WRITE_THROUGH_DUCKDB, str(copy), str(target)]
    confined = subprocess.run([*run, "1"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert "Permission denied" in confined.stdout, confined
    assert _sha(target) == before
    # the same without Landlock: DuckDB's sandbox alone writes (why the command confines itself)
    free = subprocess.run([*run, "0"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert free.stdout.strip() == "written", free
    assert _sha(target) != before
    assert not any((copy / ".scratch").iterdir())  # each query's scratch directory is gone


def test_without_landlock_the_command_says_so_only_when_required(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from analyses.cli.common import UsageError
    from analyses.cli.query import confine

    monkeypatch.setattr(landlock, "abi", lambda: 0)  # a kernel without it: nothing is confined
    assert confine(tmp_path) == 0
    monkeypatch.setenv("POLYTRACE_LANDLOCK", "require")
    with pytest.raises(UsageError, match="no Landlock"):
        confine(tmp_path)
    monkeypatch.setenv("POLYTRACE_LANDLOCK", "sometimes")
    with pytest.raises(UsageError, match="auto, require or off"):
        confine(tmp_path)


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
