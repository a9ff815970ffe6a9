"""What a reader is: it sniffs a file's head, then streams the file as chunks of table rows.

A reader never holds more than a chunk (or, for whole-document formats, one file) in memory.
Each chunk says how many input lines it consumed and how each was accounted for, so that
``rows_ok + rows_rejected + rows_skipped == lines`` holds for every file.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

import polars as pl

from analyses.manifest import RunManifest
from analyses.schema import RAW_MAX_CHARS

if TYPE_CHECKING:
    from analyses.steps import ChunkSummary

SNIFF_BYTES = 64 * 1024
_HEAD_FEED = 8 * 1024  # compressed bytes per decompress call while reading a gzip head


@dataclass
class FileContext:
    """Everything a reader may know about the file it reads."""

    run_id: str
    path: Path  # absolute path of the file
    rel_path: str  # path as recorded in source_files / rejects
    manifest: RunManifest
    # every file this ingest reads for the run (absolute paths): what a reader may compare the
    # file with; a file beside it on disk that is not one of them is not the run's business
    run_files: frozenset[Path] = frozenset()
    # the file's bytes when the ingest has read it whole already (a small file, read once for its
    # detection, hash and lines): a reader of several files at once uses them instead of opening it
    data: bytes | None = field(default=None, repr=False)


@dataclass
class Chunk:
    """Rows for some tables from a contiguous part of one file, plus its line accounting.

    ``tables`` maps a table name to a frame with any subset of that table's columns (the
    ingest conforms it). ``step_attrs`` has what a reader saw of each step besides its metrics
    (any of ``step``, ``ts``, ``truncated_line``); the ingest merges it into ``steps``.
    ``rejects`` has columns ``line_no, reason, raw``. ``step_summary``: optionally, what the
    ingest's steps accumulator keeps of ``tables["step_metrics"]``
    (:func:`analyses.steps.summarize_chunk`), worked out on the reader's own thread.
    """

    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    step_attrs: pl.DataFrame | None = None
    rejects: pl.DataFrame | None = None
    lines: int = 0
    rows_ok: int = 0
    rows_rejected: int = 0
    rows_skipped: int = 0
    step_summary: ChunkSummary | None = None


@dataclass
class FilesChunk:
    """What :meth:`ReaderBase.read_many` gives for several whole files at once: ``tables`` and
    ``rejects`` as in :class:`Chunk`, each row with ``_file`` (the index of its file among those
    given), and per file its lines, parsed, rejected and skipped lines."""

    tables: dict[str, pl.DataFrame]
    rejects: pl.DataFrame
    lines: list[int]
    rows_ok: list[int]
    rows_rejected: list[int]
    rows_skipped: list[int]


# How exactly a reader records step metrics, best first. When two files of a run carry the same
# step metric (a wandb run directory holds the binary history and the console capture), the copy
# from the more exact source is kept; between files of one kind the last in (path, line) order.
METRIC_SOURCE_BINARY = 0  # float64 as logged (wandb history records)
METRIC_SOURCE_STRUCTURED = 1  # JSON numbers
METRIC_SOURCE_TEXT = 2  # console text, printed with rounding


class Reader(Protocol):
    """A raw format. ``name`` is what ``source_files.format`` records; ``metric_source`` says how
    exactly its step metrics are recorded (one of the ``METRIC_SOURCE_*``)."""

    name: str
    metric_source: int

    def sniff(self, head: str, path: Path) -> bool:
        """True when ``head`` (the first 64 KiB, decoded leniently) looks like this format."""
        ...

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        """Stream the file as chunks. Raise only when the file as a whole is unusable."""
        ...


class ReaderBase:
    """Defaults every reader shares; a reader subclasses it and sets ``name``."""

    name: str = ""
    metric_source: int = METRIC_SOURCE_TEXT
    # literals of the lines that show this format, for a second look past the head of a file
    # whose head matched nothing (see analyses.readers.late_sniff); empty: no second look
    late_sniff: tuple[str, ...] = ()
    # the training framework whose logs this format is (runs.framework when run.toml does not say);
    # None: a format several frameworks write (wandb, TensorBoard, telemetry, PolyTrace logs)
    framework: str | None = None
    # every line is parsed on its own (no header, no state carried from line to line, no record
    # spanning lines, nothing read but its lines through analyses.readers.lines): the rows of lines
    # [a, b) of a file are what a full read gives for them, so an append-only refresh may read
    # only the appended lines (analyses.append_ingest)
    resumable: bool = False
    # what it reads from a file depends on the run's other files (FileContext.run_files): a file
    # added to the run can change it, so an append-only refresh does not take new files then
    reads_siblings: bool = False

    def read_many(self, ctxs: list[FileContext]) -> FilesChunk | None:
        """All of several small files of this format at once, the rows :meth:`read` gives for
        each (a run of hundreds of small step files paid a fixed cost per file); None when it
        cannot (the default, or a file it would reject lines of): they are read one by one."""
        return None


class UnreadableFile(Exception):
    """The file as a whole cannot be read (binary, wrong encoding, truncated archive, ...)."""


def rejects_frame(line_no: pl.Series | list[int], reason: pl.Series | list[str] | str, raw: pl.Series | list[str]) -> pl.DataFrame:
    """Build a rejects frame, truncating ``raw`` to the contract's length (and a reason quoting
    its input to the same)."""
    n = len(line_no)
    reasons = pl.Series("reason", [reason] * n, dtype=pl.String) if isinstance(reason, str) else pl.Series("reason", reason, dtype=pl.String)
    reasons = reasons.str.slice(0, RAW_MAX_CHARS)
    return pl.DataFrame(
        {
            "line_no": pl.Series("line_no", line_no, dtype=pl.Int64),
            "reason": reasons,
            "raw": pl.Series("raw", raw, dtype=pl.String).str.slice(0, RAW_MAX_CHARS),
        }
    )


def accounted_chunk(
    n_lines: int, table: str, rows: pl.DataFrame | None, bad: pl.DataFrame | None, skipped: int, reason_col: str = "reason"
) -> Chunk:
    """A chunk of ``n_lines`` lines: ``bad`` (line_no, reason, line) rejected, ``skipped`` skipped,
    every other line parsed into ``rows`` of ``table``."""
    n_bad = 0 if bad is None else bad.height
    return Chunk(
        tables={table: rows} if rows is not None and rows.height else {},
        rejects=rejects_frame(bad["line_no"], bad[reason_col], bad["line"]) if n_bad else None,
        lines=n_lines,
        rows_ok=n_lines - n_bad - skipped,
        rows_rejected=n_bad,
        rows_skipped=skipped,
    )


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def read_head(path: Path, n: int = SNIFF_BYTES) -> str:
    """The first ``n`` bytes of a (possibly gzipped) file as text, undecodable bytes replaced.

    A gzip stream cut (or corrupt) before ``n`` bytes gives what decompressed before the cut, so
    a reader that keeps the complete part of a cut file (Kineto traces) still gets to sniff it;
    only a gzip of which nothing decompresses is unreadable.
    """
    try:
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                fh.seek(0)
                return fh.read(n).decode("utf-8", errors="replace")
            fh.seek(0)
            data = _gunzip_head(fh, n)
    except OSError as exc:
        raise UnreadableFile(f"cannot read head: {exc}") from exc
    return data.decode("utf-8", errors="replace")


def _gunzip_head(fh: BinaryIO, n: int) -> bytes:
    d = zlib.decompressobj(wbits=31)
    out = bytearray()
    raw, ended = b"", False  # ended: some gzip member was complete
    try:
        while len(out) < n:
            raw = raw or fh.read(_HEAD_FEED)
            if not raw:
                break
            out += d.decompress(raw)
            raw = b""
            if d.eof:  # end of a member: another may follow (concatenated gzip)
                raw, d, ended = d.unused_data, zlib.decompressobj(wbits=31), True
    except zlib.error as exc:  # corrupt data (or padding after the last member)
        if not out and not ended:
            raise UnreadableFile(f"cannot read head: corrupt gzip: {exc}") from exc
    if not out and not ended:
        raise UnreadableFile("cannot read head: gzip stream cut before any data")
    return bytes(out[:n])


EPOCH_ABS_MAX = 1e17  # any plausible epoch in s, ms or µs is far below; epoch_to_ts's Int64 cast is not


def epoch_in_range(x: pl.Expr) -> pl.Expr:
    """``x`` as Float64 where :func:`analyses.telemetry_units.epoch_to_ts` can convert it (finite,
    ``|x| < EPOCH_ABS_MAX``), else null: an absurd number (``1e30``, ``inf``, ``nan``) then gives a
    null timestamp, so its line is rejected, instead of a failed strict cast that fails the file."""
    x = x.cast(pl.Float64, strict=False)
    return pl.when(x.is_finite() & (x.abs() < EPOCH_ABS_MAX)).then(x)
