"""Shared by the fan-out, object-store and hive tests: a free local port, table-by-table equality."""

from __future__ import annotations

import socket
from pathlib import Path

import polars as pl

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
