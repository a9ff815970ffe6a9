"""Every DuckDB connection that reads the warehouse has bounded memory and spill space, spilling
inside the warehouse's scratch area; ``polytrace query`` stops a query past its memory, spill or
time limit with one line and exit 2 (issue 25: an unbounded ``string_agg`` grew past 5 GiB)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
from _sandbox_util import demo_warehouse

from analyses import catalog, duckdb_limits
from analyses.api import PolyTrace
from analyses.cli import main
from analyses.duckdb_limits import MEMORY_CAP, default_memory_limit, parse_size, total_memory

# 3 steps x 3 M rows, each run id and number joined into one string: ~80 MB of aggregate state
STRING_AGG = "SELECT length(string_agg(s.run_id || i::VARCHAR, ',')) FROM steps s, range(3000000) t(i)"
LIST_AGG = "SELECT len(list(s.step + i)) FROM steps s, range(5000000) t(i)"
FOREVER = "SELECT sum(hash(i)) FROM range(100000000000) t(i)"
_UNITS = {"bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_warehouse(tmp_path_factory.mktemp("limits"))


def _bytes(reported: str) -> float:
    """DuckDB's ``3.7 GiB`` as bytes."""
    value, unit = reported.split()
    return float(value) * _UNITS[unit]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _setting(wh: Path, name: str, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["query", f"SELECT current_setting('{name}') AS v", "--warehouse", str(wh), "--format", "csv",
                 *args]) == 0
    return capsys.readouterr().out.splitlines()[1]


def test_each_connection_spills_to_its_own_directory_in_the_scratch_area(wh: Path, capsys) -> None:
    spill = Path(_setting(wh, "temp_directory", capsys))
    assert spill.parent == wh / ".scratch" and spill.name.startswith(f"{socket.gethostname()}-{os.getpid()}-")
    con = PolyTrace(wh).connect()
    other = Path(con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0])
    con.close()
    assert other.parent == wh / ".scratch" and other != spill


def test_the_default_memory_limit_is_the_lesser_of_3_gb_and_a_quarter_of_ram(wh: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv(duckdb_limits.ENV_MEMORY, raising=False)
    expected = min(MEMORY_CAP, total_memory() // 4)
    assert default_memory_limit() == expected
    reported = _setting(wh, "memory_limit", capsys)
    assert 0 <= expected - _bytes(reported) < 0.1 * 1024**3, reported  # DuckDB prints one decimal, truncated (2.79 GiB: "2.7 GiB")
    # the views and the report read through catalog.connect: the same bound
    con = PolyTrace(wh).connect()
    assert con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0] == reported
    con.close()


def test_a_quarter_of_ram_wins_on_a_small_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duckdb_limits, "total_memory", lambda: 8 * 1024**3)
    assert default_memory_limit() == 2 * 1024**3  # a quarter of 8 GiB is below 3 GB
    monkeypatch.setattr(duckdb_limits, "total_memory", lambda: 64 * 1024**3)
    assert default_memory_limit() == 3 * 1000**3


def test_the_limit_is_settable_by_option_and_environment(wh: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(duckdb_limits.ENV_MEMORY, "1GB")
    assert _setting(wh, "memory_limit", capsys) == "953.6 MiB"
    assert _setting(wh, "memory_limit", capsys, "--memory-limit", "512MiB") == "512.0 MiB"  # the option wins
    assert _setting(wh, "max_temp_directory_size", capsys, "--temp-limit", "2GiB") == "2.0 GiB"
    monkeypatch.setenv(duckdb_limits.ENV_TEMP, "3GiB")
    assert PolyTrace(wh).connect().sql("SELECT current_setting('max_temp_directory_size')").fetchall() == [("3.0 GiB",)]


def test_sizes_are_parsed_as_duckdb_writes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duckdb_limits, "total_memory", lambda: 16 * 1024**3)
    assert parse_size("2GB", "x") == 2 * 1000**3
    assert parse_size(" 1.5 GiB ", "x") == int(1.5 * 1024**3)
    assert parse_size("123456", "x") == 123456
    assert parse_size("25%", "x") == 4 * 1024**3
    for bad in ("lots", "2 apples", "-1GB", "0"):
        with pytest.raises(ValueError, match="x: "):
            parse_size(bad, "x")


@pytest.mark.parametrize("argv, message", [
    (["--memory-limit", "lots"], "--memory-limit: 'lots' is not a size"),
    (["--temp-limit", "0"], "--temp-limit: '0' must be more than 0 bytes"),
    (["--timeout", "-1"], "--timeout must be 0 (no limit) or more seconds"),
])
def test_bad_limits_are_one_line(wh: Path, argv: list[str], message: str, capsys) -> None:
    assert message in _fails(["query", "SELECT 1", "--warehouse", str(wh), *argv], capsys)


def test_a_bad_limit_in_the_environment_is_one_line(wh: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(duckdb_limits.ENV_MEMORY, "big")
    assert "POLYTRACE_MEMORY_LIMIT: 'big' is not a size" in _fails(["query", "SELECT 1", "--warehouse", str(wh)], capsys)
    monkeypatch.delenv(duckdb_limits.ENV_MEMORY)
    monkeypatch.setenv("POLYTRACE_QUERY_TIMEOUT", "soon")
    assert "'soon' is not a number of seconds" in _fails(["query", "SELECT 1", "--warehouse", str(wh)], capsys)


@pytest.mark.parametrize("sql", [STRING_AGG, LIST_AGG])
def test_a_memory_hungry_aggregate_stops_at_the_limit_with_one_line(wh: Path, sql: str, capsys) -> None:
    line = _fails(["query", sql, "--warehouse", str(wh), "--memory-limit", "48MB"], capsys)
    assert line.startswith("polytrace query: error: the query needs more memory than its 45.8 MiB limit "
                           "(--memory-limit SIZE or $POLYTRACE_MEMORY_LIMIT): Out of Memory Error"), line
    # the same aggregate fits a larger limit: it is the limit that stopped it
    assert main(["query", sql, "--warehouse", str(wh), "--memory-limit", "2GB", "--format", "csv"]) == 0


def test_a_sort_past_the_memory_limit_spills_into_the_scratch_area_and_stops_at_the_spill_limit(wh: Path,
                                                                                                 capsys) -> None:
    # 2 M md5 strings (64 MB) sorted under a 60 MB limit: DuckDB spills about 100 MB
    sort = ("SELECT sum(length(h)) AS n FROM (SELECT h FROM (SELECT md5(i::VARCHAR) AS h FROM range(2000000) t(i)) "
            "ORDER BY h OFFSET 10)")
    assert main(["query", sort, "--warehouse", str(wh), "--memory-limit", "60MB", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", str((2000000 - 10) * 32)]
    # the same with no room to spill
    line = _fails(["query", sort, "--warehouse", str(wh), "--memory-limit", "60MB", "--temp-limit", "1MB"], capsys)
    assert "the query needs more than its 976.6 KiB of spill space (--temp-limit SIZE or $POLYTRACE_TEMP_LIMIT)" in line
    assert not any((wh / ".scratch").iterdir())  # every query's spill directory is removed


def test_a_long_query_is_stopped_at_the_timeout_with_one_line(wh: Path, capsys) -> None:
    t0 = time.monotonic()
    line = _fails(["query", f"SELECT 1; {FOREVER}", "--warehouse", str(wh), "--timeout", "0.5"], capsys)
    assert line == ("polytrace query: error: the query ran longer than 0.5 s and was stopped "
                    "(--timeout SECONDS, 0 for no limit)")
    assert time.monotonic() - t0 < 30


def test_a_long_result_is_stopped_between_batches_too(wh: Path, capsys) -> None:
    # rows keep coming: the interrupt lands while the result streams, not in the first batch
    sql = "SELECT i FROM range(100000000000) t(i) WHERE hash(i) % 50 = 0"
    line = _fails(["query", sql, "--warehouse", str(wh), "--timeout", "1", "--format", "csv"], capsys)
    assert "ran longer than 1 s" in line


def test_the_default_timeout_and_no_timeout(monkeypatch, wh: Path, capsys) -> None:
    from analyses.cli import query

    monkeypatch.setattr(query, "DEFAULT_TIMEOUT_S", 0.3)
    assert "ran longer than 0.3 s" in _fails(["query", FOREVER, "--warehouse", str(wh)], capsys)
    assert main(["query", "SELECT count(*) FROM range(30000000)", "--warehouse", str(wh), "--timeout", "0"]) == 0


def test_stale_spill_directories_of_dead_processes_are_removed(wh: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = wh / ".scratch" / f"{socket.gethostname()}-{dead.pid}-0123abcd"
    stale.mkdir(parents=True)
    (stale / "duckdb_temp_block-1.block").write_bytes(b"x" * 100)
    alive = wh / ".scratch" / f"{socket.gethostname()}-{os.getpid()}-feedbeef"
    alive.mkdir()
    try:
        catalog.connect(wh).close()
        assert not stale.exists()
        assert alive.exists()  # a live process's directory stays
    finally:
        alive.rmdir()


def test_the_catalog_file_for_other_clients_is_unaffected(wh: Path, capsys) -> None:
    path = PolyTrace(wh).catalog_path
    before = path.read_bytes()
    assert main(["query", STRING_AGG, "--warehouse", str(wh), "--memory-limit", "48MB"]) == 2
    capsys.readouterr()
    assert path.read_bytes() == before
    con = duckdb.connect(str(path), read_only=True)  # an outside client: DuckDB's defaults, the views work
    try:
        con.execute("SET file_search_path = ?", [str(wh)])
        limit = con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
        assert _bytes(limit) > 0.5 * total_memory()
        assert con.sql("SELECT count(*) FROM steps").fetchall() == [(3,)]
    finally:
        con.close()


def test_limits_are_locked_in_the_sandbox(wh: Path, capsys) -> None:
    # lock_configuration comes after the limits: a query cannot raise them
    line = _fails(["query", "SELECT 1; SET memory_limit = '100GB'", "--warehouse", str(wh)], capsys)
    assert "SET statements are not allowed" in line
    con = catalog.connect(wh, sandbox=True)
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET memory_limit = '100GB'")
    assert re.fullmatch(r"[\d.]+ \w+", con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0])
    con.close()
