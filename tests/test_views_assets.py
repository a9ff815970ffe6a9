"""The characterize assets: materialize them against a synthetic warehouse and read their metadata."""

from __future__ import annotations

from pathlib import Path

from _views_util import build_demo_warehouse
from dagster import AssetKey, materialize

from analyses.report import find_browser
from analyses.views import VIEW_GROUPS
from pipelines.assets.characterize import GROUP_ASSETS, characterization_report, report_path
from pipelines.resources import WarehouseResource


def test_characterize_assets_metadata(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    build_demo_warehouse(root)
    res = materialize(
        [*GROUP_ASSETS, characterization_report],
        resources={"warehouse": WarehouseResource(root=str(root), logs_root=str(tmp_path))},
    )
    assert res.success
    mats = {e.asset_key: e.materialization.metadata for e in res.get_asset_materialization_events()}
    assert set(mats) == {AssetKey(f"{g}_view") for g in VIEW_GROUPS} | {AssetKey("characterization_report")}
    lengths = mats[AssetKey("lengths_view")]
    # the headline table is markdown with one row per run x task x kind: 2 sample-bearing runs x 2 kinds
    md = lengths["headline"].value
    assert md.startswith("| run_id | task | kind |") and md.count("\n| math-a |") == 2 and md.count("\n| dapo-c |") == 2
    assert lengths["headline_rows"].value == 4
    assert "`length_quantiles`" in lengths["views"].value
    assert lengths["report_section"].value.endswith("polytrace_report.html#lengths")
    if find_browser() is not None:
        assert Path(lengths["figure"].value).read_bytes()[:4] == b"\x89PNG"
    else:
        assert "no Chrome/Chromium" in lengths["figure_note"].value
    report = mats[AssetKey("characterization_report")]
    assert Path(report["path"].value) == report_path(root) and report_path(root).stat().st_size > 3_000_000
    assert report["empty_sections"].value == "(none)" and report["figures"].value >= 15
