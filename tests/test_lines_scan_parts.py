"""The line layer's byte pre-pass scanned in parts on several threads (``lines._scan_plain``)
gives exactly the one-thread scan: line count, longest line, NUL bytes, UTF-8 validity, and so
the same batches. The parts' minimum size is lowered so that small files are cut."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses.readers import lines


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(lines, "_SCAN_PART_MIN_BYTES", 64)
    monkeypatch.setattr(lines, "_SCAN_BLOCK_BYTES", 37)  # blocks that cut lines and characters


def _serial(path: Path, max_line_bytes: int = 1 << 20) -> lines._PlainScan:
    return lines._scan_blocks(lines._raw_blocks(path, 1 << 20), max_line_bytes)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


CASES = {
    # the longest line sits in the last part and has no newline
    "final_line_without_newline": b"".join(b"step:%d - a:1\n" % i for i in range(40)) + b"x" * 300,
    # two-byte and four-byte characters everywhere, so a cut at an equal share falls inside one
    "multibyte_characters_at_every_cut": "".join(f"step:{i} - é:1 - 😀:2\n" for i in range(60)).encode(),
    "nul_byte_in_the_second_half": b"a\n" * 200 + b"b\x00c\n" + b"d\n" * 10,
    "invalid_utf8_in_the_second_half": b"a\n" * 200 + b"b\xffc\n" + b"d\n" * 10,
    "blank_lines_and_crlf": b"\r\n\n" * 100 + b"step:1 - a:1\r\n",
    "longest_line_in_the_first_part": b"y" * 500 + b"\n" + b"z\n" * 400,
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_scan_in_parts_equals_the_serial_scan(tmp_path, small_parts, monkeypatch, name, threads):
    """Also with one thread: one part, its blocks read into the reused buffer."""
    monkeypatch.setattr(pl, "thread_pool_size", lambda: threads)
    path = _write(tmp_path, name, CASES[name])
    assert (len(lines._part_bounds(path, threads)) > 2) == (threads > 1)  # really cut
    assert lines._scan_plain(path, 1 << 20) == _serial(path)


def test_parts_start_right_after_a_newline(tmp_path, small_parts):
    data = b"".join(b"line %d\n" % i for i in range(100))
    bounds = lines._part_bounds(_write(tmp_path, "f", data), 4)
    assert bounds[0] == 0 and bounds[-1] == len(data) and bounds == sorted(set(bounds))
    assert all(data[b - 1:b] == b"\n" for b in bounds[1:-1])


def test_a_file_without_a_newline_near_the_cut_is_scanned_whole(tmp_path, small_parts):
    path = _write(tmp_path, "one_long_line", b"x" * (3 << 20))
    assert lines._part_bounds(path, 2) == [0, 3 << 20]
    assert lines._scan_plain(path, 4 << 20) == _serial(path, 4 << 20)


def test_batches_of_a_file_scanned_in_parts(tmp_path, small_parts, monkeypatch):
    monkeypatch.setattr(pl, "thread_pool_size", lambda: 2)
    monkeypatch.setattr(lines, "_SMALL_FILE_BYTES", 0)  # not the small-file path
    data = b"".join(b"step:%d - a:%d\n" % (i, i) if i % 3 else b"noise %d\n" % i for i in range(300))
    path = _write(tmp_path, "log", data)
    got = list(lines.iter_line_batches(path, batch_lines=50, contains="step:"))
    assert sum(b.n_lines for b in got) == 300
    kept = pl.concat([b.lines for b in got])
    assert kept["line_no"].to_list() == [i + 1 for i in range(300) if i % 3]
