"""The report in a real browser: headless Chromium driven over the DevTools protocol.

Checks that the page loads offline (no http(s) request), logs no console error or uncaught
exception, and that every figure drew a non-empty plot area with traces. Keeps screenshots under
``tmp/artifacts`` (or $POLYTRACE_ARTIFACTS). Skips when no Chromium is installed, except under
CI=true where that is a failure (`.ci/run` installs Debian's chromium package).
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest
from _chromium import Cdp, browser_page, console_errors
from _views_util import build_demo_warehouse

from analyses.api import PolyTrace

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("POLYTRACE_ARTIFACTS", REPO / "tmp" / "artifacts"))
# Runs in the page after load: one entry per figure container that did not draw.
CHECK_JS = """
(() => {
  const out = {figures: 0, problems: [], keys: [], sections: [], overview: []};
  out.sections = [...document.querySelectorAll('section[data-group]')].map(s => s.dataset.group);
  const first = document.querySelector('section[data-group]');
  if (first) out.overview = [...first.querySelectorAll('table th')].map(th => th.textContent);
  for (const box of document.querySelectorAll('.figure[data-figure]')) {
    out.figures += 1;
    const key = box.dataset.figure;
    out.keys.push(key);
    const gd = box.querySelector('.js-plotly-plot');
    if (!gd) { out.problems.push(key + ': no plot element'); continue; }
    const svg = gd.querySelector('.main-svg');
    const r = gd.getBoundingClientRect();
    if (!svg || r.width < 100 || r.height < 100) { out.problems.push(key + ': empty plot area'); continue; }
    const traces = gd.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .boxlayer .trace').length;
    if (!gd._fullData || gd._fullData.length === 0 || traces === 0) out.problems.push(key + ': no trace drawn');
    const marks = gd.querySelectorAll('.scatterlayer path.js-line, .scatterlayer path.point, .barlayer path, .boxlayer path').length;
    if (marks === 0) out.problems.push(key + ': no marks');
  }
  out.expected = Number(document.body.dataset.figures);
  return out;
})()
"""


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser") / "wh"
    runs = build_demo_warehouse(root)
    res = PolyTrace(root).report(root.parent / "report.html", runs=runs, png=False)
    assert res.n_figures >= 15  # every group has data in the demo warehouse
    return res.path


def _render(page: Path, shots: dict[str, str | None]) -> tuple[dict, list[str], list[str]]:
    """Load ``page`` in headless Chromium; returns (CHECK_JS result, errors, requested URLs).

    ``shots`` maps screenshot file name -> element id to scroll to first (None: the top).
    """
    with browser_page() as cdp:
        return _drive(cdp, page, shots)


def _drive(cdp: Cdp, page: Path, shots: dict[str, str | None]) -> tuple[dict, list[str], list[str]]:
    """Enable the domains, load ``page``, run CHECK_JS, take the screenshots."""
    for domain in ("Page", "Runtime", "Log", "Network"):
        cdp.send(f"{domain}.enable")
    cdp.send("Page.navigate", {"url": page.as_uri()})
    cdp.wait_event("Page.loadEventFired", timeout=90)
    # plotly draws inside the page's inline scripts; give resize handlers a beat
    time.sleep(1.0)
    result = cdp.send("Runtime.evaluate", {"expression": CHECK_JS, "returnByValue": True})["result"]["value"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, anchor in shots.items():
        if anchor:
            cdp.send("Runtime.evaluate", {"expression": f"document.getElementById('{anchor}').scrollIntoView()"})
            time.sleep(0.3)
        shot = cdp.send("Page.captureScreenshot", {"format": "png"})
        (ARTIFACTS / name).write_bytes(base64.b64decode(shot["data"]))
    requests = [e["params"]["request"]["url"] for e in cdp.events if e["method"] == "Network.requestWillBeSent"]
    errors = console_errors(cdp.events)
    return result, errors, requests


@pytest.mark.slow
def test_report_renders_in_chromium(report_html: Path) -> None:
    result, errors, requests = _render(
        report_html, {"report_top.png": None, "report_health.png": "fig-training_health__panel__math-a",
                      "report_imbalance.png": "rank_imbalance", "report_gpu.png": "gpu_utilization"}
    )
    assert errors == []
    assert [u for u in requests if u.startswith(("http:", "https:"))] == []  # opens offline
    assert result["figures"] == result["expected"] >= 15
    assert result["problems"] == []
    assert (ARTIFACTS / "report_top.png").stat().st_size > 10_000
    # the report opens with the run overview (and its health alerts), then the training-health panel
    assert result["sections"][0] == "training_health"
    assert {"run_id", "model", "gpus_used", "steps", "duration_h", "formats", "rejected_lines", "alerts"} <= set(
        result["overview"])
    assert "training_health__panel__math-a" in result["keys"]  # drawn: the checks above cover every figure
    assert (ARTIFACTS / "report_health.png").stat().st_size > 10_000


def test_checker_catches_a_broken_page(tmp_path: Path) -> None:
    """The same checks on a page with an undrawn figure and a script error must complain."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body data-figures='1'>"
        "<div class='figure' data-figure='undrawn'><div class='js-plotly-plot'></div></div>"
        "<script>throw new Error('boom')</script></body></html>"
    )
    result, errors, _ = _render(page, {})
    assert result["problems"] == ["undrawn: empty plot area"]
    assert any("boom" in e for e in errors)
