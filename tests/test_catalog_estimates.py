"""The catalog's file lists give DuckDB's optimizer a row estimate near the truth.

DuckDB estimates a Parquet file list as its first file's rows times the number of files. Listed in
run-id order, a table's first file is often a run's empty part (a verl run has no ``samples``, a
PolyTrace run no ``step_metrics``): the estimate was 0, and joins built their hash tables on the
big side (at 51 M samples ``sample_lengths`` took 27 s and 20 GB instead of 3 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyses import catalog
from analyses.catalog import view_files
from analyses.cli import main
from analyses.schema import TABLES
from analyses.warehouse import TableFile, published_runs

REPO = Path(__file__).resolve().parents[1]


def test_empty_parts_are_left_out_and_the_part_nearest_the_mean_leads() -> None:
    parts = [TableFile(f"p{i}", rows, 100) for i, rows in enumerate([0, 10, 0, 1000, 30, 50])]
    # non-empty: 10, 1000, 30, 50; mean 272.5; nearest 50 (222.5 away), the others keep their order
    assert [f.path for f in view_files(parts)] == ["p5", "p1", "p3", "p4"]


def test_no_part_or_one_part() -> None:
    assert view_files([]) == []
    assert view_files([TableFile("a", 0, 1)]) == []
    assert view_files([TableFile("a", 0, 1), TableFile("b", 7, 1)]) == [TableFile("b", 7, 1)]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wh = tmp_path_factory.mktemp("estimates") / "wh"
    assert main(["ingest", "--root", str(REPO / "sample_logs"), "--warehouse", str(wh), "-q"]) == 0
    return wh


def _estimate(con, table: str) -> int:  # noqa: ANN001 - a DuckDB connection
    plan = json.loads(con.execute(f'EXPLAIN (FORMAT json) SELECT * FROM "{table}"').fetchall()[0][1])
    return int(plan[0]["extra_info"]["Estimated Cardinality"])


def test_a_table_whose_first_run_is_empty_is_estimated_near_its_rows(warehouse: Path) -> None:
    pub = published_runs(warehouse)
    first = sorted(pub)[0]
    # the quirk this covers: the first run in id order has no rows of the table
    assert pub[first].rows("step_metrics") == 0
    con = catalog.connect(warehouse)
    rows = con.sql("SELECT count(*) FROM step_metrics").fetchall()[0][0]
    assert rows > 0
    assert rows / 2 <= _estimate(con, "step_metrics") <= rows * 2


def test_a_table_whose_every_part_is_empty_is_typed_and_empty(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    run = REPO / "sample_logs" / "polytrace-math-dapo"
    assert main(["ingest", str(run), "--warehouse", str(wh), "-q"]) == 0
    (pub,) = published_runs(wh).values()
    assert pub.rows("step_metrics") == 0  # a part is published, and it is empty
    con = catalog.connect(wh)
    assert con.sql("SELECT count(*) FROM step_metrics").fetchall()[0][0] == 0
    assert [c for c, *_ in con.sql("DESCRIBE step_metrics").fetchall()] == list(TABLES["step_metrics"].columns)
    assert con.sql("SELECT count(*) FROM samples").fetchall()[0][0] == pub.rows("samples") > 0
