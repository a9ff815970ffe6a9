"""PNG export of plotly figures: one headless Chromium per process, its tabs kept loaded.

kaleido (what ``plotly.io.write_image`` uses) reloads its tab after every figure, so each PNG
pays for loading plotly.js again: ~0.3-0.4 s of Chromium CPU a figure on 2 cores, whatever the
figure, most of the report's PNG time. Here each tab loads the plotly.js that ships with the
installed plotly (the one the HTML report embeds) once, and renders figure after figure with the
call kaleido makes (``Plotly.toImage`` with kaleido's default config), ~0.05 s of CPU a figure. A
tab is reloaded after :data:`RELOAD_EVERY` figures, so a long export never grows one page.

The browser runs in an event loop on a thread of its own (:func:`start` returns at once, so
Chromium starts while the caller computes); :func:`render` is safe to call from any thread, and
the browser is closed at exit. The browser is ``choreographer``'s (kaleido's own driver).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RELOAD_EVERY = 100  # figures a tab renders before it is reloaded
FIGURE_TIMEOUT_S = 120.0  # a figure that takes longer is reported as failed
START_TIMEOUT_S = 120.0
CLOSE_WAIT_S = 10.0

# kaleido's default config (kaleido_scopes.js) and image options for a PNG at scale 1
_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>polytrace-png</title>
<script src="{plotly}"></script>
<script>
window.polytracePng = function (fig, width, height) {{
  var config = Object.assign({{mapboxAccessToken: null, plotGlPixelRatio: 2}}, fig.config || {{}});
  return Plotly.toImage({{data: fig.data || [], layout: fig.layout || {{}}, config: config}},
                        {{format: "png", width: width, height: height, scale: 1, imageDataOnly: true}});
}};
</script></head><body style="margin: 0; padding: 0"></body></html>
"""


@dataclass(frozen=True)
class PngJob:
    """One figure to render: its plotly JSON (``fig.to_json()``) and its size in pixels."""

    figure_json: str
    width: int
    height: int


@dataclass(frozen=True)
class PngResult:
    """A rendered PNG, or why there is none."""

    png: bytes | None
    error: str | None = None


def plotly_js() -> Path:
    """The plotly.js bundled with the installed plotly package."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


class PngRenderer:
    """A headless Chromium with ``tabs`` tabs, each with plotly.js loaded, on a thread of its own."""

    def __init__(self, browser: str, tabs: int) -> None:
        self.browser_path = browser
        self.n_tabs = max(1, tabs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="polytrace-png", daemon=True)
        self._dir = Path(tempfile.mkdtemp(prefix="polytrace-png-"))
        self._index = self._dir / "index.html"
        self._index.write_text(_PAGE.format(plotly=plotly_js().as_uri()), encoding="utf-8")
        self._browser: Any = None
        self._tabs: asyncio.Queue | None = None
        self._thread.start()
        self._ready = asyncio.run_coroutine_threadsafe(self._open(), self._loop)

    async def _open(self) -> None:
        import choreographer as choreo

        browser = self._browser = choreo.Browser(path=self.browser_path, headless=True)
        await browser.open()
        tabs = [await browser.create_tab(url="", window=True) for _ in range(self.n_tabs)]
        self._tabs = asyncio.Queue()
        for tab in await asyncio.gather(*(self._load(t) for t in tabs)):
            self._tabs.put_nowait([tab, 0])

    async def _load(self, tab: Any) -> Any:
        await tab.send_command("Page.enable")
        loaded = tab.subscribe_once("Page.loadEventFired")
        _check(await tab.send_command("Page.navigate", params={"url": self._index.as_uri()}))
        await loaded
        # the page's own script ran before its load event; say so if plotly.js did not load
        got = await _evaluate(tab, "typeof window.polytracePng === 'function' && typeof Plotly === 'object'")
        if got is not True:
            raise RuntimeError(f"plotly.js did not load in the browser from {plotly_js()}")
        return tab

    async def _render_one(self, job: PngJob) -> PngResult:
        assert self._tabs is not None
        tab, done = await self._tabs.get()
        try:
            if done >= RELOAD_EVERY:
                tab = await self._load(tab)
                done = 0
            data = await asyncio.wait_for(
                _evaluate(tab, f"window.polytracePng({job.figure_json}, {int(job.width)}, {int(job.height)})",
                          promise=True),
                FIGURE_TIMEOUT_S)
            if not isinstance(data, str) or not data:
                return PngResult(None, "the browser returned no image")
            return PngResult(base64.b64decode(data))
        except Exception as exc:  # one figure's failure is that figure's, never the batch's
            return PngResult(None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        finally:
            self._tabs.put_nowait([tab, done + 1])

    async def _render(self, jobs: Sequence[PngJob]) -> list[PngResult]:
        # the browser may still be starting: wait for it here, on the loop, not in the caller
        await asyncio.wait_for(asyncio.wrap_future(self._ready), START_TIMEOUT_S)
        return list(await asyncio.gather(*(self._render_one(j) for j in jobs)))

    def submit(self, jobs: Sequence[PngJob]) -> Future[list[PngResult]]:
        """Start rendering ``jobs`` and return at once: the future gives every job's PNG, in order,
        or raises when the browser could not start. The caller goes on computing meanwhile (the
        browser draws on the other core)."""
        return asyncio.run_coroutine_threadsafe(self._render(list(jobs)), self._loop)

    def render(self, jobs: Sequence[PngJob]) -> list[PngResult]:
        """Every job's PNG, in order. Raises when the browser could not start."""
        return self.submit(jobs).result()

    @property
    def failed(self) -> bool:
        """The browser could not start (:meth:`render` raises why), or its process has ended since."""
        if self._ready.done() and self._ready.exception() is not None:
            return True
        proc = getattr(self._browser, "subprocess", None)
        return proc is not None and proc.poll() is not None

    def close(self) -> None:
        """Close the browser (waiting a little for one still starting) and the loop's thread."""
        async def _close() -> None:
            if self._browser is not None:
                await self._browser.close()

        with suppress(Exception):  # closing at exit: a browser that failed to start has nothing to close
            self._ready.result(CLOSE_WAIT_S)
        try:
            with suppress(Exception):
                asyncio.run_coroutine_threadsafe(_close(), self._loop).result(CLOSE_WAIT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_WAIT_S)
            shutil.rmtree(self._dir, ignore_errors=True)


async def _evaluate(tab: Any, expression: str, promise: bool = False) -> Any:
    res = _check(await tab.send_command("Runtime.evaluate", params={
        "expression": expression, "awaitPromise": promise, "returnByValue": True}))
    result = res["result"]
    if "exceptionDetails" in result:
        exc = result["exceptionDetails"].get("exception", {})
        raise RuntimeError(exc.get("description") or result["exceptionDetails"].get("text") or "JavaScript error")
    return result["result"].get("value")


def _check(res: dict) -> dict:
    if "error" in res:
        raise RuntimeError(f"devtools: {res['error'].get('message', res['error'])}")
    return res


_lock = threading.Lock()
_renderer: PngRenderer | None = None


def start(browser: str, tabs: int) -> PngRenderer:
    """The process's renderer, started (without waiting for Chromium) on the first call, and
    again after one that could not start."""
    global _renderer
    with _lock:
        old = _renderer
        if old is None or old.failed:
            if old is None:
                atexit.register(stop)
            _renderer = PngRenderer(browser, tabs)
        new = _renderer
    if old is not None and old is not new:
        old.close()
    return new


def stop() -> None:
    """Close the process's browser (at exit; a later :func:`start` starts another)."""
    global _renderer
    with _lock:
        r, _renderer = _renderer, None
    if r is not None:
        r.close()


def cpu_tabs() -> int:
    """Tabs rendering at once: one per core (each tab is a renderer process), at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


# plotly's own default size for a figure without one (plotly.io.to_image)
DEFAULT_WIDTH, DEFAULT_HEIGHT = 700, 500


def plotly_renderer(browser: str | None) -> Any:
    """A plotly renderer (``plotly.io.renderers[name] = ...``) that shows a figure as a PNG drawn
    in this process's browser: what a notebook uses instead of plotly's ``png`` renderer, which
    goes through kaleido's reloads. Without a ``browser`` showing a figure raises, as ``png`` does
    without one."""
    from plotly.io.base_renderers import MimetypeRenderer
    from plotly.io.json import to_json_plotly

    class _Png(MimetypeRenderer):
        def to_mimebundle(self, fig_dict: dict) -> dict[str, str]:
            if browser is None:
                raise RuntimeError("no Chrome/Chromium found for the PNG (apt-get install chromium, or set "
                                   "BROWSER_PATH); PLOTLY_RENDERER=plotly_mimetype shows figures without it")
            layout = fig_dict.get("layout") or {}
            job = PngJob(to_json_plotly(fig_dict), int(layout.get("width") or DEFAULT_WIDTH),
                         int(layout.get("height") or DEFAULT_HEIGHT))
            res = start(browser, cpu_tabs()).render([job])[0]
            if res.png is None:
                raise RuntimeError(f"PNG not rendered: {res.error}")
            return {"image/png": base64.b64encode(res.png).decode("ascii")}

    return _Png()
