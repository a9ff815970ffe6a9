"""small_files_lines: several small files split as one frame, checked after the split (no CR,
no NUL) or scanned file by file first (CRLF, classic Mac, NUL), with the numbering
iter_line_batches gives each file alone."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses.readers.lines import _FAST_MAX_LINE, iter_line_batches, small_files_lines


def _write(tmp_path: Path, files: dict[str, bytes]) -> list[Path]:
    out = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        out.append(tmp_path / name)
    return out


def _alone(paths: list[Path]) -> list[tuple[int, int, str]]:
    rows = []
    for i, p in enumerate(paths):
        for b in iter_line_batches(p):
            rows += [(i, n, s) for n, s in b.lines.rows()]
    return rows


def test_split_then_checked(tmp_path: Path) -> None:
    paths = _write(tmp_path, {"a.jsonl": b'{"a":1}\n{"a":2}\n', "b.jsonl": '{"b":"\u00e9"}\n'.encode(),
                              "c.jsonl": b"x\n\ny\n"})
    got = small_files_lines(paths)
    assert got is not None
    lines, counts = got
    assert counts == [2, 1, 3]
    assert lines.schema == pl.Schema({"_file": pl.Int64, "line_no": pl.Int64, "line": pl.String})
    assert lines.rows() == [(0, 1, '{"a":1}'), (0, 2, '{"a":2}'), (1, 1, '{"b":"\u00e9"}'),
                            (2, 1, "x"), (2, 2, ""), (2, 3, "y")]
    assert lines.rows() == _alone(paths)
    # the bytes given by the caller instead of read here: the same frame
    given = small_files_lines(paths, given=[p.read_bytes() for p in paths])
    assert given is not None and given[0].equals(lines) and given[1] == counts


def test_crlf_scanned_first(tmp_path: Path) -> None:
    paths = _write(tmp_path, {"a.jsonl": b"p\r\nq\r\n", "b.jsonl": b"r\n"})
    got = small_files_lines(paths)
    assert got is not None
    assert got[1] == [2, 1] and got[0].rows() == [(0, 1, "p"), (0, 2, "q"), (1, 1, "r")] == _alone(paths)


@pytest.mark.parametrize("bad", [b"\xff\n", b"a\x00b\n", b"no newline", b"z" * (_FAST_MAX_LINE + 1) + b"\n", b""])
def test_refused_files(tmp_path: Path, bad: bytes) -> None:
    """Invalid UTF-8, a NUL byte, no final newline, an over-long line, an empty file: the batch is
    refused whole (its files are read one by one, each with its own reasons)."""
    paths = _write(tmp_path, {"ok.jsonl": b'{"a":1}\n', "bad.jsonl": bad})
    assert small_files_lines(paths) is None
    assert small_files_lines(paths[:1]) is not None


def _megabyte_file(tail: bytes) -> bytes:
    """Over 1 MB of JSON lines (files this large are split as views of their own bytes, not
    joined), then ``tail``."""
    line = b'{"step": 1, "text": "' + "\u00e9\u20ac\U0001f600".encode() * 40 + b'"}\n'
    return line * ((1 << 20) // len(line) + 1) + tail


def test_large_files_split_as_views_of_their_bytes(tmp_path: Path) -> None:
    """Lines of 0 to 13 bytes (up to 12 sit inside Arrow's view, longer ones point into the
    file's bytes), multi-byte characters across the 4-byte prefix, in the second file too:
    the frame each file alone gives."""
    short = b"\n" + b"a\n" + b"x" * 12 + b"\n" + b"y" * 13 + b"\n" + "\u00e9\u20ac\U0001f600z\n".encode()
    paths = _write(tmp_path, {"a.jsonl": _megabyte_file(short), "b.jsonl": short + _megabyte_file(b"")})
    got = small_files_lines(paths)
    assert got is not None
    lines, counts = got
    assert lines.rows() == _alone(paths)
    assert counts[0] == counts[1] and lines.filter(pl.col("line") == "x" * 12).height == 2
    assert lines.schema == pl.Schema({"_file": pl.Int64, "line_no": pl.Int64, "line": pl.String})


def test_large_file_with_invalid_utf8_is_refused(tmp_path: Path) -> None:
    paths = _write(tmp_path, {"a.jsonl": _megabyte_file(b""), "b.jsonl": _megabyte_file(b'{"a": "\xff"}\n')})
    assert small_files_lines(paths) is None
    assert small_files_lines(paths[:1]) is not None
