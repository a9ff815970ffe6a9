"""Stream a text file (plain or gzip) as Polars batches of ``(line_no, line)``.

Shared by the line-based readers. Line numbering is exact and matches what an editor shows:

* lines are split on ``\\n`` only; a trailing ``\\r`` (CRLF files) is removed, a ``\\r`` inside a
  line (progress bars redrawn in place) is kept, so numbering agrees with ``wc -l`` / ``grep -n``;
* except in a file with classic Mac OS line ends: when the file's first block (the whole of a
  file up to 4 MiB, else the first 32 MiB it inflates to) holds ``\\r`` but no ``\\n`` at all, every
  ``\\r`` ends a line (read as ``\\n``), as an editor shows it. (A console capture's progress bars
  redraw with ``\\r`` too, but every real capture has some newline among its first 32 MiB.)
* blank lines are lines (they get a number and must be accounted for by the reader);
* a final line without a terminating newline is a line too: the line count is ``wc -l`` plus
  one when the file does not end in ``\\n`` (an empty file has zero lines);
* invalid UTF-8 bytes are replaced by U+FFFD rather than failing the file (a console log with
  one corrupted byte is still a console log);
* a file that is not text at all (its first 64 KiB mostly NUL, control or undecodable bytes), a
  corrupt gzip stream, or a gzip that inflates past :mod:`analyses.readers.limits` (a gzip
  bomb) raises :class:`UnreadableFile`.

Two kinds of line never reach a reader; they are *rejected by the line layer* (``line_no``,
reason, the start of the line as ``raw``): a line longer than ``limits.max_line_bytes``
(``line_too_long``: streamed past, never held whole) and a line holding NUL bytes
(``nul_bytes``: binary garbage in a text log, e.g. a crash that wrote zeros mid-line). Their
numbers are missing from the batches and they are not in ``n_lines``; they are accounted for
by :func:`analyses.readers.read_file`, which installs the collector (:func:`collect_refused`)
and adds them to the reader's chunks as rejected lines. Reading such a file without a
collector raises :class:`UnreadableFile`, so a line is never silently lost.

``contains=`` keeps only the lines holding a literal (a reader's cheap prefilter) without ever
materializing the others; each :class:`LineBatch` still says how many physical lines it covers,
so the reader can count the dropped ones as skipped.

Two paths give identical batches. Plain files that are valid UTF-8, hold no NUL byte and no line
over 1 MiB (found by one byte-level pre-pass, numpy over blocks) go through Polars' native line
scanner (``pl.scan_lines`` + ``collect_batches``: parallel, memory bounded by a batch, whose
line count is cut so that it holds at most ``batch_bytes`` even if every line were the longest).
Every other file (gzip, a tar member, invalid UTF-8, NUL bytes, an over-long line) goes through
a block reader (byte blocks cut after the last newline, undecodable bytes replaced, split by
``scan_lines`` over the bytes). There is no Python loop per line on either path.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import zlib
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import polars as pl

from analyses.readers import limits
from analyses.readers.base import UnreadableFile, is_gzip
from analyses.schema import RAW_MAX_CHARS

DEFAULT_BATCH_LINES = 200_000
DEFAULT_BLOCK_BYTES = 32 * 1024 * 1024
# a batch holds at most this much text, whatever its line count: readers multiply a batch's size
# (splits, regex captures, exploded pairs), so lines of 200 KB in a 200k-line batch would be 40 GB
DEFAULT_BATCH_BYTES = 16 * 1024 * 1024
_FAST_MAX_LINE = 1 << 20  # longer lines go through the block reader, which bounds batches by bytes
# a plain file this small is read once, its lines split from the bytes (a PolyTrace step file
# is 10 KB to 3.4 MB: opening and scanning it three times cost more than splitting it; 3.4 MB
# multi-turn files read 1.7 ms faster each, 18.5 instead of 20.3 ms)
_SMALL_FILE_BYTES = SMALL_FILE_BYTES = 4 << 20
_TEXT_CHECK_BYTES = 64 * 1024
_MAX_BAD_FRACTION = 0.10  # share of NUL/control/undecodable characters above which a file is "not text"
_TEXT_CONTROLS = "\t\n\r\x0b\x0c\x08\x1b"  # control characters real logs hold (ANSI escapes, tabs, ...)
_BAD_CHARS = "".join(chr(c) for c in range(32) if chr(c) not in _TEXT_CONTROLS) + "\ufffd"
_DROP_BAD = str.maketrans("", "", _BAD_CHARS)
LINE_SCHEMA = {"line_no": pl.Int64, "line": pl.String}
REASON_TOO_LONG = "line_too_long: {n} bytes, over the {limit}-byte line limit; not read"
REASON_NUL = "nul_bytes: the line holds NUL bytes (binary garbage in a text file)"


@dataclass
class LineBatch:
    """``lines``: ``(line_no, line)`` rows (only the matching ones when filtered); ``n_lines``:
    physical lines this batch covers, kept or not, except lines refused by the line layer
    (accounted for separately, see the module docs). Batches are contiguous and in file order."""

    lines: pl.DataFrame
    n_lines: int


@dataclass
class RefusedLines:
    """Lines the line layer refused while a file was read: ``(line_no, reason, raw)``."""

    rows: list[tuple[int, str, str]] = field(default_factory=list)

    def drain(self) -> list[tuple[int, str, str]]:
        out, self.rows = self.rows, []
        return out


_refused: ContextVar[RefusedLines | None] = ContextVar("refused_lines", default=None)


@contextmanager
def collect_refused() -> Iterator[RefusedLines]:
    """Collect the lines refused by the line layer while the block runs (see the module docs)."""
    sink = RefusedLines()
    token = _refused.set(sink)
    try:
        yield sink
    finally:
        try:
            _refused.reset(token)
        except ValueError:  # closed from another context (a generator finalized elsewhere)
            _refused.set(None)


def _refuse(path: Path, rows: list[tuple[int, str, str]]) -> None:
    sink = _refused.get()
    if sink is None:
        line_no, reason, _ = rows[0]
        raise UnreadableFile(f"{path.name}: line {line_no}: {reason} (read through analyses.readers.read_file)")
    sink.rows.extend(rows)


def iter_line_batches(
    path: Path,
    batch_lines: int = DEFAULT_BATCH_LINES,
    contains: str | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> Iterator[LineBatch]:
    """Every line of ``path`` exactly once, in order, as :class:`LineBatch` es of at most
    ``batch_lines`` lines and (but for one line longer than that) about ``batch_bytes`` of text.

    ``sum(b.n_lines) + refused lines == count_lines(path)``; with ``contains``, ``lines`` holds
    only the lines containing that literal.
    """
    path = Path(path)
    lim = limits.current()
    win = _WINDOW.get()
    if win is not None and win.path == path:
        yield from _window_batches(win, batch_lines, contains, batch_bytes, lim.max_line_bytes)
        return
    small = _small_plain(path, lim.max_line_bytes)
    if small is not None:  # read once: the checks and the lines from the same bytes
        data, scan = small
        if not data:
            return
        rows = max(1, min(batch_lines, batch_bytes // max(scan.longest, 1)))
        # _frame's lines, numbered in the same query
        df = pl.scan_lines(data, name="line", row_index_name="line_no", row_index_offset=1).select(
            pl.col("line_no").cast(pl.Int64), "line").collect()
        yield from _split_batches(df, scan.n_lines, rows, contains)
        return
    _check_text(_head_bytes(path), path)
    scan = None if is_gzip(path) else _scan_plain(path, lim.max_line_bytes)
    if scan is None or not scan.clean or scan.longest > _FAST_MAX_LINE:
        blocks = _raw_blocks(path, min(block_bytes, batch_bytes))
        yield from _lenient_batches(path, blocks, contains, lim.max_line_bytes, batch_lines)
        return
    lf = pl.scan_lines(path, name="line", row_index_name="line_no", row_index_offset=1)
    lf = lf.select(pl.col("line_no").cast(pl.Int64), "line")
    if contains is not None:
        lf = lf.filter(pl.col("line").str.contains(contains, literal=True))
    done = 0  # lines already covered by yielded batches
    rows = max(1, min(batch_lines, batch_bytes // max(scan.longest, 1)))
    try:
        for df in lf.collect_batches(chunk_size=rows):
            if df.height:
                last = int(df["line_no"][-1])
                yield LineBatch(df, last - done)
                done = last
    except pl.exceptions.ComputeError as exc:  # the file changed under us
        raise UnreadableFile(f"{path.name}: {exc}") from exc
    if scan.n_lines > done:
        yield LineBatch(pl.DataFrame(schema=LINE_SCHEMA), scan.n_lines - done)


@dataclass(frozen=True)
class LineWindow:
    """Read only bytes ``[start, end)`` of ``path`` (whole lines: ``start`` is 0 or follows a
    newline, ``end`` follows one), numbering its first line ``first_line_no``: the lines an
    append-only refresh has not read yet (:mod:`analyses.append_ingest`)."""

    path: Path
    start: int
    end: int
    first_line_no: int
    last_line_partial: bool = False  # the window ends with a line that has no newline yet


class WindowUnreadable(UnreadableFile):
    """The window's lines are not plain clean text (invalid UTF-8, NUL bytes, over-long lines):
    the full read handles those through the block reader; the caller reads the whole file."""


_WINDOW: ContextVar[LineWindow | None] = ContextVar("line_window", default=None)


@contextmanager
def line_window(window: LineWindow) -> Iterator[None]:
    """:func:`iter_line_batches` of ``window.path`` gives only the window's lines, within the block."""
    token = _WINDOW.set(window)
    try:
        yield
    finally:
        _WINDOW.reset(token)


def _window_batches(win: LineWindow, batch_lines: int, contains: str | None, batch_bytes: int,
                    max_line_bytes: int) -> Iterator[LineBatch]:
    """The window's lines as the native scanner gives those of a small clean file."""
    with open(win.path, "rb") as fh:
        fh.seek(win.start)
        data = fh.read(win.end - win.start)
    if len(data) != win.end - win.start or (data and not data.endswith(b"\n") and not win.last_line_partial):
        raise WindowUnreadable(f"{win.path.name}: changed while read")
    if not data:
        return
    scan = _scan_blocks([data], max_line_bytes)
    if not scan.clean or scan.longest > _FAST_MAX_LINE:
        raise WindowUnreadable(f"{win.path.name}: appended lines are not clean UTF-8 text")
    rows = max(1, min(batch_lines, batch_bytes // max(scan.longest, 1)))
    df = pl.scan_lines(data, name="line", row_index_name="line_no", row_index_offset=win.first_line_no).select(
        pl.col("line_no").cast(pl.Int64), "line").collect()
    yield from _split_batches(df, win.first_line_no - 1 + scan.n_lines, rows, contains, done=win.first_line_no - 1)


# the most text one batch of small files is split and decoded as (see small_files_lines)
FILES_BATCH_BYTES = 64 << 20


def small_files_lines(paths: list[Path], max_bytes: int = FILES_BATCH_BYTES,
                      given: Sequence[bytes | None] | None = None) -> tuple[pl.DataFrame, list[int]] | None:
    """The lines of several small plain files as one frame ``(_file, line_no, line)`` (``_file``:
    the index into ``paths``; ``line_no`` numbered per file, as :func:`iter_line_batches` numbers
    them), and each file's line count; None unless every file is one whose lines it would give in
    one batch as they are (plain, clean UTF-8 text of at most ``_SMALL_FILE_BYTES``, no NUL, no
    over-long line, ending with a newline) and together they hold at most ``max_bytes``: the caller
    reads them one by one then. One split of all their bytes instead of one per file: a step file
    of 11 KB cost ~1.5 ms to read alone, most of it fixed. ``given``: each file's bytes when the
    caller read it whole already (else None: it is read here)."""
    lim = limits.current()
    datas: list[bytes] = []
    total = 0
    for i, path in enumerate(paths):
        data = _small_bytes(Path(path), None if given is None else given[i])
        if data is None:
            return None
        try:
            _check_text(data[:_TEXT_CHECK_BYTES], path)
        except UnreadableFile:
            return None
        total += len(data)
        if total > max_bytes:
            return None
        datas.append(data)
    if not datas:
        return None
    if any(b"\r" in d or b"\x00" in d or not d.endswith(b"\n") for d in datas):
        # the per-file scan decides (and reads a classic Mac file's \r as line ends)
        got = _scanned_files_lines(datas, lim.max_line_bytes)
    else:
        got = _split_files_lines(datas, lim.max_line_bytes)
    if got is None:
        return None
    lines, counts = got
    if lines.height != sum(counts) or max(counts) > DEFAULT_BATCH_LINES:
        return None
    # each file's index over its lines (every file has one: it ends with a newline), and the
    # lines numbered from 1 within each file
    file_idx = (pl.DataFrame({"_file": range(len(counts)), "n": counts}, schema={"_file": pl.Int64, "n": pl.Int64})
                .select(pl.col("_file").repeat_by("n")).explode("_file").get_column("_file"))
    # a line's number is its row number less the rows of the files before its own (a window
    # over the file index hashed every line: ~40 ms of 32 MB of multi-turn lines)
    before = pl.Series([0, *itertools.accumulate(counts[:-1])], dtype=pl.Int64)
    return lines.select(file_idx, "line").select(
        "_file", (pl.int_range(1, pl.len() + 1, dtype=pl.Int64) - before.gather(file_idx)).alias("line_no"),
        "line"), counts


def _small_bytes(path: Path, data: bytes | None) -> bytes | None:
    """A plain (not gzip) file's bytes when it holds at most ``_SMALL_FILE_BYTES`` (``data``: read
    by the caller already), else None."""
    if data is None:
        try:
            if path.stat().st_size > _SMALL_FILE_BYTES:
                return None
            with open(path, "rb") as fh:
                data = fh.read(_SMALL_FILE_BYTES + 1)
        except OSError:
            return None  # the usual paths report it
    if len(data) > _SMALL_FILE_BYTES or data[:2] == b"\x1f\x8b":
        return None
    return data


_JOIN_BELOW = 1 << 20  # mean file size under which files are joined before their split (a copy of 1 MB: ~0.1 ms)


def _split_files_lines(datas: list[bytes], max_line_bytes: int) -> tuple[pl.DataFrame, list[int]] | None:
    """The lines of files that each end with a newline and hold no ``\\r`` and no NUL byte, split
    first and checked after (what :func:`_small_plain` scans for beforehand, from the lines
    themselves): UTF-8 (the split refuses invalid text; a file ends with a newline, so the files
    are valid UTF-8 each exactly when their concatenation is) and the longest line. A multi-turn
    step file of 3.4 MB was scanned twice byte by byte (newlines, UTF-8) before its split: 2.6 ms
    of CPU a file, ~0.8 s of 1 GB. Each file ends with a newline, so no line spans two: large files
    become views of their own bytes (:func:`_viewed_lines`, which counts each file's lines and
    measures the longest as it finds them); small ones are joined first and split by Polars (a
    source costs Polars ~70 us: 315 step files of 11 KB split in 22 ms of CPU as sources, 7 ms
    joined)."""
    many_small = len(datas) > 1 and sum(len(d) for d in datas) < len(datas) * _JOIN_BELOW
    try:
        if many_small:
            lines = pl.scan_lines(b"".join(datas), name="line").collect()
            size = lines.get_column("line").str.len_bytes().cast(pl.Int64)
            longest = size.max() or 0
            # a line ends (its newline included) at the running sum of its bytes + 1; a file's lines
            # are those ending within its bytes, which end at the running sum of the file sizes
            file_ends = pl.Series([len(d) for d in datas], dtype=pl.Int64).cum_sum()
            upto = (size + 1).cum_sum().search_sorted(file_ends, side="right").to_list()
            counts = [b - a for a, b in zip([0, *upto[:-1]], upto, strict=True)]
        else:
            lines, counts, longest = _viewed_lines(datas)
    except pl.exceptions.ComputeError:  # invalid UTF-8
        return None
    if longest > min(max_line_bytes, _FAST_MAX_LINE) or min(counts) < 1:
        return None
    return lines, counts


def _viewed_lines(datas: list[bytes]) -> tuple[pl.DataFrame, list[int], int]:
    """The lines of files that each end with a newline, as one ``line`` column of string views
    into the files' own bytes: nothing is copied (UTF-8 is checked by the cast to String, which
    raises ComputeError). ``pl.scan_lines`` over the same bytes zeroes a buffer and copies them
    into it: 1 GB of multi-turn step files cost ~180k page faults and ~0.9 s of CPU to split that
    way, ~0.3 s this way. Arrow's view layout: length (int32), then a line of up to 12 bytes
    inline, or its first 4 bytes, the index of its file's buffer and its offset (int32 each).
    Also each file's line count and the longest line's bytes."""
    import numpy as np
    import pyarrow as pa

    cols = np.arange(12)
    parts = []
    longest = 0
    for i, data in enumerate(datas):
        a = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(a == 10)
        starts = np.empty(len(ends), dtype=np.int64)
        starts[:1] = 0
        starts[1:] = ends[:-1] + 1
        lens = ends - starts
        longest = max(longest, int(lens.max(initial=0)))
        v = np.zeros((len(ends), 16), dtype=np.uint8)
        v[:, 0:4] = lens.astype("<i4").view(np.uint8).reshape(-1, 4)
        short = lens <= 12
        long_ = slice(None) if not short.any() else ~short  # lines of JSON are never short
        at = starts[long_]
        v[long_, 4:8] = a[at[:, None] + cols[:4]]
        v[long_, 8:12] = np.array([i], dtype="<i4").view(np.uint8)
        v[long_, 12:16] = at.astype("<i4").view(np.uint8).reshape(-1, 4)
        if short.any():
            at, n = starts[short], lens[short]
            inline = a[np.minimum(at[:, None] + cols, len(a) - 1)]
            inline[cols[None, :] >= n[:, None]] = 0
            v[short, 4:16] = inline
        parts.append(v)
    views = np.concatenate(parts)
    arr = pa.Array.from_buffers(pa.binary_view(), len(views),
                                [None, pa.py_buffer(views), *(pa.py_buffer(d) for d in datas)])
    lines = pl.from_arrow(arr).cast(pl.String).alias("line").to_frame()  # type: ignore[union-attr]
    return lines, [len(p) for p in parts], longest


def _scanned_files_lines(datas: list[bytes], max_line_bytes: int) -> tuple[pl.DataFrame, list[int]] | None:
    """The lines of small files each scanned before the split (see :func:`_small_plain`)."""
    counts: list[int] = []
    parts: list[bytes] = []
    for data in datas:
        scan = _scan_small(data, max_line_bytes)
        if scan is None or not scan[0].endswith(b"\n"):
            return None
        parts.append(scan[0])
        counts.append(scan[1].n_lines)
    lines = pl.scan_lines(b"".join(parts), name="line").collect()
    return lines, counts


def stream_line_frames(
    fh: IO[bytes], name: str, numbered: list[int], batch_lines: int = DEFAULT_BATCH_LINES
) -> Iterator[pl.DataFrame]:
    """The lines of an open binary stream (a tar member) as :func:`line_frames` gives those of a
    file (same rules: invalid UTF-8 replaced, over-long and NUL lines refused), numbered on from
    ``numbered[0]`` (the last number already used), which is advanced past every line."""
    blocks = _stream_blocks(fh, name, DEFAULT_BATCH_BYTES)
    max_line = limits.current().max_line_bytes
    for batch in _lenient_batches(Path(name), blocks, None, max_line, batch_lines, numbered):
        if batch.lines.height:
            yield batch.lines


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
    line without newline), refused lines included. For tests and accounting checks."""
    n = 0
    last = b"\n"
    for data in _raw_blocks(Path(path), DEFAULT_BLOCK_BYTES):
        n += data.count(b"\n")
        last = data[-1:]
    return n + (0 if last == b"\n" else 1)


def looks_binary(head: bytes) -> bool:
    """True when ``head`` (a file's first bytes) is not text: more than 10% of its characters
    are NUL, other control characters than those logs hold, or undecodable bytes. A few NUL or
    undecodable bytes in a log do not make it binary (those lines are refused one by one)."""
    text = head.decode("utf-8", errors="replace")
    if not text:
        return False
    # one pass over the text (a count per character was 27 passes: ~0.35 ms a file, 0.1 s of a
    # run of 315 small step files)
    bad = len(text) - len(text.translate(_DROP_BAD))
    return bad > _MAX_BAD_FRACTION * len(text)


# ---------------------------------------------------------------------------- internals


@dataclass
class _PlainScan:
    n_lines: int
    longest: int  # bytes of the longest line, its newline excluded
    has_nul: bool
    valid_utf8: bool
    max_line_bytes: int

    @property
    def clean(self) -> bool:
        return self.valid_utf8 and not self.has_nul and self.longest <= self.max_line_bytes


def _small_plain(path: Path, max_line_bytes: int, data: bytes | None = None) -> tuple[bytes, _PlainScan] | None:
    """A plain text file of at most ``_SMALL_FILE_BYTES`` that the native scanner may split:
    its bytes and their scan (what :func:`iter_line_batches` checks first, from one read);
    None for any other file (gzip, larger, not clean: the usual paths decide), or raises
    :class:`UnreadableFile` as they would for a file that is not text. ``data``: the file's bytes,
    read whole by the caller (else they are read here)."""
    data = _small_bytes(path, data)
    if data is None:
        return None
    _check_text(data[:_TEXT_CHECK_BYTES], path)
    return _scan_small(data, max_line_bytes)


def _scan_small(data: bytes, max_line_bytes: int) -> tuple[bytes, _PlainScan] | None:
    """A small file's bytes (a classic Mac file's ``\\r`` read as line ends) and their scan; None
    when the native scanner may not split them."""
    data = cr_to_lf(data)
    scan = _scan_blocks([data] if data else [], max_line_bytes)
    if not scan.clean or scan.longest > _FAST_MAX_LINE:
        return None
    return data, scan


def _split_batches(df: pl.DataFrame, n_lines: int, rows: int, contains: str | None, done: int = 0) -> Iterator[LineBatch]:
    """What the native scanner's batches of ``rows`` lines give, from all the lines ``df``
    (``n_lines``: the last line number; ``done``: the line before ``df``'s first)."""
    if contains is not None:
        df = df.filter(pl.col("line").str.contains(contains, literal=True))
    for off in range(0, df.height, rows):
        part = df.slice(off, rows)
        last = int(part["line_no"][-1])
        yield LineBatch(part, last - done)
        done = last
    if n_lines > done:
        yield LineBatch(pl.DataFrame(schema=LINE_SCHEMA), n_lines - done)


def _scan_plain(path: Path, max_line_bytes: int) -> _PlainScan:
    """One byte-level pass over a plain file: line count, longest line, NUL bytes, UTF-8 validity
    (numpy over 8 MiB blocks; memory bounded by a block per thread whatever the lines).

    Nothing is parsed until this pass is done, so a large file is scanned in parts on Polars'
    threads (numpy, the reads and Arrow's UTF-8 check release the GIL): each part starts right
    after a newline, so no line and no character spans two parts and their scans combine
    exactly. On a 300 MB verl log, in a fresh process: 0.18-0.20 s before (one thread, a new block
    per read), 0.11-0.12 s now.
    """
    bounds = _part_bounds(path, min(pl.thread_pool_size(), _MAX_SCAN_PARTS))
    if len(bounds) <= 2:
        return _scan_blocks(_range_blocks(path, 0, bounds[-1]), max_line_bytes)
    ranges = list(zip(bounds, bounds[1:], strict=False))
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="line-scan") as pool:
        parts = list(pool.map(lambda r: _scan_blocks(_range_blocks(path, *r), max_line_bytes), ranges))
    return _PlainScan(
        n_lines=sum(s.n_lines for s in parts),
        longest=max(s.longest for s in parts),
        has_nul=any(s.has_nul for s in parts),
        valid_utf8=all(s.valid_utf8 for s in parts),
        max_line_bytes=max_line_bytes,
    )


_SCAN_BLOCK_BYTES = 8 << 20
_SCAN_PART_MIN_BYTES = 64 << 20  # the smallest part given a thread (a choice: 64 MiB scans in ~0.035 s on one)
_MAX_SCAN_PARTS = 4


def _part_bounds(path: Path, parts: int) -> list[int]:
    """Offsets ``[0, ..., size]`` cutting ``path`` into up to ``parts`` ranges, each cut right
    after the first newline within 1 MiB past an equal share; a share without one is not cut (a
    file of such long lines goes to the block reader anyway), nor is a small file."""
    size = path.stat().st_size
    parts = min(parts, size // _SCAN_PART_MIN_BYTES)
    if parts <= 1:
        return [0, size]
    cuts = [0]
    with open(path, "rb") as fh:
        for i in range(1, parts):
            fh.seek(size * i // parts)
            near = fh.read(1 << 20)
            nl = near.find(b"\n")
            if nl < 0:
                continue
            cut = size * i // parts + nl + 1
            if cut > cuts[-1] and cut < size:
                cuts.append(cut)
    return [*cuts, size]


def _range_blocks(path: Path, start: int, end: int) -> Iterator[bytes | bytearray]:
    """The bytes ``[start, end)`` of a plain file in blocks of at most ``_SCAN_BLOCK_BYTES``.

    Whole blocks are read into one reused buffer, valid until the next block is asked for: a
    fresh 8 MiB block per read page-faults its memory in every time, which in a fresh process
    cost about as much as scanning the block."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            left = end - start
            buf = bytearray(min(_SCAN_BLOCK_BYTES, max(left, 0)))
            while left > 0:
                if left < len(buf):
                    data = fh.read(left)
                    if data:
                        yield data
                    return
                n = fh.readinto(buf)
                if n < len(buf):  # the file shrank: the line scan that follows reports it
                    if n:
                        yield bytes(buf[:n])
                    return
                left -= n
                yield buf
    except OSError as exc:
        raise UnreadableFile(f"{path.name}: {type(exc).__name__}: {exc}") from exc


def _scan_blocks(blocks: Iterable[bytes | bytearray], max_line_bytes: int) -> _PlainScan:
    n_nl, longest, run, has_nul = 0, 0, 0, False
    utf8 = Utf8Check()
    for block in blocks:
        count, first, last, inner = (_newlines_small(block) if len(block) <= _SMALL_SCAN_BYTES
                                     else _newlines_numpy(block))
        if count:
            longest = max(longest, run + first, inner)
            run = len(block) - last - 1
        else:
            run += len(block)
        longest = max(longest, run)
        n_nl += count
        has_nul = has_nul or b"\x00" in block
        utf8.feed(block)
    return _PlainScan(n_nl + (1 if run else 0), longest, has_nul, utf8.valid(), max_line_bytes)


# a block this small is scanned with bytes methods: numpy (~0.1 s to import, most of a small
# ingest's reading) only for the blocks of large files, where it is faster
_SMALL_SCAN_BYTES = 1 << 20


def _newlines_small(block: bytes | bytearray) -> tuple[int, int, int, int]:
    """The block's newline count, first and last newline offsets and longest line between two of
    its newlines (-1 when none), as :func:`_newlines_numpy` gives them."""
    count = block.count(b"\n")
    if not count:
        return 0, -1, -1, -1
    first, last = block.find(b"\n"), block.rfind(b"\n")
    inner = max(map(len, bytes(block[first + 1:last]).split(b"\n"))) if count > 1 else -1
    return count, first, last, inner


def _newlines_numpy(block: bytes | bytearray) -> tuple[int, int, int, int]:
    import numpy as np

    nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
    if not nl.size:
        return 0, -1, -1, -1
    inner = int(np.diff(nl).max()) - 1 if nl.size > 1 else -1
    return int(nl.size), int(nl[0]), int(nl[-1]), inner


class Utf8Check:
    """Whether a stream of byte blocks is valid UTF-8, a block at a time (a character may span two
    blocks). Arrow's validator (a cast of the block, as one binary value, to a string; no copy)
    runs ~25x faster than decoding it with ``codecs``: 12 ms instead of 300 ms for 300 MB of a
    verl log, whose every block holds some non-ASCII text."""

    def __init__(self) -> None:
        self._ok = True
        self._carry = b""  # the start of a character the last block cut (<= 3 bytes)

    def feed(self, block: bytes) -> None:
        if not self._ok or not block:
            return
        data = memoryview(block)
        # the bytes that continue the carried character (a stray continuation byte fails below)
        k0 = 0
        while k0 < min(3, len(data)) and 0x80 <= data[k0] <= 0xBF:
            k0 += 1
        if self._carry or k0:
            head = self._carry + bytes(data[:k0])
            if k0 == len(data) and head[0] >= 0xC0 and len(head) < _seq_len(head[0]):
                self._carry = head  # a block too small to finish the character
                return
            self._ok = _utf8_valid(head)
        # the last character may be cut by the block's end: carried over to the next block
        end = len(data)
        j = end - 1
        while j >= max(k0, end - 3) and 0x80 <= data[j] <= 0xBF:
            j -= 1
        if j >= k0 and data[j] >= 0xC0 and j + _seq_len(data[j]) > end:
            end = j
        self._carry = bytes(data[end:])
        self._ok = self._ok and _utf8_valid(data[k0:end])

    def valid(self) -> bool:
        """The verdict once every block is fed (a character cut by the end of the stream is invalid)."""
        return self._ok and not self._carry


def _seq_len(lead: int) -> int:
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


# Python's decoder checks the first bytes a process validates: ~3 ms a MB against Arrow's 0.04, but
# Arrow's validator costs ~0.45 s of imports (pyarrow.compute) before its first use, which was a
# quarter of an append-only refresh of 1 MB and a tenth of an ingest of 315 small step files
_PY_UTF8_BUDGET = 16 << 20
_py_utf8_left = [_PY_UTF8_BUDGET]


def _utf8_valid(data: bytes | memoryview) -> bool:
    if len(data) == 0:
        return True
    if len(data) <= _py_utf8_left[0]:
        _py_utf8_left[0] -= len(data)
        try:
            codecs.utf_8_decode(data, "strict", True)
        except UnicodeDecodeError:
            return False
        return True
    import numpy as np  # on first use: most commands never validate a plain file
    import pyarrow as pa

    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64).tobytes())
    value = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        value.cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True


def _head_bytes(path: Path) -> bytes:
    for head in _raw_blocks(path, _TEXT_CHECK_BYTES):
        return head
    return b""


def _check_text(head: bytes, path: Path) -> None:
    if looks_binary(head):
        raise UnreadableFile(f"{path.name}: not a text file (mostly NUL, control or invalid UTF-8 bytes)")


def _stream_blocks(fh: IO[bytes], name: str, block_bytes: int) -> Iterator[bytes]:
    try:
        while data := fh.read(block_bytes):
            yield data
    except (OSError, EOFError, zlib.error) as exc:  # a corrupt archive member
        raise UnreadableFile(f"{name}: {type(exc).__name__}: {exc}") from exc


def _raw_blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The file's bytes (decompressed when gzip) in blocks of at most ``block_bytes``; a gzip that
    inflates beyond :meth:`Limits.gzip_cap` raises :class:`UnreadableFile` (a gzip bomb)."""
    gz = is_gzip(path)
    cap = limits.current().gzip_cap(path.stat().st_size) if gz else None
    total = 0
    cr_only = _cr_only(path, gz)
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
            while True:
                data = fh.read(block_bytes)
                if not data:
                    return
                total += len(data)
                if cap is not None and total > cap:
                    raise UnreadableFile(
                        f"{path.name}: gzip inflates beyond {cap} bytes ({limits.current().gzip_max_ratio}x its "
                        "compressed size): refused as a possible gzip bomb"
                    )
                yield data.replace(b"\r", b"\n") if cr_only else data
    except (OSError, EOFError, zlib.error) as exc:  # corrupt or truncated gzip, I/O error
        raise UnreadableFile(f"{path.name}: {type(exc).__name__}: {exc}") from exc


_CR_DECIDE_BYTES = DEFAULT_BLOCK_BYTES  # how much of a file decides whether \r alone ends its lines


def _cr_only(path: Path, gz: bool) -> bool:
    """Whether ``\\r`` alone ends the lines of ``path`` (module rules): its first
    ``_CR_DECIDE_BYTES`` (inflated) hold a ``\\r`` and no ``\\n``. Reads until the first ``\\n``,
    which most files have in their first line. Errors are left to the reading that follows."""
    seen_cr = False
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
            read = 0
            while read < _CR_DECIDE_BYTES:
                data = fh.read(1 << 20)
                if not data or b"\n" in data:
                    break
                seen_cr = seen_cr or b"\r" in data
                read += len(data)
            else:
                return seen_cr
            return seen_cr and not data
    except (OSError, EOFError, zlib.error):
        return False


def cr_to_lf(data: bytes) -> bytes:
    """``data`` with every ``\\r`` read as a line end when it holds ``\\r`` but no ``\\n`` (a classic
    Mac OS file, see the module rules); else ``data`` unchanged."""
    return data.replace(b"\r", b"\n") if b"\n" not in data and b"\r" in data else data


def _frame(data: bytes, first_line_no: int) -> pl.DataFrame:
    """Lines of ``data``: every ``\\n``-terminated line, plus a final unterminated one if any."""
    try:
        lines = pl.scan_lines(data, name="line").collect()
    except pl.exceptions.ComputeError:  # invalid UTF-8 in this block: replace, then split
        lines = pl.scan_lines(data.decode("utf-8", errors="replace").encode("utf-8"), name="line").collect()
    return lines.select(
        pl.int_range(first_line_no, first_line_no + lines.height, dtype=pl.Int64).alias("line_no"), "line"
    )


def _raw_text(data: bytes) -> str:
    return data[: RAW_MAX_CHARS * 4].decode("utf-8", errors="replace").replace("\x00", "\ufffd")[:RAW_MAX_CHARS]


def _lenient_batches(
    path: Path,
    blocks: Iterator[bytes],
    contains: str | None,
    max_line: int,
    batch_lines: int,
    numbered: list[int] | None = None,
) -> Iterator[LineBatch]:
    """Lines of ``blocks`` with over-long lines streamed past: ``pending`` (the unfinished last
    line) never exceeds ``max_line`` plus one block, and a line found longer is refused.
    ``numbered``: ``[last line number used before]``, kept up to date (numbering runs on)."""
    pending = b""
    numbered = [0] if numbered is None else numbered
    next_no = numbered[0] + 1
    skipping: list | None = None  # [line_no, bytes so far, head] of an over-long line being passed

    def emit(data: bytes) -> Iterator[LineBatch]:
        nonlocal next_no
        df = _frame(data, next_no)
        next_no += df.height
        numbered[0] = next_no - 1
        refused = (pl.col("line").str.len_bytes() > max_line) | pl.col("line").str.contains("\x00", literal=True)
        bad = df.filter(refused)
        if bad.height:
            _refuse(path, [
                (no, REASON_TOO_LONG.format(n=n, limit=max_line) if n > max_line else REASON_NUL,
                 head.replace("\x00", "\ufffd"))
                for no, n, head in bad.select(
                    "line_no", pl.col("line").str.len_bytes().alias("n"), pl.col("line").str.slice(0, RAW_MAX_CHARS).alias("head")
                ).iter_rows()
            ])
            df = df.filter(~refused)
        for off in range(0, df.height, batch_lines):
            part = df.slice(off, batch_lines)
            kept = part.filter(pl.col("line").str.contains(contains, literal=True)) if contains is not None else part
            yield LineBatch(kept, part.height)

    def start_skipping(buf: bytes) -> None:
        nonlocal skipping, next_no
        skipping = [next_no, len(buf), buf[: RAW_MAX_CHARS * 4]]
        next_no += 1
        numbered[0] = next_no - 1

    def finish_skipping() -> None:
        nonlocal skipping
        no, n, head = skipping
        _refuse(path, [(no, REASON_TOO_LONG.format(n=n, limit=max_line), _raw_text(head))])
        skipping = None

    for data in blocks:
        if skipping is not None:
            nl = data.find(b"\n")
            if nl < 0:
                skipping[1] += len(data)
                continue
            skipping[1] += nl
            finish_skipping()
            data = data[nl + 1 :]
            if not data:
                continue
        buf = pending + data if pending else data
        cut = buf.rfind(b"\n")
        if cut < 0:  # no newline yet: the line goes on; past the limit it is passed, not held
            pending = b""
            if len(buf) > max_line:
                start_skipping(buf)
            else:
                pending = buf
            continue
        pending = buf[cut + 1 :]
        yield from emit(buf[: cut + 1])
        if len(pending) > max_line:
            start_skipping(pending)
            pending = b""
    if skipping is not None:
        finish_skipping()
    elif pending:  # final line without a newline
        yield from emit(pending)
