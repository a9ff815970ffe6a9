"""One in-memory DuckDB database per process (analyses.duckdb_instance): a small ingest opens one
database (the JSON decode's), attaches the catalog file to it, and leaves it as it found it; and
``polytrace ingest`` of one run refreshes the catalog file once (at the publish), not three times."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import duckdb
import pytest

from analyses import catalog, duckdb_instance
from analyses.catalog import CATALOG_NAME, STORAGE_VERSION, refresh_catalog
from analyses.cli import main
from analyses.ingest import ingest_run
from analyses.views import all_views


def _packed_run(tmp_path: Path, steps: int = 3) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for s in range(steps):
        rec = {"step": s, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 100, "output": [10, 20],
               "n_sampling": 2, "validate": False}
        (run / f"packed_lengths_step_{s}.jsonl").write_text(json.dumps(rec) + "\n")
    return run


@pytest.fixture
def fresh_instance(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """No shared database yet; every ``duckdb.connect`` of the test is recorded."""
    opened: list[tuple] = []
    real = duckdb.connect

    def connect(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        opened.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(duckdb_instance, "_db", [None])
    monkeypatch.setattr(duckdb, "connect", connect)
    return opened


def test_a_small_ingest_opens_one_database_and_writes_the_catalog_through_it(tmp_path: Path,
                                                                             fresh_instance: list[tuple]) -> None:
    wh = tmp_path / "wh"
    ingest_run(_packed_run(tmp_path), wh, catalog_views=True)
    assert fresh_instance == [()]  # the in-memory one; the catalog file was attached to it
    cat = wh / CATALOG_NAME
    assert cat.is_file() and not Path(f"{cat}.wal").exists()  # detached: checkpointed and closed
    con = duckdb_instance.cursor()
    try:
        assert [r[0] for r in con.sql("SELECT database_name FROM duckdb_databases() WHERE NOT internal").fetchall()] \
            == ["memory"]
        assert con.sql("SELECT current_setting('file_search_path')").fetchall() == [("",)]
    finally:
        con.close()
    # another client opens it as its own database and reads the run through the views
    other = duckdb.connect(str(cat), read_only=True)
    try:
        other.execute("SET file_search_path = $1", [str(wh)])
        assert other.sql("SELECT count(*) FROM samples").fetchall() == [(6,)]
        assert other.sql("SELECT count(*) FROM polytrace_catalog.derived_views").fetchall() == [(1,)]
    finally:
        other.close()


def test_the_catalog_file_keeps_its_storage_version(tmp_path: Path, fresh_instance: list[tuple]) -> None:
    wh = tmp_path / "wh"
    ingest_run(_packed_run(tmp_path, 1), wh)
    refresh_catalog(wh, all_views(), template=False)  # written whole through the attached file
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{wh / CATALOG_NAME}' AS c (READ_ONLY)")
        got = con.sql("SELECT tags['storage_version'] FROM duckdb_databases() WHERE database_name = 'c'").fetchall()
    finally:
        con.close()
    assert got == [(f"{STORAGE_VERSION}+",)]  # readable by DuckDB 1.0 and later, as opened on its own


def test_a_database_that_fails_is_replaced(fresh_instance: list[tuple]) -> None:
    con = duckdb_instance.cursor()
    con.close()
    duckdb_instance._db[0].close()  # as a fatal error leaves it: nothing answers
    duckdb_instance.after_failure()
    con = duckdb_instance.cursor()
    try:
        assert con.sql("SELECT 42").fetchall() == [(42,)]
    finally:
        con.close()
    assert len(fresh_instance) == 2


def test_a_cli_ingest_of_one_run_refreshes_the_catalog_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = catalog.refresh_catalog

    def counted(*args: object, **kwargs: object) -> Path:
        calls.append(len(args[1]) if len(args) > 1 else 0)  # how many derived views it was given
        return real(*args, **kwargs)

    monkeypatch.setattr(catalog, "refresh_catalog", counted)
    monkeypatch.setattr("analyses.ingest.refresh_catalog", counted)
    wh = tmp_path / "wh"
    assert main(["ingest", str(_packed_run(tmp_path)), "--warehouse", str(wh), "-q"]) == 0
    assert calls == [len(all_views())]
    assert (wh / CATALOG_NAME).is_file()


@pytest.fixture
def connect_threads(fresh_instance: list[tuple], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """As ``fresh_instance``, and the thread of every ``duckdb.connect`` of the test is recorded."""
    names: list[str] = []
    recorded = duckdb.connect

    def connect(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        names.append(threading.current_thread().name)
        return recorded(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", connect)
    return names


def test_polytrace_ingest_opens_the_database_early_on_a_thread_of_its_own(tmp_path: Path,
                                                                          connect_threads: list[str]) -> None:
    assert main(["ingest", str(_packed_run(tmp_path)), "--warehouse", str(tmp_path / "wh"), "-q"]) == 0
    assert connect_threads == ["duckdb-open"]  # not on the read-ahead thread after the imports, and once


def test_a_cursor_asked_for_while_the_early_open_runs_waits_for_that_database(monkeypatch: pytest.MonkeyPatch,
                                                                             connect_threads: list[str]) -> None:
    entered, release = threading.Event(), threading.Event()
    counted = duckdb.connect

    def slow(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        entered.set()
        release.wait(10)
        return counted(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", slow)
    opener = duckdb_instance.open_early()
    assert entered.wait(10)
    threading.Timer(0.05, release.set).start()
    con = duckdb_instance.cursor()  # waits for the open under way instead of opening a second database
    try:
        assert con.sql("SELECT 42").fetchall() == [(42,)]
    finally:
        con.close()
    opener.join(10)
    assert connect_threads == ["duckdb-open"]


def test_an_early_open_that_fails_raises_in_the_first_cursor_of_its_caller(monkeypatch: pytest.MonkeyPatch,
                                                                          connect_threads: list[str]) -> None:
    real = duckdb.connect

    def refused(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        connect_threads.append(threading.current_thread().name)
        raise duckdb.IOException("IO Error: cannot allocate the buffer pool")

    monkeypatch.setattr(duckdb, "connect", refused)
    uncaught: list[object] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    duckdb_instance.open_early().join(10)
    assert uncaught == []  # the thread ends quietly: no traceback of its own on stderr
    assert duckdb_instance._db == [None]
    with pytest.raises(duckdb.IOException, match="buffer pool"):
        duckdb_instance.cursor()  # raised here, in the caller, as without the early open
    assert connect_threads == ["duckdb-open", "MainThread"]
    monkeypatch.setattr(duckdb, "connect", real)  # the failure passed: the next cursor opens the database
    con = duckdb_instance.cursor()
    try:
        assert con.sql("SELECT 1").fetchall() == [(1,)]
    finally:
        con.close()
