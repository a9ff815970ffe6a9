"""The report in a real browser: headless Chromium driven over the DevTools protocol.

Checks that the page loads offline (no http(s) request), logs no console error or uncaught
exception, and that every figure drew a non-empty plot area with traces. Keeps screenshots under
``tmp/artifacts`` (or $POLYTRACE_ARTIFACTS). Skips when no Chromium is installed, except under
CI=true where that is a failure (`.ci/run` installs Debian's chromium package).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from _ci import skip_or_fail
from _views_util import build_demo_warehouse

from analyses.api import PolyTrace

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("POLYTRACE_ARTIFACTS", REPO / "tmp" / "artifacts"))
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--window-size=1280,1600", "--remote-debugging-port=0",
)

# Runs in the page after load: one entry per figure container that did not draw.
CHECK_JS = """
(() => {
  const out = {figures: 0, problems: []};
  for (const box of document.querySelectorAll('.figure[data-figure]')) {
    out.figures += 1;
    const key = box.dataset.figure;
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


def _chromium() -> str | None:
    env = os.environ.get("POLYTRACE_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


class Cdp:
    """A minimal DevTools-protocol client: send a command, collect events until its reply."""

    def __init__(self, ws) -> None:  # noqa: ANN001 - a websockets sync connection
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, timeout: float = 60.0) -> dict:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg


def _page_ws(user_dir: Path, proc: subprocess.Popen, timeout: float = 30.0) -> str:
    port_file = user_dir / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"chromium did not start: {proc.stderr.read().decode(errors='replace')[-2000:] if proc.stderr else ''}")
        time.sleep(0.1)
    port = port_file.read_text().split()[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:  # noqa: S310 - local
        targets = json.load(r)
    return next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + p["entry"].get("text", ""))
    return out


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser") / "wh"
    runs = build_demo_warehouse(root)
    res = PolyTrace(root).report(root.parent / "report.html", runs=runs, png=False)
    assert res.n_figures >= 15  # every group has data in the demo warehouse
    return res.path


def _require_chromium() -> str:
    exe = _chromium()
    if exe is None:
        skip_or_fail("no Chromium found (apt-get install -y chromium, or set POLYTRACE_CHROMIUM)")
    return exe


def _render(page: Path, shots: dict[str, str | None]) -> tuple[dict, list[str], list[str]]:
    """Load ``page`` in headless Chromium; returns (CHECK_JS result, errors, requested URLs).

    ``shots`` maps screenshot file name -> element id to scroll to first (None: the top).
    """
    exe = _require_chromium()
    user_dir = Path(tempfile.mkdtemp(prefix="polytrace-chromium-"))
    proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={user_dir}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    from websockets.sync.client import connect

    try:
        with connect(_page_ws(user_dir, proc), max_size=None, open_timeout=20, proxy=None) as ws:
            result, errors, requests = _drive(Cdp(ws), page, shots)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(user_dir, ignore_errors=True)
    return result, errors, requests


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
    errors = _errors(cdp.events)
    return result, errors, requests


def test_report_renders_in_chromium(report_html: Path) -> None:
    result, errors, requests = _render(
        report_html, {"report_top.png": None, "report_imbalance.png": "rank_imbalance", "report_gpu.png": "gpu_utilization"}
    )
    assert errors == []
    assert [u for u in requests if u.startswith(("http:", "https:"))] == []  # opens offline
    assert result["figures"] == result["expected"] >= 15
    assert result["problems"] == []
    assert (ARTIFACTS / "report_top.png").stat().st_size > 10_000


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
