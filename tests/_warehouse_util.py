"""Shared by the fan-out, object-store, hive and Ray tests: a free local port and waiting for a server
to listen on it, table-by-table equality."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from analyses.schema import TABLES
from analyses.warehouse import scan_table


def tables(root: Path) -> dict[str, pl.DataFrame]:
    return {t: scan_table(root, t).collect() for t in TABLES}


def assert_same_tables(a: Path, b: Path) -> None:
    ta, tb = tables(a), tables(b)
    for t in TABLES:
        assert ta[t].equals(tb[t]), f"table {t} differs between {a} and {b}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float, what: str) -> None:
    """Until something listens on 127.0.0.1:``port``; the test fails (with the server's stderr when
    it was piped) if ``proc`` exits first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                pytest.fail(f"{what} did not start: {err}")
            time.sleep(0.2)
