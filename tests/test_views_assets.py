"""The characterize assets: materialize them against a synthetic warehouse and read their metadata.

PNG rendering itself is covered by tests/test_report.py; here the PNG batch (``PngBatch``) is replaced by a stub
(Chromium start-up would triple the test's time) that "renders" the lengths figures and reports
a missing browser for the others of its one batch, so both metadata branches are checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _views_util import build_demo_warehouse
from dagster import AssetKey, materialize

from analyses.api import REPORT_NAME, PolyTrace
from analyses.views import view_groups
from pipelines.assets import characterize as C
from pipelines.resources import WarehouseResource


class _StubPngBatch:
    """One batch for every group's key figures: the lengths figures "render", the others do not."""

    def __init__(self, width: int = 1100) -> None:
        self.specs: list = []

    def submit(self, specs) -> None:  # noqa: ANN001
        self.specs += specs

    def write(self, out_dir: Path):  # noqa: ANN202
        done = {s.key: out_dir / f"{s.key}.png" for s in self.specs if s.key.startswith("lengths__")}
        out_dir.mkdir(parents=True, exist_ok=True)
        for p in done.values():
            p.write_bytes(b"\x89PNG stub")
        return done, None if len(done) == len(self.specs) else "PNG export skipped: no Chrome/Chromium found"


@pytest.fixture
def stub_pngs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "PngBatch", _StubPngBatch)
    monkeypatch.setattr(C, "start_png_browser", lambda: None)


def test_characterize_assets_metadata(tmp_path: Path, stub_pngs: None) -> None:
    root = tmp_path / "wh"
    build_demo_warehouse(root)
    res = materialize(
        [C.characterize],
        resources={"warehouse": WarehouseResource(root=str(root), logs_root=str(tmp_path))},
    )
    assert res.success
    mats = {e.asset_key: e.materialization.metadata for e in res.get_asset_materialization_events()}
    assert set(mats) == {AssetKey(f"{g.name}_view") for g in view_groups()} | {AssetKey("characterization_report")}
    lengths = mats[AssetKey("lengths_view")]
    # the headline table is markdown with one row per run x task x kind: 2 sample-bearing runs x 2 kinds
    md = lengths["headline"].value
    assert md.startswith("| run_id | task | kind |") and md.count("\n| math-a |") == 2 and md.count("\n| dapo-c |") == 2
    assert lengths["headline_rows"].value == 4
    assert "`length_quantiles`" in lengths["views"].value
    assert lengths["report_section"].value.endswith("reports/polytrace_report.html#lengths")
    # key figures of the lengths group: the response CDF and one drift figure per sample-bearing run
    # inline as data URIs, which the UI shows (it would block file:// links); the files beside
    assert lengths["figures"].value.count("](data:image/png;base64,") == 3
    assert "**lengths__cdf_response**" in lengths["figures"].value and lengths["figure_files"].value.count(".png") == 3
    tools = mats[AssetKey("tool_latency_view")]
    assert "figures" not in tools and "no Chrome/Chromium" in tools["figure_note"].value
    assert "| agent-b | search |" in tools["headline"].value
    report = mats[AssetKey("characterization_report")]
    report_path = PolyTrace(root).layout.reports / REPORT_NAME
    assert Path(report["path"].value) == report_path and report_path.stat().st_size > 3_000_000
    assert report["empty_sections"].value == "Profiler traces (HTA analyses, per RL stage), Workload" and report["figures"].value >= 15
    # the report asset's metadata opens with the health alerts (none in the demo runs: 6 steps make no alert)
    assert next(iter(report)) == "health_alerts" and report["health_alerts"].value == "_No health alert in any run._"
    overview = mats[AssetKey("training_health_view")]["headline"].value
    assert overview.startswith("| run_id | model | gpus_used |") and "| math-a |" in overview


def test_empty_warehouse_says_what_is_needed(tmp_path: Path, stub_pngs: None) -> None:
    res = materialize(
        [C.characterize],
        selection=[AssetKey("filter_waste_view")],  # one group alone: only its section is computed
        resources={"warehouse": WarehouseResource(root=str(tmp_path / "empty"), logs_root=str(tmp_path))},
    )
    (ev,) = res.get_asset_materialization_events()
    assert ev.materialization.metadata["headline"].value == "_No data in any run: needs filter_batches (DAPO filter logs)._"
