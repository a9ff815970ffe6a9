"""Headless Chromium for the browser tests, driven over the DevTools protocol (no extra client
library: ``websockets`` speaks to Chromium's debugging endpoint).

Skips when no Chromium is installed, except under CI=true where that is a failure (`.ci/run`
installs Debian's chromium package).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _ci import skip_or_fail

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--window-size=1280,1600", "--remote-debugging-port=0",
)

def chromium() -> str | None:
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


def page_ws(user_dir: Path, proc: subprocess.Popen, timeout: float = 30.0) -> str:
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


def console_errors(events: list[dict]) -> list[str]:
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


def require_chromium() -> str:
    exe = chromium()
    if exe is None:
        skip_or_fail("no Chromium found (apt-get install -y chromium, or set POLYTRACE_CHROMIUM)")
    return exe



@contextmanager
def browser_page() -> Iterator[Cdp]:
    """A fresh headless Chromium with one page; yields its DevTools client."""
    exe = require_chromium()
    user_dir = Path(tempfile.mkdtemp(prefix="polytrace-chromium-"))
    proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={user_dir}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    from websockets.sync.client import connect

    try:
        with connect(page_ws(user_dir, proc), max_size=None, open_timeout=20, proxy=None) as ws:
            yield Cdp(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(user_dir, ignore_errors=True)
