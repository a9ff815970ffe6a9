"""The HTML report: sections, self-containment, cross-run page, empty sections, PNGs, CLI."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
from _views_util import build_demo_warehouse

from analyses import report as R
from analyses.cli import main
from analyses.views import VIEW_GROUPS


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report") / "wh"
    build_demo_warehouse(root)
    return root


def test_all_runs_report_is_self_contained(wh: Path, tmp_path: Path) -> None:
    res = R.build_report(wh, tmp_path / "r.html", png=False)
    text = res.path.read_text()
    # one section per view group plus the comparison page (3 runs selected)
    assert [s.group for s in res.sections] == [*VIEW_GROUPS, "compare"]
    for g in [*VIEW_GROUPS, "compare"]:
        assert f"<section id='{g}'" in text
    assert not any(s.empty for s in res.sections)  # the demo warehouse feeds every group
    # plotly.js is inlined, nothing is fetched: no external script or stylesheet
    assert "Plotly" in text and len(text) > 3_000_000
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=", text)
    assert text.count("class='figure'") == res.n_figures == int(re.search(r'data-figures="(\d+)"', text).group(1))
    assert "quantile_disc" in text  # view definitions are in the page


def test_single_run_has_no_comparison_and_says_what_is_missing(wh: Path, tmp_path: Path) -> None:
    res = R.build_report(wh, tmp_path / "a.html", runs=["agent-b"], png=False)
    groups = {s.group: s for s in res.sections}
    assert "compare" not in groups
    assert {g for g, s in groups.items() if not s.empty} == {"tool_latency", "multiturn"}
    text = res.path.read_text()
    assert "No data in the selected runs: this view needs filter_batches" in text
    assert "agent-b" in text and "math-a" not in text.split("<nav>")[0]


def test_unknown_run_is_refused(wh: Path, tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="nope"):
        R.build_report(wh, tmp_path / "x.html", runs=["nope"], png=False)


def test_png_export_or_clear_note(tmp_path: Path) -> None:
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2]))
    done, note = R.write_pngs([R.FigureSpec("one", fig, True)], tmp_path / "png")
    if R.find_browser() is None:
        assert done == {} and "no Chrome/Chromium" in note
    else:
        assert note is None and done["one"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_note_without_browser(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(R, "find_browser", lambda: None)
    done, note = R.write_pngs([R.FigureSpec("one", go.Figure(go.Bar(y=[1])), True)], tmp_path)
    assert done == {} and "the HTML report is complete without it" in note


def test_cli_report(wh: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", "--warehouse", str(wh), "--out", str(out), "--runs", "math-a", "dapo-c", "--no-png"]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out.resolve()}" in printed and "no data for: Tool-call latency, Multi-turn structure" in printed
    assert "<section id='compare'" in out.read_text()
    assert main(["report", "--warehouse", str(wh), "--runs", "nope", "--no-png"]) == 2
    assert main(["report", "--warehouse", str(tmp_path / "missing")]) == 2
