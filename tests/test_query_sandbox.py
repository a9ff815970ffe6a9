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
from _sandbox_util import demo_warehouse

from analyses import landlock
from analyses.api import PolyTrace
from analyses.cli import main

REPO = Path(__file__).resolve().parents[1]
# the statement of issue 25, verbatim but for the file it names
EXPLAIN_ANALYZE_COPY = "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{}' (FORMAT parquet, USE_TMP_FILE false)"


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_warehouse(tmp_path_factory.mktemp("sandbox"))


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
    # and a query runs there, confined, under its reader lease (the lock file opened read-only)
    ok = _command(["query", "SELECT count(*) AS n FROM steps", "--format", "csv", "--warehouse", str(wh)],
                  POLYTRACE_LANDLOCK="require")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "n\n3\n", ""), ok


_WRITE_THROUGH_DUCKDB = """
import sys
from pathlib import Path
from analyses import catalog, landlock
from analyses.cli.query_run import query_scratch
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


_PROBES = """
import os, socket, subprocess, sys
from pathlib import Path
from analyses import landlock
scratch, outside, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
print("abi", landlock.confine(scratch))
def probe(name, fn):
    try:
        fn()
        print(name, "allowed")
    except OSError as exc:
        print(name, "denied" if exc.errno == 13 else exc)
probe("write scratch", lambda: (scratch / "a").write_text("x"))
probe("write outside", lambda: (outside / "a").write_text("x"))
probe("truncate outside", lambda: open(outside / "existing", "r+").truncate(0))
probe("mkdir outside", lambda: (outside / "d").mkdir())
probe("remove outside", lambda: (outside / "existing").unlink())
probe("exec", lambda: subprocess.run(["true"]))
probe("tcp", lambda: socket.create_connection(("127.0.0.1", port), timeout=5).close())
probe("remove scratch", lambda: ((scratch / "a").unlink(), scratch.rmdir()))
"""


def test_landlock_denies_writes_exec_and_tcp_outside_the_scratch_directory(tmp_path: Path) -> None:
    if landlock.abi() < 1:
        pytest.skip("this kernel has no Landlock")
    import socket

    scratch, outside = tmp_path / ".scratch" / "q", tmp_path / "outside"
    scratch.mkdir(parents=True)
    outside.mkdir()
    (outside / "existing").write_text("keep")
    with socket.create_server(("127.0.0.1", 0)) as server:  # a real listener the probe could reach
        out = subprocess.run([sys.executable, "-c", _PROBES, str(scratch), str(outside),
                              str(server.getsockname()[1])], capture_output=True, text=True, cwd=REPO, timeout=300)
    lines = dict(ln.rsplit(" ", 1) for ln in out.stdout.splitlines())
    assert lines.pop("abi") == str(landlock.abi()), out
    expected = {"write scratch": "allowed", "write outside": "denied", "truncate outside": "denied",
                "mkdir outside": "denied", "remove outside": "denied", "exec": "denied",
                "tcp": "denied" if landlock.abi() >= 4 else "allowed", "remove scratch": "allowed"}
    assert lines == expected, out
    assert (outside / "existing").read_text() == "keep" and not scratch.exists()


def test_without_landlock_the_command_says_so_only_when_required(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from analyses.cli.common import UsageError
    from analyses.cli.query_run import confine

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


def test_a_published_file_gone_is_one_line_not_a_traceback(wh: Path, tmp_path: Path, capsys) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(wh, copy)
    _published(copy).unlink()
    assert main(["query", "SELECT count(*) FROM steps", "--warehouse", str(copy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("polytrace query: error: cannot open the warehouse's views: IO Error"), err
