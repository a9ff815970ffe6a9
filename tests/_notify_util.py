"""A local HTTP endpoint receiving Apprise ``json://`` notifications, shared by the alert tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _warehouse_util import free_port


class Receiver:
    """An HTTP endpoint that keeps every JSON body posted to it (Apprise's ``json://`` target), and
    when each arrived (``times``, time.monotonic())."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.times: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.times.append(time.monotonic())
                outer.messages.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/"


def write_steps_at_pace(log: Path, lines: list[str], pace_s: float, written: dict[int, float]) -> None:
    """Append ``lines`` to ``log`` as a training job writes them: flushed one by one, a pause of
    ``pace_s`` after each verl step line, whose step and time (time.monotonic()) go to ``written``."""
    with log.open("a") as fh:
        for ln in lines:
            fh.write(ln)
            fh.flush()
            if ln.startswith("step:"):
                written[int(ln[5:ln.index(" ")])] = time.monotonic()
                time.sleep(pace_s)
