"""What a small run's staging no longer pays on its main thread, with the same files published:
RunStaging.replace(..., background=True) writes the part on the staging writer thread (its rows
scannable at once; the commit publishes the file a foreground replace writes; a failed write fails
the commit), and the typed empty file of a table nothing was staged for is encoded once per process."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import polars as pl
import pytest

from analyses import warehouse
from analyses.atomic_output import WriteFailed
from analyses.schema import TABLES
from analyses.warehouse import RunStaging, empty_part, partition_files, read_published, scan_table, write_part

SAMPLES = pl.DataFrame({"step": [1, 1, 2], "sample_id": ["a", "b", "c"], "response_tokens": [5, 7, 9]})


def _publish(root: Path, background: bool) -> pl.DataFrame:
    st = RunStaging(root, "r")
    st.add("samples", SAMPLES.head(1))
    st.replace("samples", SAMPLES, background=background)
    assert st.scan("samples").select("sample_id").collect().to_series().to_list() == ["a", "b", "c"]
    st.commit()
    return scan_table(root, "samples").collect()


def test_a_background_replace_publishes_what_a_foreground_one_does(tmp_path: Path) -> None:
    fg, bg = _publish(tmp_path / "fg", False), _publish(tmp_path / "bg", True)
    assert bg.equals(fg) and bg.height == 3
    assert read_published(tmp_path / "bg", "r").rows("samples") == 3


def test_the_scan_does_not_wait_for_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go = threading.Event()
    real = warehouse.write_part

    def held(*args: object) -> int:
        assert go.wait(10)
        return real(*args)

    monkeypatch.setattr(warehouse, "write_part", held)
    st = RunStaging(tmp_path, "r")
    st.replace("samples", SAMPLES, background=True)
    assert st.scan("samples").select(pl.len()).collect().item() == 3  # while the write is held
    go.set()
    st.commit()
    assert scan_table(tmp_path, "samples").collect().height == 3


def test_a_failed_background_write_fails_the_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = warehouse.write_part

    def full(df: pl.DataFrame, table: object, path: Path) -> int:
        if path.parent.name == "samples":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(df, table, path)

    monkeypatch.setattr(warehouse, "write_part", full)
    st = RunStaging(tmp_path, "r")
    st.replace("samples", SAMPLES, background=True)
    with pytest.raises(WriteFailed):
        st.commit()
    st.abort()
    assert read_published(tmp_path, "r") is None


def test_the_empty_tables_files_are_the_bytes_write_part_writes(tmp_path: Path) -> None:
    st = RunStaging(tmp_path / "wh", "r")
    st.add("runs", pl.DataFrame({"task": ["t"]}))
    st.commit()
    for name, t in TABLES.items():
        if name == "runs":
            continue
        write_part(t.empty(), t, tmp_path / f"{name}.parquet")
        (published,) = partition_files(tmp_path / "wh", name, "r")
        assert published.read_bytes() == (tmp_path / f"{name}.parquet").read_bytes() == empty_part(t), name
