"""Stream a text file (plain or gzip) as Polars batches of ``(line_no, line)``.

Shared by the line-based readers. Line numbering is exact and matches what an editor shows:

* lines are split on ``\\n`` only; a trailing ``\\r`` (CRLF files) is removed, a ``\\r`` inside a
  line (progress bars redrawn in place) is kept, so numbering agrees with ``wc -l`` / ``grep -n``;
* blank lines are lines (they get a number and must be accounted for by the reader);
* a final line without a terminating newline is a line too: the line count is ``wc -l`` plus
  one when the file does not end in ``\\n`` (an empty file has zero lines);
* invalid UTF-8 bytes are replaced by U+FFFD rather than failing the file (a console log with
  one corrupted byte is still a console log);
* a file that is not text at all (NUL bytes or mostly undecodable in its first 64 KiB), or a
  corrupt gzip stream, raises :class:`UnreadableFile`.

``contains=`` keeps only the lines holding a literal (a reader's cheap prefilter) without ever
materializing the others; each :class:`LineBatch` still says how many physical lines it covers,
so the reader can count the dropped ones as skipped.

Two paths give identical batches. Valid UTF-8 plain files go through Polars' native line scanner
(``pl.scan_lines`` + ``collect_batches``: parallel, memory bounded by a batch). Gzip files and
files with invalid UTF-8 (found by a cheap native pre-pass) go through a block reader (byte blocks cut
after the last newline, undecodable bytes replaced, split by ``scan_lines`` over the bytes).
There is no Python loop per line on either path.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analyses.readers.base import UnreadableFile, is_gzip

DEFAULT_BATCH_LINES = 200_000
DEFAULT_BLOCK_BYTES = 32 * 1024 * 1024
_TEXT_CHECK_BYTES = 64 * 1024
_MAX_BAD_FRACTION = 0.10  # share of undecodable characters above which a file is "not text"
LINE_SCHEMA = {"line_no": pl.Int64, "line": pl.String}


@dataclass
class LineBatch:
    """``lines``: ``(line_no, line)`` rows (only the matching ones when filtered); ``n_lines``:
    physical lines this batch covers, kept or not. Batches are contiguous and in file order."""

    lines: pl.DataFrame
    n_lines: int


def iter_line_batches(
    path: Path,
    batch_lines: int = DEFAULT_BATCH_LINES,
    contains: str | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[LineBatch]:
    """Every line of ``path`` exactly once, in order, as :class:`LineBatch` es.

    ``sum(b.n_lines) == count_lines(path)``; with ``contains``, ``lines`` holds only the lines
    containing that literal.
    """
    path = Path(path)
    _check_text(_head_bytes(path), path)
    total = None if is_gzip(path) else _utf8_line_count(path)
    if total is None:
        yield from _lenient_batches(path, block_bytes, contains)
        return
    lf = pl.scan_lines(path, name="line", row_index_name="line_no", row_index_offset=1)
    lf = lf.select(pl.col("line_no").cast(pl.Int64), "line")
    if contains is not None:
        lf = lf.filter(pl.col("line").str.contains(contains, literal=True))
    done = 0  # lines already covered by yielded batches
    try:
        for df in lf.collect_batches(chunk_size=batch_lines):
            if df.height:
                last = int(df["line_no"][-1])
                yield LineBatch(df, last - done)
                done = last
    except pl.exceptions.ComputeError as exc:  # the file changed under us
        raise UnreadableFile(f"{path.name}: {exc}") from exc
    if total > done:
        yield LineBatch(pl.DataFrame(schema=LINE_SCHEMA), total - done)


def line_frames(path: Path, batch_lines: int = DEFAULT_BATCH_LINES) -> Iterator[pl.DataFrame]:
    """Every line of ``path`` as ``(line_no, line)`` frames of up to ``batch_lines`` rows, for
    readers that account for each line themselves: :func:`iter_line_batches` unfiltered (so an
    invalid UTF-8 byte is replaced, not fatal; gzip is streamed)."""
    for batch in iter_line_batches(path, batch_lines):
        if batch.n_lines != batch.lines.height:  # unfiltered batches hold every line they cover
            raise UnreadableFile(f"{Path(path).name}: line count changed while reading")
        if batch.lines.height:
            yield batch.lines


def count_lines(path: Path) -> int:
    """Number of lines as :func:`iter_line_batches` numbers them (``wc -l``, plus one for a final
    line without newline). For tests and accounting checks."""
    n = 0
    last = b"\n"
    for data in _raw_blocks(Path(path), DEFAULT_BLOCK_BYTES):
        n += data.count(b"\n")
        last = data[-1:]
    return n + (0 if last == b"\n" else 1)


# ---------------------------------------------------------------------------- internals


def _head_bytes(path: Path) -> bytes:
    for head in _raw_blocks(path, _TEXT_CHECK_BYTES):
        return head
    return b""


def _utf8_line_count(path: Path) -> int | None:
    """The file's line count when it is valid UTF-8, else None.

    Polars' native scanner fails on the first invalid byte and, streaming in parallel, may
    already have produced later batches by then; so the whole file is checked first (one cheap
    native pass that materializes every line) and an invalid file takes the lenient path.
    """
    try:
        return (
            pl.scan_lines(path)
            .select(pl.len(), pl.col("line").str.len_bytes().sum())
            .collect(engine="streaming")
            .item(0, 0)
        )
    except pl.exceptions.ComputeError:
        return None


def _check_text(head: bytes, path: Path) -> None:
    if b"\x00" in head:
        raise UnreadableFile(f"{path.name}: not a text file (NUL bytes in the first {len(head)} bytes)")
    text = head.decode("utf-8", errors="replace")
    if text and text.count("\ufffd") > _MAX_BAD_FRACTION * len(text):
        raise UnreadableFile(f"{path.name}: not a text file (mostly invalid UTF-8)")


def _raw_blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    opener = gzip.open if is_gzip(path) else open
    try:
        with opener(path, "rb") as fh:
            while True:
                data = fh.read(block_bytes)
                if not data:
                    return
                yield data
    except (OSError, EOFError, zlib.error) as exc:  # corrupt or truncated gzip, I/O error
        raise UnreadableFile(f"{path.name}: {type(exc).__name__}: {exc}") from exc


def _frame(data: bytes, first_line_no: int) -> pl.DataFrame:
    """Lines of ``data``: every ``\\n``-terminated line, plus a final unterminated one if any."""
    try:
        lines = pl.scan_lines(data, name="line").collect()
    except pl.exceptions.ComputeError:  # invalid UTF-8 in this block: replace, then split
        lines = pl.scan_lines(data.decode("utf-8", errors="replace").encode("utf-8"), name="line").collect()
    return lines.select(
        pl.int_range(first_line_no, first_line_no + lines.height, dtype=pl.Int64).alias("line_no"), "line"
    )


def _lenient_batches(path: Path, block_bytes: int, contains: str | None) -> Iterator[LineBatch]:
    pending = b""
    next_no = 1

    def emit(data: bytes) -> Iterator[LineBatch]:
        nonlocal next_no
        df = _frame(data, next_no)
        next_no += df.height
        if contains is not None:
            kept = df.filter(pl.col("line").str.contains(contains, literal=True))
        else:
            kept = df
        if df.height:
            yield LineBatch(kept, df.height)

    for data in _raw_blocks(path, block_bytes):
        buf = pending + data if pending else data
        cut = buf.rfind(b"\n")
        if cut < 0:  # no newline yet: a line longer than a block keeps accumulating
            pending = buf
            continue
        pending = buf[cut + 1 :]
        yield from emit(buf[: cut + 1])
    if pending:  # final line without a newline
        yield from emit(pending)
