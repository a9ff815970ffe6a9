"""A run's files read in order, consecutive small files of one format together.

A PolyTrace v2 run is often hundreds of step files of a few KB (315 packed step files, 3.5 MB in
all). Read one by one, each paid the fixed cost of a read (a dozen Polars collects, a DuckDB or
``json`` decode, a Parquet part written and sealed): ~20 ms a file, 30x a plain ``json.loads``
loop over them. Here consecutive files that one reader can read together
(:meth:`analyses.readers.base.ReaderBase.read_many`: each a small plain file its fast decode
proves good) are decoded as one batch, staged as one part per table and sealed once; every file
still gets its own ``source_files`` row, status, hash and append state, its rows their ``path``
and line numbers, exactly as :func:`analyses.ingest_files.ingest_file` gives them. Anything else
(another format, a large, gzip or empty file, a file with a line to reject, an error) is read one
by one as before, so each bad line and bad file is reported with its own reason.

Multi-turn step files are 3-4 MB each (1 GB is ~300 of them): read one by one on one core they
were 0.1x DuckDB ``read_json`` of the same files. Batches are read ahead on two threads while
the batch before is staged, and consecutive batches append to one part file per table, which the
commit moves instead of rewriting (about 40% less CPU for 1 GB, both cores busy).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from analyses.append_state import file_state
from analyses.ingest_files import (
    DETECT,
    PATH_TABLES,
    FileReport,
    ProgressFn,
    bytes_sha256,
    file_done,
    file_sha256,
    ingest_file,
    set_status,
)
from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import SNIFF_BYTES, FileContext, FilesChunk, Reader, ReaderBase
from analyses.readers.lines import FILES_BATCH_BYTES, SMALL_FILE_BYTES
from analyses.readers.typed_jsonl import FILE_COLUMN, rows_per_file
from analyses.steps import StepsAccumulator
from analyses.warehouse import RunStaging

# a batch holds at most this much of its files' text: as much as one split takes. A batch has a
# fixed cost (~15 ms of CPU: a DuckDB query, ~25 Polars collects, a row group per table), so 1 GB
# of multi-turn step files read in batches of 32 MB took ~5% longer than in batches of 64 MB (3
# batches in flight: peak RSS ~440 MB, ~560 MB now)
GROUP_BYTES = FILES_BATCH_BYTES
_SPLIT_FROM = 4  # a batch that cannot be read together is halved down to this many files, then read file by file


@dataclass
class _Pending:
    """A file detection found a batch-reading reader for, not read yet."""

    idx: int
    path: Path
    rel: str
    reader: Reader
    before: os.stat_result
    sha256: str  # "" until hashed (when sniffed, for a file read whole; else on the read-ahead thread)
    ctx: FileContext


def ingest_files(files: list[tuple[int, Path, str]], run_id: str, manifest: RunManifest, staging: RunStaging,
                 steps_acc: StepsAccumulator, emit: ProgressFn, run_files: frozenset[Path],
                 after_each: Callable[[], None] = lambda: None,
                 meanwhile: Callable[[], None] | None = None) -> list[FileReport]:
    """Each of ``files`` (index, path, path relative to the run) read into ``staging``, its report
    in order; ``after_each`` runs after each file or batch. ``meanwhile`` runs once, the first
    time this thread would wait for a batch being read: work that holds the GIL (imports) costs
    next to nothing there, beside a decode that does not (a run of small files is one batch, and
    this thread waited ~0.1 s for it).

    Batches are read ahead on :data:`READ_AHEAD` threads (hash, line split, DuckDB and Polars
    decode free the GIL) while this thread stages the batch before; reports, progress events
    and the staging of each batch stay in file order."""
    out: list[FileReport] = []
    group: list[_Pending] = []
    size = [0]  # of the group's files
    reading: deque[tuple[list[_Pending], Future[FilesChunk | None]]] = deque()
    part: list[str | None] = [None]  # the prefix the batches staged since the last other file go on
    idle = [meanwhile]

    def end_part() -> None:
        if part[0] is not None:
            staging.seal(part[0])
            part[0] = None

    def settle(keep: int) -> None:
        """Stage the oldest batches read ahead until at most ``keep`` are in flight."""
        while len(reading) > keep:
            batch, fut = reading.popleft()
            if idle[0] is not None and not fut.done():
                idle[0]()
                idle[0] = None
            got = fut.result()
            if _stageable(got):
                part[0] = part[0] or f"f{batch[0].idx:05d}"
                out.extend(_stage_group(batch, got, staging, emit, part[0]))  # type: ignore[arg-type]
            else:  # read file by file, each under its own prefix: what was staged before is sealed
                end_part()
                out.extend(_read_group(batch, run_id, manifest, staging, steps_acc, emit, run_files, got))
            after_each()

    def flush() -> None:
        if group:
            batch = list(group)
            reading.append((batch, _read_pool().submit(_read_ahead, batch)))
            group.clear()
            size[0] = 0
            settle(READ_AHEAD)

    for idx, path, rel in files:
        pend, reader = _batchable(idx, path, rel, run_id, manifest, run_files)
        if pend is None:
            flush()
            settle(0)
            end_part()
            out.append(ingest_file(idx, path, rel, run_id, manifest, staging, steps_acc, emit, run_files, reader))
            after_each()
            continue
        if group and (group[0].reader is not pend.reader or size[0] + pend.before.st_size > GROUP_BYTES):
            flush()
        group.append(pend)
        size[0] += pend.before.st_size
    flush()
    settle(0)
    end_part()
    return out


READ_AHEAD = 2  # batches read at once, beside the one being staged (the machine has 2 cores)
_READ_POOL: ThreadPoolExecutor | None = None


def _read_pool() -> ThreadPoolExecutor:
    global _READ_POOL
    if _READ_POOL is None:
        _READ_POOL = ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="read-ahead")
    return _READ_POOL


def _batchable(idx: int, path: Path, rel: str, run_id: str, manifest: RunManifest,
               run_files: frozenset[Path]) -> tuple[_Pending | None, Reader | None | object]:
    """The file as a batch member, or None and its reader when detection ran (else DETECT)."""
    try:
        with open(path, "rb") as fh:  # one read: a file within the sniffed head is kept whole
            before = os.fstat(fh.fileno())
            if not 0 < before.st_size <= SMALL_FILE_BYTES:
                return None, DETECT
            head = fh.read(SNIFF_BYTES)
            if len(head) < before.st_size:
                fh.seek(before.st_size - 1)
                last = fh.read(1)
            else:
                last = head[before.st_size - 1:before.st_size]
        if head[:2] == b"\x1f\x8b" or last != b"\n":
            return None, DETECT  # (a last line without newline: ingest_file keeps its place for an append)
        reader = detect(path, head.decode("utf-8", errors="replace"))
        if reader is None or type(reader).read_many is ReaderBase.read_many:
            return None, reader
    except Exception:  # noqa: BLE001 - ingest_file reads it alone and reports what is wrong with it
        return None, DETECT
    whole = head if len(head) == before.st_size else None
    ctx = FileContext(run_id=run_id, path=path, rel_path=rel, manifest=manifest, run_files=run_files, data=whole)
    # a file read whole is hashed here, not on the read-ahead thread: a few microseconds each,
    # but three GIL releases each there, and each let this thread (importing, staging) hold the
    # GIL for its switch interval: 315 step files took ~25 ms to hash there, ~3 ms here
    sha = bytes_sha256(whole) if whole is not None else ""
    return _Pending(idx, path, rel, reader, before, sha, ctx), reader


def _read_ahead(group: list[_Pending]) -> FilesChunk | None:
    """On a read-ahead thread: the sha256 of each file not hashed when sniffed, then the batch
    read at once (None: it cannot be, see :func:`_read_group`)."""
    try:  # one file too: its rows go on the part of the batches around it (one part, moved at the commit)
        ctxs = []
        for g in group:
            if g.sha256:  # read whole and hashed when sniffed
                ctxs.append(g.ctx)
                continue
            data = g.ctx.data if g.ctx.data is not None else _read_whole(g)
            if data is None:
                g.sha256 = file_sha256(g.path, g.before.st_size)
                ctxs.append(g.ctx)
                continue
            g.sha256 = bytes_sha256(data if len(data) == g.before.st_size else data[:g.before.st_size])
            ctxs.append(replace(g.ctx, data=data))
        # each file read once for its hash and its lines (the bytes go with the batch: kept only
        # by the files whose head held all of them, as before)
        return group[0].reader.read_many(ctxs)  # type: ignore[attr-defined]
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException:  # noqa: BLE001 - (a polars panic too) read one by one: each file's error is its own
        pass
    return None


def _read_whole(g: _Pending) -> bytes | None:
    """The file's bytes as the batch's line split reads them (up to one byte past the largest
    small file), or None when they are not the ``before.st_size`` bytes its hash covers (it grew
    past that or shrank: hashed from the file as before, and the batch decides)."""
    with open(g.path, "rb") as fh:
        data = fh.read(SMALL_FILE_BYTES + 1)
    return data if len(data) >= g.before.st_size else None


def _read_group(group: list[_Pending], run_id: str, manifest: RunManifest, staging: RunStaging,
                steps_acc: StepsAccumulator, emit: ProgressFn, run_files: frozenset[Path],
                got: FilesChunk | None | object = DETECT) -> list[FileReport]:
    """``got``: the batch as :func:`_read_ahead` read it (by default it is read here)."""
    if got is DETECT:
        got = _read_ahead(group)
    if _stageable(got):
        return _stage_group(group, got, staging, emit)  # type: ignore[arg-type]
    if got is None and len(group) >= _SPLIT_FROM:  # one file with a bad line: its half is read apart
        mid = len(group) // 2
        return (_read_group(group[:mid], run_id, manifest, staging, steps_acc, emit, run_files)
                + _read_group(group[mid:], run_id, manifest, staging, steps_acc, emit, run_files))
    return [ingest_file(g.idx, g.path, g.rel, run_id, manifest, staging, steps_acc, emit, run_files, g.reader)
            for g in group]


def _stageable(got: object) -> bool:
    """A batch read at once that is staged as one (tables deduplicated per file are not)."""
    return isinstance(got, FilesChunk) and not any(t in got.tables for t in ("step_metrics", "gpu_samples"))


def _stage_group(group: list[_Pending], got: FilesChunk, staging: RunStaging, emit: ProgressFn,
                 part: str | None = None) -> list[FileReport]:
    """Stage a batch's rows as one part per table (under the first file's prefix: the parts of the
    files after it sort after it) and give each file its report. ``part``: the prefix of the
    batches just before, which the caller seals: their part files go on (one file per table for
    a run of many batches, which the commit moves instead of rewriting)."""
    t0 = time.perf_counter()
    n = len(group)
    rels = pl.Series([g.rel for g in group], dtype=pl.String)
    prefix = part or f"f{group[0].idx:05d}"
    rows_out = [0] * n
    tables: list[set[str]] = [set() for _ in group]
    for table, df in got.tables.items():
        if df.height == 0:
            continue
        for i, k in enumerate(rows_per_file(df.get_column(FILE_COLUMN), n)):
            if k:
                rows_out[i] += k
                tables[i].add(table)
        if table in PATH_TABLES:
            df = df.with_columns(path=rels.gather(df.get_column(FILE_COLUMN)))
        staging.append(table, df.drop(FILE_COLUMN), prefix)
    first_reason: list[str | None] = [None] * n
    if got.rejects.height:
        rej = got.rejects.with_columns(path=rels.gather(got.rejects.get_column(FILE_COLUMN)))
        staging.append("rejects", rej.drop(FILE_COLUMN), prefix)
        firsts = rej.group_by(FILE_COLUMN, maintain_order=True).agg(pl.col("reason").first())
        for i, reason in firsts.iter_rows():
            first_reason[i] = reason
            tables[i].add("rejects")
    if part is None:
        staging.seal(prefix)
    share = (time.perf_counter() - t0) / n
    out = []
    for i, g in enumerate(group):
        emit("file_start", {"path": g.rel, "bytes": g.before.st_size})
        t = time.perf_counter() - share
        fr = FileReport(path=g.rel, format=g.reader.name, bytes=g.before.st_size, lines=got.lines[i],
                        rows_ok=got.rows_ok[i], rows_rejected=got.rows_rejected[i], rows_skipped=got.rows_skipped[i],
                        rows_out=rows_out[i], sha256=g.sha256)
        fr.tables = tables[i]
        fr.first_reason = first_reason[i]
        emit("file_progress", {"path": g.rel, "lines": fr.lines, "rows": fr.rows_out})
        set_status(fr, first_reason[i])
        fr.state = file_state(g.path, fr, g.before, g.reader, g.ctx.data)
        out.append(file_done(fr, t, emit))
    return out
