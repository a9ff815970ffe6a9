"""A shared catalog connection (``connect(shared=True)``: the facade's own reads, Dagster's
assets) creates the views once per state of the warehouse: a cursor per caller, its TEMP tables
its own, made again when a run is ingested, and each cursor holds a reader lease while it lives."""

from __future__ import annotations

import gc
from pathlib import Path

from analyses import catalog
from analyses.ingest import ingest_run
from analyses.views import all_views
from analyses.warehouse import readers_active


def _log(tmp_path: Path, name: str, steps: int) -> Path:
    d = tmp_path / "logs" / name
    d.mkdir(parents=True)
    (d / "train.log").write_text("".join(f"step:{s} - timing_s/step:{s}.5\n" for s in range(1, steps + 1)))
    return d


def test_shared_cursors_reuse_the_views_until_a_run_is_ingested(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    ingest_run(_log(tmp_path, "a", 3), wh)
    a = catalog.connect(wh, all_views(), shared=True)
    a.execute("CREATE TEMP TABLE mine AS SELECT 1 AS x")
    b = catalog.connect(wh, all_views(), shared=True)
    held = catalog._SHARED[str(wh.resolve())][1]
    assert b.execute("SELECT count(*) FROM steps").fetchone() == (3,)
    assert b.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'mine'").fetchone() == (0,)  # a's own
    assert b.execute("SELECT count(DISTINCT run_id) FROM run_overview").fetchone() == (1,)
    ingest_run(_log(tmp_path, "b", 2), wh)
    c = catalog.connect(wh, all_views(), shared=True)
    assert catalog._SHARED[str(wh.resolve())][1] is not held  # new manifests: the views made again
    assert c.execute("SELECT count(*) FROM steps").fetchone() == (5,)
    assert a.execute("SELECT x FROM mine").fetchone() == (1,)  # a cursor of the replaced database still works
    assert readers_active(wh)
    for con in (a, b, c):
        con.close()
    del a, b, c, con
    gc.collect()
    assert not readers_active(wh)


def test_a_plain_connection_is_never_shared(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    ingest_run(_log(tmp_path, "a", 2), wh)
    mine = catalog.connect(wh, all_views())
    mine.execute("CREATE OR REPLACE VIEW steps AS SELECT 42 AS step")
    shared = catalog.connect(wh, all_views(), shared=True)
    assert shared.execute("SELECT count(*) FROM steps").fetchone() == (2,)
