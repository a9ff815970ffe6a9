"""`polytrace runs` counts every table once, grouped by run: the same counts as one ``count(*)``
per run and table, 0 for a table without rows of that run."""

from __future__ import annotations

from pathlib import Path

from _sandbox_util import demo_warehouse

from analyses import catalog
from analyses.api import RUN_COUNTS, PolyTrace

REPO = Path(__file__).resolve().parents[1]


def test_runs_counts_are_one_count_per_run_and_table(tmp_path: Path) -> None:
    wh = demo_warehouse(tmp_path)  # run demo: 3 steps, nothing else
    PolyTrace(wh).ingest(REPO / "sample_logs" / "polytrace-search-multiturn", run_id="multiturn")
    rows = PolyTrace(wh).run_rows()
    con = catalog.connect(wh)
    for r in rows:
        for t in RUN_COUNTS:
            assert r[t] == con.execute(f"SELECT count(*) FROM {t} WHERE run_id = $1", [r["run_id"]]).fetchall()[0][0]
        assert (r["files"], r["file_errors"]) == con.execute(
            "SELECT count(*), count(*) FILTER (WHERE status NOT IN ('ok', 'partial')) FROM source_files WHERE run_id = $1",
            [r["run_id"]]).fetchall()[0]
    assert [(r["run_id"], r["steps"], r["tool_calls"]) for r in rows][0] == ("demo", 3, 0)
    assert rows[1]["tool_calls"] > 0 and rows[1]["samples"] > 0
