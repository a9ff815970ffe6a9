"""The reports, their PNGs and the comparisons, served over HTTP on the Dagster UI's host.

Asset metadata can only link: a browser opens no ``file://`` link from ``http://127.0.0.1:3000``
and Dagster's webserver serves no files of ours, so the code location serves the warehouse's
``reports/`` directory itself, read-only, on ``http://$POLYTRACE_REPORTS_HOST:$POLYTRACE_REPORTS_PORT``
(default ``127.0.0.1:3001``), and the assets' ``url`` metadata point there.

It runs where the definitions load: under ``dagster dev`` (``make ui``; Dagster sets
``DAGSTER_IS_DEV_CLI`` for the processes it starts) unless ``POLYTRACE_REPORTS_SERVE=0``, and under
a plain ``dagster-webserver`` / ``dagster code-server`` deployment with ``POLYTRACE_REPORTS_SERVE=1``.
Several processes load the definitions (the code server, each run's worker): the first to bind
the port serves, the others retry every few seconds in a daemon thread, so the server outlives
a reloaded code location and never keeps a process alive.
"""

from __future__ import annotations

import os
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

ENV_SERVE = "POLYTRACE_REPORTS_SERVE"
ENV_HOST = "POLYTRACE_REPORTS_HOST"
ENV_PORT = "POLYTRACE_REPORTS_PORT"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 3001
RETRY_S = 3.0

_started: dict[Path, threading.Thread] = {}


def wanted() -> bool:
    """Serve (and link over HTTP)? ``POLYTRACE_REPORTS_SERVE`` says; unset, under ``dagster dev``."""
    v = os.environ.get(ENV_SERVE, "").strip().lower()
    if v:
        return v not in ("0", "false", "no", "off")
    return bool(os.environ.get("DAGSTER_IS_DEV_CLI"))


def address() -> tuple[str, int]:
    return os.environ.get(ENV_HOST) or DEFAULT_HOST, int(os.environ.get(ENV_PORT) or DEFAULT_PORT)


def url_for(path: Path, reports: Path, fragment: str = "") -> str:
    """The link to ``path`` (a file under ``reports``): over HTTP when served, else its file URI."""
    path, reports = path.resolve(), reports.resolve()
    frag = f"#{fragment}" if fragment else ""
    if wanted() and path.is_relative_to(reports):
        host, port = address()
        return f"http://{host}:{port}/{quote(path.relative_to(reports).as_posix())}{frag}"
    return path.as_uri() + frag


class _Handler(SimpleHTTPRequestHandler):
    """Files of the reports directory, never cached (a report is rewritten in place), no log lines."""

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def _serve(reports: Path, host: str, port: int) -> None:
    while True:
        try:
            server = ThreadingHTTPServer((host, port), partial(_Handler, directory=str(reports)))
        except OSError:  # another process of this code location serves it (or the port is taken): wait
            time.sleep(RETRY_S)
            continue
        server.daemon_threads = True
        with server:
            server.serve_forever()


def start(reports: Path) -> threading.Thread | None:
    """Serve ``reports`` from a daemon thread when :func:`wanted` (once per process and directory)."""
    if not wanted():
        return None
    reports = reports.resolve()
    if reports not in _started:
        reports.mkdir(parents=True, exist_ok=True)
        t = threading.Thread(target=_serve, args=(reports, *address()), name="polytrace-reports", daemon=True)
        t.start()
        _started[reports] = t
    return _started[reports]
