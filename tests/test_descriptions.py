"""The table and column descriptions Dagster shows are in the DuckDB catalog (``COMMENT ON``) and in
every published Parquet file's key-value metadata (issue 27, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from analyses.api import PolyTrace
from analyses.metadata import column_schema
from analyses.schema import TABLES, table_description
from analyses.views import view
from analyses.warehouse import RunStaging, published_runs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("desc") / "wh"
    pt = PolyTrace(root)
    for run in ("verl-gsm8k-ppo-v0.1", "polytrace-search-multiturn"):
        pt.ingest(REPO / "sample_logs" / run)
    return root


def test_catalog_file_comments_every_table_column_and_view(wh: Path) -> None:
    con = duckdb.connect(str(wh / "polytrace.duckdb"), read_only=True)
    con.execute("SET file_search_path = $1", [str(wh)])
    views = dict(con.sql("SELECT view_name, comment FROM duckdb_views() WHERE NOT internal").fetchall())
    cols = {(t, c): d for t, c, d in con.sql("SELECT table_name, column_name, comment FROM duckdb_columns()").fetchall()}
    for name in TABLES:
        assert views[name] == table_description(name)
        for col, _type, doc in column_schema(name):  # what Dagster's column schema shows
            assert cols[name, col] == doc, (name, col)
    assert views["steps"].startswith("PolyTrace warehouse table steps: one row per run × training step; key (run_id, step)")
    assert cols["steps", "gen_time_s"].startswith("rollout (generation) seconds")
    assert views["length_quantiles"] == view("length_quantiles").doc
    # the comments change nothing a query returns
    assert con.sql("SELECT count(*) FROM steps").fetchall()[0][0] > 0


def test_query_sandbox_shows_them_and_a_plain_connection_skips_them(wh: Path) -> None:
    pt = PolyTrace(wh)
    ((_sql, df),) = pt.query("SELECT comment FROM duckdb_columns() WHERE table_name = 'samples' "
                             "AND column_name = 'response_tokens'")
    assert df.item().startswith("response length in tokens")
    con = pt.connect()  # every report, fit and asset opens one: ~0.5 ms a comment is left out there
    assert con.sql("SELECT count(comment) FROM duckdb_columns() WHERE table_name = 'samples'").fetchall()[0][0] == 0


def test_every_published_parquet_file_carries_its_table_s_descriptions(wh: Path) -> None:
    files = [(name, wh / f.path) for m in published_runs(wh).values() for name, segs in m.tables.items() for f in segs]
    assert len(files) == 2 * len(TABLES)
    for name, path in files:
        meta = {k.decode(): v.decode() for k, v in (pq.read_metadata(path).metadata or {}).items()}
        assert meta["polytrace.table"] == name and meta["polytrace.description"] == table_description(name)
        docs = json.loads(meta["polytrace.columns"])
        assert set(docs) <= set(TABLES[name].stored_columns) and "run_id" not in docs
    # as DuckDB reads it
    steps = next(p for n, p in files if n == "steps")
    kv = dict(duckdb.sql(f"SELECT decode(key), decode(value) FROM parquet_kv_metadata('{steps}')").fetchall())
    assert json.loads(kv["polytrace.columns"])["step_time_s"].startswith("wall seconds of the step")


def test_a_part_written_by_a_query_gets_the_metadata_at_commit(tmp_path: Path) -> None:
    # the step-metric dedupe stages a file DuckDB wrote: the commit describes it like any other
    root = tmp_path / "wh"
    st = RunStaging(root, "r")
    part = tmp_path / "q.parquet"
    duckdb.sql(f"COPY (SELECT 1::BIGINT AS step, 'a/b' AS metric, 1.0::DOUBLE AS value, 'a/b' AS raw_metric, "
               f"false AS is_validation, 'f' AS path, 1::BIGINT AS line_no) TO '{part}' (FORMAT parquet)")
    st.replace_with_file("step_metrics", part)
    st.commit()
    f = root / published_runs(root)["r"].tables["step_metrics"][0].path
    assert pq.read_metadata(f).metadata[b"polytrace.table"] == b"step_metrics"
