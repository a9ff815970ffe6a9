"""docs/views.md documents every view, and every example query in it runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _views_util import build_demo_warehouse

from analyses.api import PolyTrace
from analyses.views import all_views

DOC = Path(__file__).resolve().parents[1] / "docs" / "views.md"
ROW = re.compile(r"^\| `(\w+)` \| .+ \| `(SELECT .+)` \|$", re.M)


def test_every_view_is_documented_and_grouped() -> None:
    documented = {m.group(1) for m in ROW.finditer(DOC.read_text())}
    declared = {v.name for v in all_views()}
    assert documented == declared
    assert all(v.doc for v in all_views())  # a definition string for each


def test_example_queries_run(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    build_demo_warehouse(root)
    con = PolyTrace(root).connect()
    examples = [(m.group(1), m.group(2).replace("\\|", "|")) for m in ROW.finditer(DOC.read_text())]
    assert len(examples) == len(all_views())
    for name, sql in examples:
        assert name in sql
        try:
            con.sql(sql).fetchall()
        except Exception as exc:  # pragma: no cover - the message names the broken example
            pytest.fail(f"example for {name} fails: {exc}")
