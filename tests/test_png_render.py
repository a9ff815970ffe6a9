"""analyses.png_render: PNGs of plotly figures drawn in one kept headless Chromium.

The renderer's pixels were checked against kaleido's (pixel-identical on the demo's 22 key
figures; see the commit). Here: sizes, determinism, a failing figure alone, tab reloads, calls
from several threads, plotly's renderer interface, and a browser that cannot start."""

from __future__ import annotations

import base64
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import plotly.graph_objects as go
import pytest
from _ci import skip_or_fail

from analyses import png_render
from analyses import report as R
from analyses.png_render import PngJob, PngRenderer

# one worker for the module: its browser (started once, seconds of CPU) serves every test
pytestmark = pytest.mark.xdist_group("png_render")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _size(png: bytes | None) -> tuple[int, int]:
    assert png is not None and png[:8] == PNG_MAGIC
    return struct.unpack(">II", png[16:24])  # IHDR: width, height


@pytest.fixture(scope="module")
def browser() -> str:
    found = R.find_browser()
    if found is None:
        skip_or_fail("no Chromium found: PNG rendering is untested (apt-get install -y chromium, or set BROWSER_PATH)")
    return found


@pytest.fixture(scope="module")
def renderer(browser: str):  # noqa: ANN201
    r = PngRenderer(browser, tabs=2)
    yield r
    r.close()


LINE = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2])).to_json()
BARS = go.Figure(go.Bar(y=[1, 5, 2])).to_json()


def test_pngs_of_the_requested_size_same_figure_same_bytes(renderer: PngRenderer) -> None:
    res = renderer.render([PngJob(LINE, 300, 200), PngJob(BARS, 320, 240), PngJob(LINE, 300, 200)])
    assert [_size(r.png) for r in res] == [(300, 200), (320, 240), (300, 200)]
    assert all(r.error is None for r in res)
    assert res[0].png == res[2].png != res[1].png


def test_a_failing_figure_fails_alone(renderer: PngRenderer) -> None:
    res = renderer.render([PngJob("null", 300, 200), PngJob(LINE, 300, 200)])
    assert res[0].png is None and "TypeError" in (res[0].error or "")
    assert _size(res[1].png) == (300, 200)


def test_tabs_reloaded_after_their_quota_draw_the_same(renderer: PngRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(png_render, "RELOAD_EVERY", 2)
    res = renderer.render([PngJob(BARS, 200, 150)] * 7)  # 2 tabs: each reloaded at least twice
    assert len({r.png for r in res}) == 1 and _size(res[0].png) == (200, 150)


def test_calls_from_several_threads(renderer: PngRenderer) -> None:
    with ThreadPoolExecutor(3) as pool:
        out = list(pool.map(lambda w: renderer.render([PngJob(LINE, w, 100), PngJob(BARS, w, 120)]), (210, 220, 230)))
    assert [[_size(r.png) for r in res] for res in out] == [[(w, 100), (w, 120)] for w in (210, 220, 230)]


def test_plotly_renderer_interface(browser: str, renderer: PngRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(png_render, "_renderer", renderer)  # the process's browser: this one
    bundle = png_render.plotly_renderer(browser).to_mimebundle(go.Figure(go.Bar(y=[1]), layout={"height": 250}).to_dict())
    assert _size(base64.b64decode(bundle["image/png"])) == (png_render.DEFAULT_WIDTH, 250)  # plotly's default width


def test_a_browser_that_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    broken = PngRenderer(str(fake), tabs=1)
    try:
        with pytest.raises(Exception):  # noqa: B017 - whatever the driver raises, the caller gets it
            broken.render([PngJob(LINE, 100, 100)])
        assert broken.failed
        # the report's PNG step turns it into a note, and the HTML is still written
        monkeypatch.setattr(R, "_renderer", lambda: (broken, None))
        done, note = R.write_pngs([R.FigureSpec("one", go.Figure(go.Bar(y=[1])), True)], tmp_path / "png")
        assert done == {} and note.startswith("PNG export failed (")
    finally:
        broken.close()


def test_a_browser_that_dies_is_replaced(browser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    monkeypatch.setattr(png_render, "_renderer", None)  # this test's own process-wide renderer
    first = png_render.start(browser, 1)
    try:
        assert first.render([PngJob(LINE, 200, 100)])[0].error is None
        os.kill(first._browser.subprocess.pid, signal.SIGKILL)
        first._browser.subprocess.wait(30)
        assert first.failed and first.render([PngJob(LINE, 200, 100)])[0].png is None  # an error, not a hang
        second = png_render.start(browser, 1)
        assert second is not first and _size(second.render([PngJob(LINE, 200, 100)])[0].png) == (200, 100)
    finally:
        png_render.stop()


def test_submitted_jobs_draw_while_the_caller_goes_on(renderer: PngRenderer, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fut = renderer.submit([PngJob(LINE, 300, 200)])
    assert fut.result(60)[0].png == renderer.render([PngJob(LINE, 300, 200)])[0].png
    # the report's batch: figures submitted section by section, written at the end in submission order
    monkeypatch.setattr(R, "_renderer", lambda: (renderer, None))
    batch = R.PngBatch(width=300)
    batch.submit([R.FigureSpec("a", go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2])), True)])
    batch.submit([])
    batch.submit([R.FigureSpec("b", go.Figure(go.Bar(y=[1, 5, 2])), True)])
    done, note = batch.write(tmp_path / "png")
    assert note is None and list(done) == ["a", "b"]
    assert [_size(p.read_bytes()) for p in done.values()] == [(300, 420)] * 2
    alone, _ = R.write_pngs([R.FigureSpec("b", go.Figure(go.Bar(y=[1, 5, 2])), True)], tmp_path / "alone", width=300)
    assert alone["b"].read_bytes() == done["b"].read_bytes()
