"""refresh_catalog writes only the views whose DDL or comments changed since it last wrote the
same catalog file, and everything again when anyone else wrote the file since."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from analyses.catalog import CATALOG_STATE, ENV_TEMPLATES, catalog_path, refresh_catalog
from analyses.ingest import ingest_run
from analyses.views import all_views

STEP_LINE = "step:{s} - actor/entropy:{e} - response_length/mean:{r}\n"


def _log(tmp_path: Path, name: str, steps: int) -> Path:
    d = tmp_path / "logs" / name
    d.mkdir(parents=True)
    (d / "train.log").write_text("".join(STEP_LINE.format(s=s, e=0.5, r=100 + s) for s in range(1, steps + 1)))
    return d


def _views(wh: Path) -> dict[str, tuple[str | None, int]]:
    """Each view's comment and how many of its columns have one."""
    con = duckdb.connect(str(catalog_path(wh)), read_only=True)
    try:
        rows = con.sql("SELECT v.view_name, v.comment, count(c.comment) FROM duckdb_views() v LEFT JOIN "
                       "duckdb_columns() c ON c.table_name = v.view_name WHERE NOT v.internal "
                       "GROUP BY ALL").fetchall()
    finally:
        con.close()
    return {name: (comment, cols) for name, comment, cols in rows}


def _count(wh: Path, sql: str) -> int:
    con = duckdb.connect(str(catalog_path(wh)), read_only=True)
    try:
        con.execute("SET file_search_path = $1", [str(wh)])
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def test_an_unchanged_catalog_is_not_written_and_a_new_run_rewrites_only_its_tables(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    ingest_run(_log(tmp_path, "a", 3), wh)
    refresh_catalog(wh, all_views())
    full = _views(wh)
    assert full["steps"][0] and full["steps"][1] > 0 and full["length_quantiles"][0]
    before = catalog_path(wh).stat().st_mtime_ns
    refresh_catalog(wh, all_views())
    assert catalog_path(wh).stat().st_mtime_ns == before  # nothing changed: the file is not even opened
    ingest_run(_log(tmp_path, "b", 2), wh)  # new files in some base views: those are re-created, comments too
    assert _views(wh) == full
    assert _count(wh, "SELECT count(*) FROM steps") == 5
    assert _count(wh, "SELECT count(DISTINCT run_id) FROM run_overview") == 2  # derived views read both runs


def test_a_catalog_someone_else_wrote_is_rewritten_whole(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    ingest_run(_log(tmp_path, "a", 3), wh)
    refresh_catalog(wh, all_views())
    full = _views(wh)
    con = duckdb.connect(str(catalog_path(wh)))
    con.execute('DROP VIEW "length_quantiles"')
    con.execute('COMMENT ON VIEW "steps" IS NULL')
    con.close()
    refresh_catalog(wh, all_views())
    assert _views(wh) == full
    # a lost or unreadable state file: everything is written again too
    (wh / CATALOG_STATE).write_text("{not json")
    con = duckdb.connect(str(catalog_path(wh)))
    con.execute('DROP VIEW "steps"')
    con.close()
    (wh / CATALOG_STATE).write_text("{not json")
    refresh_catalog(wh)
    assert _views(wh) == full


def _view_sql(wh: Path) -> dict[str, str]:
    """Each view's SQL, the version in its files' names left out (each warehouse has its own)."""
    con = duckdb.connect(str(catalog_path(wh)), read_only=True)
    try:
        return {name: re.sub(r"/[^/']+\.parquet", "/V.parquet", sql) for name, sql in
                con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()}
    finally:
        con.close()


def test_a_new_catalog_from_the_cached_template_equals_one_written_whole(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_TEMPLATES, str(tmp_path / "cache"))
    run = _log(tmp_path, "a", 3)
    whole = tmp_path / "whole"
    ingest_run(run, whole)
    (whole / CATALOG_STATE).unlink()
    catalog_path(whole).unlink()
    refresh_catalog(whole, all_views(), template=False)
    for wh in (tmp_path / "first", tmp_path / "second"):  # the first builds the template, the second copies it
        ingest_run(run, wh, catalog_views=True)
        assert _views(wh) == _views(whole)
        assert _view_sql(wh) == _view_sql(whole)
        assert _count(wh, "SELECT count(*) FROM run_overview") == 1
    assert len(list((tmp_path / "cache").glob("catalog-*.duckdb"))) == 1


def test_views_whose_sql_ends_in_a_line_comment_are_written_as_one_script(tmp_path: Path) -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class _View:
        name: str
        sql: str
        doc: str = "a view"

    wh = tmp_path / "wh"
    ingest_run(_log(tmp_path, "a", 3), wh)
    refresh_catalog(wh, [_View("first_steps", "SELECT step FROM steps WHERE step < 3 -- the first two"),
                         _View("step_count", "SELECT count(*) AS n FROM steps -- every step")])
    assert _count(wh, "SELECT count(*) FROM first_steps") == 2 and _count(wh, "SELECT n FROM step_count") == 3
