"""A local HTTP endpoint receiving Apprise ``json://`` notifications, shared by the alert tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
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


def notified_once(receiver: Receiver, kinds: Iterable[str]) -> dict[str, float]:
    """When the notification of each alert kind arrived (time.monotonic()); fails unless every kind
    was notified exactly once and nothing else was."""
    kinds = list(kinds)
    got: dict[str, float] = {}
    for msg, at in zip(receiver.messages, receiver.times, strict=True):
        kind = next(k for k in kinds if k in msg["title"])
        assert kind not in got, f"{kind} notified twice"
        got[kind] = at
    assert set(got) == set(kinds), receiver.messages
    return got
