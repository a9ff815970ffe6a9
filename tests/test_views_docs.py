"""docs/views.md documents every view, and every example query in it runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _views_util import build_demo_warehouse

from analyses.catalog import connect, registered_views
from analyses.views import VIEW_GROUPS, view_doc

DOC = Path(__file__).resolve().parents[1] / "docs" / "views.md"
ROW = re.compile(r"^\| `(\w+)` \| .+ \| `(SELECT .+)` \|$", re.M)


def test_every_view_is_documented_and_grouped() -> None:
    documented = {m.group(1) for m in ROW.finditer(DOC.read_text())}
    grouped = {v for vs in VIEW_GROUPS.values() for v in vs}
    assert documented == grouped and grouped <= set(registered_views())
    assert all(view_doc(v) for v in grouped)  # a definition string for each


def test_example_queries_run(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    build_demo_warehouse(root)
    con = connect(root)
    examples = [(m.group(1), m.group(2).replace("\\|", "|")) for m in ROW.finditer(DOC.read_text())]
    assert len(examples) == sum(len(vs) for vs in VIEW_GROUPS.values())
    for name, sql in examples:
        assert name in sql
        try:
            con.sql(sql).fetchall()
        except Exception as exc:  # pragma: no cover - the message names the broken example
            pytest.fail(f"example for {name} fails: {exc}")
