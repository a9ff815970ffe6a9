"""The Dagster UI as a user sees it: a real ``dagster-webserver`` on the `polytrace` code location,
opened in headless Chromium. The key figures of a view group show inline (data-URI PNGs in the
markdown metadata: browsers block file:// links), and column descriptions keep their
``<table>``-like text. Screenshots go to ``tmp/artifacts`` (or $POLYTRACE_ARTIFACTS)."""

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

pytestmark = pytest.mark.slow

_MATERIALIZE = textwrap.dedent("""
    from dagster import DagsterInstance, materialize
    from pipelines.assets import characterize as C
    from pipelines.resources import WarehouseResource
    with DagsterInstance.get() as instance:
        res = materialize([a for a in C.GROUP_ASSETS if a.key.path[-1] == "lengths_view"], instance=instance,
                          resources={"warehouse": WarehouseResource.from_env()})
        assert res.success
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_chromium()
    tmp = tmp_path_factory.mktemp("ui")
    build_demo_warehouse(tmp / "wh")
    (tmp / "logs").mkdir()
    (tmp / "home").mkdir()
    (tmp / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = dict(os.environ, DAGSTER_HOME=str(tmp / "home"), POLYTRACE_WAREHOUSE=str(tmp / "wh"),
               POLYTRACE_LOGS_ROOT=str(tmp / "logs"), PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", _MATERIALIZE], env=env, cwd=REPO, check=True, timeout=600)
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
                time.sleep(1)
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
        time.sleep(0.5)
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
            time.sleep(0.5)
        shot = _shot(cdp, "ui_lengths_figures.png")
    assert len(imgs) == 3 and all(src == "data:image/png;base64," and w >= 800 for src, w in imgs), imgs
    assert shot.stat().st_size > 20_000


def test_column_descriptions_keep_angle_brackets(ui: str) -> None:
    with browser_page() as cdp:
        _open(cdp, f"{ui}/assets/steps", "document.body.innerText.includes('hive partition key')")
        text = _eval(cdp, "document.body.innerText")
        _shot(cdp, "ui_steps_columns.png")
    assert "parquet/<table>/run_id=<id>/" in str(text)
