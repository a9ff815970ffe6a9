"""What `polytrace query` prints: results stream from DuckDB (a table keeps its first and last 100
rows, as Polars prints a whole frame), and values Polars cannot hold or print -- found by the
statement fuzzing, each a traceback before -- come out as DuckDB's text for them."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from _sandbox_util import demo_warehouse

from analyses.api import PolyTrace
from analyses.cli import main

ODD = ("SELECT INTERVAL 1 DAY AS i, [INTERVAL 2 HOUR] AS il, union_value(k := 1) AS u, MAP {1: 2} AS m, "
       "'\\xAA'::BLOB AS b, 'infinity'::TIMESTAMP AS inf, '294247-01-10'::DATE AS far, 1 AS a, 2 AS a")


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_warehouse(tmp_path_factory.mktemp("output"))


def _out(wh: Path, sql: str, fmt: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["query", sql, "--warehouse", str(wh), "--format", fmt]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


# 200 rows or fewer are all shown; past that the tail may span two of DuckDB's 65,536-row batches
@pytest.mark.parametrize("n", [150, 200, 201, 65_586, 100_000])
def test_a_long_table_shows_what_polars_shows_of_the_whole_frame(wh: Path, n: int, capsys) -> None:
    out = _out(wh, f"SELECT i, i * 2 AS j, 'r' || i AS s FROM range({n}) t(i)", "table", capsys)
    whole = pl.DataFrame({"i": range(n), "j": range(0, 2 * n, 2), "s": [f"r{i}" for i in range(n)]})
    with pl.Config(tbl_rows=200, tbl_cols=40, fmt_str_lengths=80, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        assert out == f"{whole}\n"
    assert f"│ {n - 1} " in out and ("│ 100 " in out) == (n <= 200)


# drawn from DuckDB's rows (analyses.cli.row_text), or handed to Polars where that drawing cannot
# be sure (wide or long text, line breaks, > 40 columns or 200 characters, floats, nested types)
TABLES_AS_POLARS = {
    "types": "SELECT 1::TINYINT a, 2::SMALLINT b, 3::UBIGINT c, 4::UTINYINT d, -7::BIGINT g, NULL::INTEGER n, "
             "true t, NULL::BOOLEAN nb, '' e, NULL::VARCHAR ns, ' sp ' sp, 'tab\there' tab",
    "latin": "SELECT 'héllo wörld' AS s, 'naïve' AS \"naïve\"",
    "wide chars": "SELECT '日本語' AS s",
    "line break": "SELECT 'l1\nl2' AS s",
    "long text": "SELECT repeat('a', 81) AS s, repeat('b', 80) AS t",
    "wide table": "SELECT " + ", ".join(f"repeat('x', 30) AS c{i}" for i in range(7)),
    "many columns": "SELECT " + ", ".join(f"{i} AS c{i}" for i in range(45)),
    "floats and nested": "SELECT 1.5 AS d, 0.1::DOUBLE AS f, 1e10::DOUBLE g, [1, 2] AS l, {'a': 1} AS st",
    "dates": "SELECT DATE '2024-01-02' AS d, TIMESTAMP '2020-01-01 01:02:03' AS t",
}


@pytest.mark.parametrize("case", list(TABLES_AS_POLARS))
def test_a_table_is_what_polars_prints(wh: Path, case: str, capsys) -> None:
    sql = TABLES_AS_POLARS[case]
    out = _out(wh, sql, "table", capsys)
    whole = duckdb.sql(sql.replace("DATE '2024-01-02'", "'2024-01-02'").replace(
        "TIMESTAMP '2020-01-01 01:02:03'", "'2020-01-01 01:02:03'")).pl()  # a table shows dates as DuckDB's text
    with pl.Config(tbl_rows=200, tbl_cols=40, fmt_str_lengths=80, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        assert out == f"{whole}\n"


def test_csv_quotes_as_polars_writes(wh: Path, capsys) -> None:
    sql = "SELECT 'x,y' AS \"a,b\", NULL::VARCHAR AS n, '' AS e, 'q\"q' AS q, 'l1\nl2' AS l, 'c\rr' AS r, ' s ' AS s"
    whole = duckdb.sql(sql).pl()
    assert _out(wh, sql, "csv", capsys) == whole.write_csv()


def test_csv_and_json_stream_every_row(wh: Path, capsys) -> None:
    n = 200_000  # three batches of 65,536 rows and a bit
    out = _out(wh, f"SELECT i FROM range({n}) t(i)", "csv", capsys).splitlines()
    assert out[0] == "i" and out[1:] == [str(i) for i in range(n)]
    rows = json.loads(_out(wh, f"SELECT i, 'x' AS s FROM range({n}) t(i)", "json", capsys))
    assert len(rows) == n and rows[-1] == {"i": n - 1, "s": "x"}
    assert _out(wh, "SELECT 1 AS x WHERE false", "csv", capsys) == "x\n"
    assert _out(wh, "SELECT 1 AS x WHERE false", "json", capsys) == "[]\n"


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_values_polars_cannot_hold_or_print_come_out_as_duckdbs_text(wh: Path, fmt: str, capsys) -> None:
    out = _out(wh, ODD, fmt, capsys)
    for text in ("1 day", "02:00:00", "infinity", "294247-01-10"):
        assert text in out, (fmt, out)
    if fmt == "json":
        (row,) = json.loads(out)
        assert row == {"i": "1 day", "il": ["02:00:00"], "u": {"k": 1}, "m": {"1": 2}, "b": "\\xAA",
                       "inf": "infinity", "far": "294247-01-10", "a": 1, "a_1": 2}
    if fmt == "csv":
        assert out.splitlines() == ["i,il,u,m,b,inf,far,a,a_1",
                                    '1 day,"[""02:00:00""]",1,"{""1"":2}",\\xAA,infinity,294247-01-10,1,2']


def test_the_python_api_keeps_real_types_and_shows_the_rest_as_text(wh: Path) -> None:
    ((_, df),) = PolyTrace(wh).query("SELECT 0.5 AS x, TIMESTAMP '2020-01-01' AS t, INTERVAL 1 DAY AS i")
    assert df.schema == pl.Schema({"x": pl.Decimal(2, 1), "t": pl.Datetime("us"), "i": pl.String})
    assert df.row(0)[2] == "1 day"


def test_update_extensions_is_refused_in_one_line(wh: Path, capsys) -> None:
    # its statement type is missing from DuckDB's Python enum: reading it raised ValueError
    assert main(["query", "UPDATE EXTENSIONS", "--warehouse", str(wh)]) == 2
    assert capsys.readouterr().err == ("polytrace query: error: read-only: UPDATE EXTENSIONS and other unnamed "
                                       "statements are not allowed (only queries)\n")
