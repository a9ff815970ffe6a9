"""The Dagster UI as a user sees it: a real ``dagster-webserver`` on the `polytrace` code location,
opened in headless Chromium. The key figures of a view group show inline (data-URI PNGs in the
markdown metadata: browsers block file:// links), column descriptions keep their ``<table>``-like
text, and the report and comparison links open in one click: the code location serves the reports
directory over HTTP (pipelines.report_server). Screenshots go to ``tmp/artifacts`` (or
$POLYTRACE_ARTIFACTS)."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _chromium import Cdp, browser_page, require_chromium
from _views_util import build_demo_warehouse

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("POLYTRACE_ARTIFACTS", REPO / "tmp" / "artifacts"))
WEBSERVER = Path(sys.executable).with_name("dagster-webserver")
POLL_S = 0.1  # between tries while waiting for the webserver or a page (each try is one local request)

# one worker runs the module: its webserver (and the materialization behind it) starts once, not per worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dagster_ui")]

def _materialize() -> None:
    """What the UI shows: the lengths view, the report and the run comparison, materialized on the
    instance of ``$DAGSTER_HOME`` with the warehouse of the environment (in this process: a fresh one
    only paid Dagster's imports again)."""
    from dagster import AssetKey, DagsterInstance, materialize

    from pipelines.assets import characterize as C
    from pipelines.assets.compare import run_comparison
    from pipelines.resources import WarehouseResource

    with DagsterInstance.get() as instance:
        res = materialize([C.characterize, run_comparison], instance=instance,
                          selection=[AssetKey("lengths_view"), AssetKey("characterization_report"),
                                     AssetKey("run_comparison")],
                          resources={"warehouse": WarehouseResource.from_env()})
        assert res.success


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reports_port() -> int:
    return _free_port()


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, reports_port: int) -> Iterator[str]:
    require_chromium()
    tmp = tmp_path_factory.mktemp("ui")
    build_demo_warehouse(tmp / "wh")
    (tmp / "logs").mkdir()
    (tmp / "home").mkdir()
    (tmp / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # a plain dagster-webserver (not `dagster dev`) serves the reports when told to
    env = dict(os.environ, DAGSTER_HOME=str(tmp / "home"), POLYTRACE_WAREHOUSE=str(tmp / "wh"),
               POLYTRACE_LOGS_ROOT=str(tmp / "logs"), PYTHONPATH=str(REPO), POLYTRACE_REPORTS_SERVE="1",
               POLYTRACE_REPORTS_PORT=str(reports_port))
    with pytest.MonkeyPatch.context() as mp:
        for k in ("DAGSTER_HOME", "POLYTRACE_WAREHOUSE", "POLYTRACE_LOGS_ROOT", "POLYTRACE_REPORTS_SERVE",
                  "POLYTRACE_REPORTS_PORT"):
            mp.setenv(k, env[k])
        try:
            _materialize()
        finally:
            from analyses import png_render

            png_render.stop()  # its Chromium for the report's PNGs; as when the process ended
    port = _free_port()
    proc = subprocess.Popen([str(WEBSERVER), "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=5):  # noqa: S310 - local
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dagster-webserver did not start: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(POLL_S)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _open(cdp: Cdp, url: str, ready_js: str, timeout: float = 120.0) -> None:
    for domain in ("Page", "Runtime"):
        cdp.send(f"{domain}.enable")
    cdp.send("Page.navigate", {"url": url})
    cdp.wait_event("Page.loadEventFired", timeout=90)
    deadline = time.monotonic() + timeout
    while not _eval(cdp, ready_js):
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: the page never showed what the test waits for ({ready_js})")
        time.sleep(POLL_S)
    # the first visit shows a newsletter prompt over the page
    _eval(cdp, "(() => { const b = [...document.querySelectorAll('button')].find(b => b.textContent.trim() === 'Skip');"
               " if (b) b.click(); return true })()")


def _eval(cdp: Cdp, js: str) -> object:
    return cdp.send("Runtime.evaluate", {"expression": js, "returnByValue": True})["result"].get("value")


def _shot(cdp: Cdp, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / name
    out.write_bytes(base64.b64decode(cdp.send("Page.captureScreenshot", {"format": "png"})["data"]))
    return out


SHOW_MD = "[...document.querySelectorAll('a')].find(a => a.textContent.trim() === '[Show Markdown]')"


def test_view_group_figures_show_inline(ui: str) -> None:
    with browser_page() as cdp:
        _open(cdp, f"{ui}/locations/polytrace/asset-groups/characterize", "document.body.innerText.includes('lengths_view')")
        _open(cdp, f"{ui}/assets/lengths_view", f"!!{SHOW_MD}")
        # the first [Show Markdown] in the metadata table that holds images is the figures entry
        _eval(cdp, textwrap.dedent("""
            (() => { for (const row of document.querySelectorAll('tr')) {
                       if (row.innerText.trim().startsWith('figures')) { row.querySelector('a').click(); return true } }
                     return false })()"""))
        deadline = time.monotonic() + 30
        imgs: list = []
        while time.monotonic() < deadline:
            imgs = _eval(cdp, "[...document.querySelectorAll('[role=dialog] img')].map(i => [i.src.slice(0, 22), i.naturalWidth])") or []
            if imgs and all(w > 0 for _, w in imgs):
                break
            time.sleep(POLL_S)
        shot = _shot(cdp, "ui_lengths_figures.png")
    assert len(imgs) == 3 and all(src == "data:image/png;base64," and w >= 800 for src, w in imgs), imgs
    assert shot.stat().st_size > 20_000


def test_column_descriptions_keep_angle_brackets(ui: str) -> None:
    with browser_page() as cdp:
        _open(cdp, f"{ui}/assets/steps", "document.body.innerText.includes('hive partition key')")
        text = _eval(cdp, "document.body.innerText")
        _shot(cdp, "ui_steps_columns.png")
    assert "parquet/<table>/run_id=<id>/" in str(text)


# the link to the reports server on an asset page, made to open in this tab (the UI opens it in a new one)
_FOLLOW = """
(() => { const a = [...document.querySelectorAll('a')].find(a => a.href.startsWith(%r) && a.href.includes(%r));
         if (!a) return null; a.target = '_self'; a.click(); return a.href })()"""


def _follow(cdp: Cdp, prefix: str, part: str) -> str:
    deadline = time.monotonic() + 60
    href = None
    while href is None:
        href = _eval(cdp, _FOLLOW % (prefix, part))
        if href is None:
            assert time.monotonic() < deadline, f"no link to {prefix}...{part} on the page"
            time.sleep(POLL_S)
    return str(href)


def _wait_drawn(cdp: Cdp, selector: str, what: str) -> None:
    """Until the plot at ``selector`` has traces; evaluations fail while the tab navigates to the link."""
    deadline = time.monotonic() + 90
    while True:
        try:
            if _eval(cdp, _DRAWN % selector):
                return
        except RuntimeError as exc:  # "Inspected target navigated or closed": the next page is loading
            if "navigated" not in str(exc):
                raise
        assert time.monotonic() < deadline, f"{what} never drew"
        time.sleep(POLL_S)


_DRAWN = ("(() => { const gd = document.querySelector(%r); "
          "return !!(gd && gd._fullData && gd._fullData.length && gd.querySelector('.scatterlayer .trace')) })()")


def test_report_link_opens_from_the_asset_page_at_the_comparison_section(ui: str, reports_port: int) -> None:
    served = f"http://127.0.0.1:{reports_port}/"
    with browser_page() as cdp:
        _open(cdp, f"{ui}/assets/characterization_report", f"!!document.querySelector('a[href^=\"{served}\"]')")
        href = _follow(cdp, served, "#compare")
        assert href == f"{served}polytrace_report.html#compare"
        _wait_drawn(cdp, "section#compare [data-figure='compare__curves'] .js-plotly-plot",
                    "the comparison section's curves")
        got = _eval(cdp, """({url: location.href, captions: [...document.querySelectorAll('section#compare h3')]
                              .map(h => h.textContent), rows: document.querySelectorAll('section#compare tbody tr').length,
                              figs: [...document.querySelectorAll('section#compare .figure')].map(f => f.dataset.figure)})""")
        _shot(cdp, "ui_report_comparison.png")
    assert got["url"] == href
    # 3 demo runs: each against the first, ranked, and the overlaid curves first among the figures
    assert len(got["captions"]) == 2 and got["captions"][0].startswith("dapo-c against agent-b")
    assert got["figs"][0] == "compare__curves" and got["rows"] > 3


def test_comparison_link_opens_from_the_run_comparison_asset(ui: str, reports_port: int) -> None:
    served = f"http://127.0.0.1:{reports_port}/comparisons/"
    with browser_page() as cdp:
        _open(cdp, f"{ui}/assets/run_comparison", f"!!document.querySelector('a[href^=\"{served}\"]')")
        href = _follow(cdp, served, ".html")
        _wait_drawn(cdp, "[data-figure='compare__curves'] .js-plotly-plot", "the comparison page's curves")
        got = _eval(cdp, "({title: document.title, head: [...document.querySelectorAll('th')].map(t => t.textContent)})")
        _shot(cdp, "ui_run_comparison.png")
    assert href == f"{served}dapo-c__vs__agent-b.html"
    assert got["title"] == "PolyTrace comparison: dapo-c against agent-b"
    assert got["head"][:4] == ["rank", "quantity", "a", "b"]
