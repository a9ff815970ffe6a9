"""The HTML report: sections, self-containment, cross-run page, empty sections, PNGs, CLI."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
from _ci import skip_or_fail
from _views_util import build_demo_warehouse

from analyses import report as R
from analyses.api import PolyTrace
from analyses.cli import main
from analyses.views import view_groups


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report") / "wh"
    build_demo_warehouse(root)
    return root


def test_all_runs_report_is_self_contained(wh: Path, tmp_path: Path) -> None:
    res = PolyTrace(wh).report(tmp_path / "r.html", png=False)
    text = res.path.read_text()
    # one section per view group, the comparison page (3 runs selected) and the fitted workloads
    assert [s.group for s in res.sections] == [*(g.name for g in view_groups()), "compare", "workload"]
    for g in [*(g.name for g in view_groups()), "compare", "workload"]:
        assert f"<section id='{g}'" in text
    # the synthetic warehouse feeds every group but the profiler traces' (it holds no Kineto trace;
    # tests/test_trace_views.py builds that section from a hand-computed trace) and the workloads' (it was
    # never fitted; tests/test_fit_summaries.py reports a fitted one)
    assert [s.group for s in res.sections if s.empty] == ["profiler_trace", "workload"]
    # plotly.js is inlined, nothing is fetched: no external script or stylesheet
    assert "Plotly" in text and len(text) > 3_000_000
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=", text)
    assert text.count("class='figure'") == res.n_figures == int(re.search(r'data-figures="(\d+)"', text).group(1))
    assert "quantile_disc" in text  # view definitions are in the page


def test_the_comparison_table_is_in_run_order_whatever_order_the_view_gives(wh: Path) -> None:
    # a view's rows have no order (the report materializes them without keeping one): the
    # headlines sort in their SQL, the comparison table sorts itself
    con = PolyTrace(wh).connect()
    runs = R.selected_runs(con, None)
    base = R.view_reader(con, runs)

    def reversed_rows(name: str):  # noqa: ANN202 - a polars frame
        df = base(name)
        return df.sort("run_id", descending=True) if name == "length_quantiles" else df

    assert base("length_quantiles").get_column("run_id").n_unique() >= 2
    ids = R.comparison_section(con, runs, reversed_rows).headline.get_column("run_id").to_list()
    assert ids == sorted(ids)


def test_single_run_has_no_comparison_and_says_what_is_missing(wh: Path, tmp_path: Path) -> None:
    res = PolyTrace(wh).report(tmp_path / "a.html", runs=["agent-b"], png=False)
    groups = {s.group: s for s in res.sections}
    assert "compare" not in groups
    # the run overview (training_health group) has a row for every run
    assert {g for g, s in groups.items() if not s.empty} == {"training_health", "tool_latency", "multiturn"}
    text = res.path.read_text()
    assert "No data in the selected runs: this view needs filter_batches" in text
    assert "agent-b" in text and "math-a" not in text.split("<nav>")[0]


def test_an_empty_comparison_says_which_data_it_needs(tmp_path: Path) -> None:
    """Runs of GPU telemetry alone (no steps, no samples): the comparison said "this view needs
    several runs" with several runs selected; it says which data it reads."""
    root = tmp_path / "wh"
    csv = (Path(__file__).parent / "fixtures" / "telemetry" / "interleaved_gpus_with_index.csv").read_text()
    for name in ("a", "b", "c"):
        d = tmp_path / name
        d.mkdir()
        (d / "nvidia_smi.csv").write_text(csv)
        PolyTrace(root).ingest(d)
    res = PolyTrace(root).report(tmp_path / "r.html", png=False)
    compare = {s.group: s for s in res.sections}["compare"]
    assert compare.empty and compare.needs == R.COMPARISON_NEEDS
    text = res.path.read_text()
    assert "this view needs several runs" not in text
    assert "this view needs per-step metrics (steps / training_health" in text


def test_progress_hears_a_step_per_section_and_one_for_the_pngs(wh: Path, tmp_path: Path) -> None:
    events: list[tuple[str, object]] = []
    runs = PolyTrace(wh).run_ids()[:2]
    PolyTrace(wh).report(tmp_path / "r.html", runs=runs, png=False,
                         progress=lambda kind, data: events.append((kind, data.get("runs", data.get("run_id")))))
    n = len(view_groups()) + 1  # the sections and the comparison of two runs; no PNGs asked
    assert events[0] == ("start", n) == ("start", R.report_steps(runs, png=False))
    assert [k for k, _ in events[1:]] == ["run_start", "run_done"] * n
    assert [r for k, r in events if k == "run_done"][-1] == "comparison"
    assert R.report_steps(runs[:1], png=True) == len(view_groups()) + 1


def test_each_section_is_handed_on_as_soon_as_it_is_built(wh: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    seen: list[tuple[str, bool]] = []
    res = PolyTrace(wh).report(out, png=False, on_section=lambda s: seen.append((s.group, out.exists())))
    # the fitted workloads (built before the views') first, then each view group, then the comparison;
    # every one before the HTML is written
    assert seen == [("workload", False), *((g.name, False) for g in view_groups()), ("compare", False)]
    assert {g for g, _ in seen} == {s.group for s in res.sections}


def test_unknown_run_is_refused(wh: Path, tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="nope"):
        PolyTrace(wh).report(tmp_path / "x.html", runs=["nope"], png=False)


def test_png_export_or_clear_note(tmp_path: Path) -> None:
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2]))
    done, note = R.write_pngs([R.FigureSpec("one", fig, True)], tmp_path / "png")
    if R.find_browser() is None:
        # the no-browser note is covered by test_png_note_without_browser; without Chromium this test has
        # nothing to check, so it must not pass silently under CI
        assert done == {} and "no Chrome/Chromium" in note
        skip_or_fail("no Chromium found: PNG export is untested (apt-get install -y chromium, or set BROWSER_PATH)")
    assert note is None and done["one"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_many_runs_export_pngs_of_cross_run_figures_only() -> None:
    fig = go.Figure(go.Bar(y=[1]))
    runs = [f"run-{i}" for i in range(R.PNG_MAX_RUNS + 1)]
    figs = [R.FigureSpec("lengths__cdf_response", fig, True), R.FigureSpec("lengths__cdf_prompt", fig),
            *(R.FigureSpec(f"lengths__drift__{r}", fig, True) for r in runs)]
    kept, skipped = R.png_specs(figs, runs)
    assert [f.key for f in kept] == ["lengths__cdf_response"] and skipped == len(runs)
    kept, skipped = R.png_specs(figs, runs[:R.PNG_MAX_RUNS])
    assert kept == [f for f in figs if f.key_figure] and skipped == 0  # few runs: every key figure
    assert R.png_specs(figs, runs, all_pngs=True) == (figs, 0)


def test_png_note_without_browser(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(R, "find_browser", lambda: None)
    done, note = R.write_pngs([R.FigureSpec("one", go.Figure(go.Bar(y=[1])), True)], tmp_path)
    assert done == {} and "the HTML report is complete without it" in note


def test_cli_report(wh: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    assert main(["report", "--warehouse", str(wh), "--out", str(out), "--runs", "math-a", "dapo-c", "--no-png"]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out.resolve()}" in printed and "no data for: Profiler traces (HTA analyses, per RL stage), Tool-call latency, Multi-turn structure" in printed
    assert "<section id='compare'" in out.read_text()
    assert main(["report", "--warehouse", str(wh), "--runs", "nope", "--no-png"]) == 2
    assert main(["report", "--warehouse", str(tmp_path / "missing")]) == 2


def test_figures_mark_tail_shifts_and_outliers() -> None:
    import polars as pl

    from analyses import figures as F

    cdf = pl.DataFrame({"run_id": ["r"] * 4, "task": ["math"] * 4, "kind": ["response"] * 4, "value": [1, 2, 3, 100],
                        "n": [1] * 4, "cdf": [0.25, 0.5, 0.75, 1.0], "ccdf": [0.75, 0.5, 0.25, 0.0],
                        "share_ge": [1.0, 0.75, 0.5, 0.25], "in_tail": [False, False, False, True]})
    q = pl.DataFrame({"run_id": ["r"], "task": ["math"], "kind": ["response"], "p99": [3], "p999": [100]})
    fig = F.length_cdf_figure(cdf, q)
    tail = [t for t in fig.data if t.name and t.name.endswith("tail (> p99)")]
    assert len(tail) == 1 and list(tail[0].x) == [100] and list(tail[0].y) == [0.25]  # the longest stays visible
    assert len(fig.layout.shapes) == 2  # p99 and p99.9 lines
    drift = pl.DataFrame({"run_id": ["r"] * 3, "step": [1, 2, 3], "p10": [1] * 3, "p50": [2, 2, 4], "p90": [3] * 3,
                          "p99": [4] * 3, "max": [5] * 3, "run_log_p50_slope_per_step": [0.3] * 3,
                          "shift_ratio": [None, None, 2.0], "is_shift": [False, False, True]})
    fig = F.length_drift_figure(drift, "r")
    assert [a.text for a in fig.layout.annotations] == ["shift ×2.00"]
    series = pl.DataFrame({"run_id": ["r"] * 3, "step": [1, 2, 3], "metric": ["step_time_s"] * 3,
                           "value": [1.0, 1.0, 9.0], "is_outlier": [False, False, True]})
    fig = F.step_series_figure(series, "step_time_s")
    assert [list(t.x) for t in fig.data if t.name == "r outliers"] == [[3]]
