"""The query connection starts from a private copy of the catalog file when that file is current:
its derived views are this code's (the stamp), and it holds nothing else. The base tables are
always created from the manifests read under the connection's reader lease, with absolute
paths, so the copy changes neither what a query sees nor what it can read; any doubt about the
file and the connection creates every view in memory as before."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import duckdb
import pytest
from _sandbox_util import demo_warehouse

from analyses import catalog
from analyses.api import PolyTrace
from analyses.cli import main
from analyses.views import all_views

# what a query can learn about the catalog itself, and a derived view over a base table
DESCRIBED = [
    "SELECT current_database(), schema_name, view_name, comment FROM duckdb_views() WHERE NOT internal ORDER BY ALL",
    "SELECT table_name, column_name, data_type, comment FROM duckdb_columns() ORDER BY ALL",
    "SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL",
    "SELECT * FROM steps ORDER BY ALL",
    "SELECT * FROM step_variance ORDER BY ALL",
]


@pytest.fixture()
def wh(tmp_path: Path) -> Path:
    return demo_warehouse(tmp_path)


def _open(wh: Path, into: Path) -> tuple[duckdb.DuckDBPyConnection, bool]:
    """The sandboxed query connection given a snapshot directory, and whether it used the snapshot."""
    into.mkdir(exist_ok=True)
    con = catalog.connect(wh, all_views(), sandbox=True, spill=into, snapshot=into)
    return con, (into / catalog.SNAPSHOT_NAME).exists()


def _described(con: duckdb.DuckDBPyConnection) -> list[list[tuple]]:
    return [con.sql(q).fetchall() for q in DESCRIBED]


def test_a_current_catalog_file_gives_the_connection_the_in_memory_one_would(wh: Path, tmp_path: Path) -> None:
    snap, used = _open(wh, tmp_path / "snap")
    assert used
    memory = catalog.connect(wh, all_views(), sandbox=True, spill=tmp_path / "mem")
    assert _described(snap) == _described(memory)
    assert len(_described(snap)[0]) == len(all_views()) + len(catalog.TABLES)


def test_a_catalog_file_written_with_other_views_is_not_used(wh: Path, tmp_path: Path) -> None:
    # as an older PolyTrace wrote it: the last view (none reads it) with other SQL
    *rest, last = all_views()
    catalog.refresh_catalog(wh, [*rest, dataclasses.replace(last, sql="SELECT 42 AS stale")])
    con, used = _open(wh, tmp_path / "snap")
    assert not used
    assert "stale" not in con.sql(f'SELECT * FROM "{last.name}"').columns


def test_a_catalog_file_without_a_stamp_is_not_used(wh: Path, tmp_path: Path) -> None:
    with duckdb.connect(str(catalog.catalog_path(wh))) as f:
        f.execute(f"DROP SCHEMA {catalog.STAMP_SCHEMA} CASCADE")
    assert not _open(wh, tmp_path / "snap")[1]


def test_views_a_users_own_client_added_to_the_catalog_file_are_not_shown(wh: Path, tmp_path: Path) -> None:
    with duckdb.connect(str(catalog.catalog_path(wh))) as f:
        f.execute("CREATE VIEW mine AS SELECT 1 AS x")
    con, used = _open(wh, tmp_path / "snap")
    assert not used
    assert con.sql("SELECT count(*) FROM duckdb_views() WHERE view_name = 'mine'").fetchall() == [(0,)]


def test_a_run_published_after_the_catalog_file_was_written_is_seen(wh: Path, tmp_path: Path) -> None:
    # the window between an ingest's publish and its rewrite of the catalog file: the file names
    # only the first run's files, the manifests both runs'
    before = tmp_path / "catalog-before.duckdb"
    shutil.copyfile(catalog.catalog_path(wh), before)
    run = tmp_path / "logs" / "second"
    run.mkdir(parents=True)
    (run / "train.log").write_text("".join(f"step:{s} - timing_s/step:{s}.5\n" for s in range(5)))
    PolyTrace(wh).ingest(run, run_id="second")
    shutil.copyfile(before, catalog.catalog_path(wh))
    con, used = _open(wh, tmp_path / "snap")
    assert used
    assert con.sql("SELECT run_id, count(*) FROM steps GROUP BY ALL ORDER BY ALL").fetchall() == [("demo", 3),
                                                                                                  ("second", 5)]


def test_files_in_the_working_directory_never_stand_in_for_the_warehouses(wh: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # the catalog file names its files relative to the warehouse, and DuckDB looks for a relative
    # path in the working directory first: a copy of the warehouse there with other rows
    cwd = tmp_path / "elsewhere"
    for published in (wh / "parquet" / "steps").rglob("*.parquet"):
        fake = cwd / published.relative_to(wh)
        fake.parent.mkdir(parents=True, exist_ok=True)
        duckdb.sql(f"COPY (SELECT * FROM '{published}' LIMIT 1) TO '{fake}' (FORMAT parquet)")
    monkeypatch.chdir(cwd)
    con, used = _open(wh, tmp_path / "snap")
    assert used
    assert con.sql("SELECT count(*) FROM steps").fetchall() == [(3,)]
    fake_rel = str(fake.relative_to(cwd))
    with pytest.raises(duckdb.PermissionException):
        con.sql(f"SELECT * FROM read_parquet('{fake_rel}')").fetchall()


def test_while_an_ingest_rewrites_the_catalog_file_the_query_does_not_wait_for_it(wh: Path, tmp_path: Path) -> None:
    with catalog._file_lock(wh / ".catalog.lock"):
        con, used = _open(wh, tmp_path / "snap")
    assert not used
    assert con.sql("SELECT count(*) FROM step_variance").fetchall()[0][0] > 0


def test_a_users_read_write_session_on_the_catalog_file_does_not_stop_a_query(wh: Path, capsys) -> None:
    with duckdb.connect(str(catalog.catalog_path(wh))) as f:
        f.execute("CREATE VIEW mine AS SELECT 1 AS x")  # committed, in its log, not yet in the file
        assert main(["query", "SELECT count(*) AS n FROM steps", "--format", "csv", "--warehouse", str(wh)]) == 0
    assert capsys.readouterr().out == "n\n3\n"
