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
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from analyses.append_state import ends_with_newline, file_state
from analyses.ingest_files import (
    DETECT,
    PATH_TABLES,
    FileReport,
    ProgressFn,
    file_done,
    file_sha256,
    ingest_file,
    set_status,
)
from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import FileContext, FilesChunk, Reader, ReaderBase, is_gzip, read_head
from analyses.readers.lines import SMALL_FILE_BYTES
from analyses.readers.typed_jsonl import FILE_COLUMN
from analyses.steps import StepsAccumulator
from analyses.warehouse import RunStaging

GROUP_BYTES = 64 << 20  # a batch holds at most this much of its files' text
_SPLIT_FROM = 4  # a batch that cannot be read together is halved down to this many files, then read file by file


@dataclass
class _Pending:
    """A file detection found a batch-reading reader for, not read yet."""

    idx: int
    path: Path
    rel: str
    reader: Reader
    before: os.stat_result
    sha256: str
    ctx: FileContext


def ingest_files(files: list[tuple[int, Path, str]], run_id: str, manifest: RunManifest, staging: RunStaging,
                 steps_acc: StepsAccumulator, emit: ProgressFn, run_files: frozenset[Path],
                 after_each: Callable[[], None] = lambda: None) -> list[FileReport]:
    """Each of ``files`` (index, path, path relative to the run) read into ``staging``, its report
    in order; ``after_each`` runs after each file or batch."""
    out: list[FileReport] = []
    group: list[_Pending] = []
    size = [0]  # of the group's files

    def flush() -> None:
        if group:
            out.extend(_read_group(group, run_id, manifest, staging, steps_acc, emit, run_files))
            group.clear()
            size[0] = 0
            after_each()

    for idx, path, rel in files:
        pend, reader = _batchable(idx, path, rel, run_id, manifest, run_files)
        if pend is None:
            flush()
            out.append(ingest_file(idx, path, rel, run_id, manifest, staging, steps_acc, emit, run_files, reader))
            after_each()
            continue
        if group and (group[0].reader is not pend.reader or size[0] + pend.before.st_size > GROUP_BYTES):
            flush()
        group.append(pend)
        size[0] += pend.before.st_size
    flush()
    return out


def _batchable(idx: int, path: Path, rel: str, run_id: str, manifest: RunManifest,
               run_files: frozenset[Path]) -> tuple[_Pending | None, Reader | None | object]:
    """The file as a batch member, or None and its reader when detection ran (else DETECT)."""
    try:
        before = path.stat()
        if not 0 < before.st_size <= SMALL_FILE_BYTES or is_gzip(path) or not ends_with_newline(path, before.st_size):
            return None, DETECT  # (a last line without newline: ingest_file keeps its place for an append)
        reader = detect(path, read_head(path))
        if reader is None or type(reader).read_many is ReaderBase.read_many:
            return None, reader
        sha = file_sha256(path, before.st_size)
    except Exception:  # noqa: BLE001 - ingest_file reads it alone and reports what is wrong with it
        return None, DETECT
    ctx = FileContext(run_id=run_id, path=path, rel_path=rel, manifest=manifest, run_files=run_files)
    return _Pending(idx, path, rel, reader, before, sha, ctx), reader


def _read_group(group: list[_Pending], run_id: str, manifest: RunManifest, staging: RunStaging,
                steps_acc: StepsAccumulator, emit: ProgressFn, run_files: frozenset[Path]) -> list[FileReport]:
    got: FilesChunk | None = None
    if len(group) > 1:
        try:
            got = group[0].reader.read_many([g.ctx for g in group])  # type: ignore[attr-defined]
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException:  # noqa: BLE001 - (a polars panic too) read one by one: each file's error is its own
            got = None
    if got is not None and not any(t in got.tables for t in ("step_metrics", "gpu_samples")):  # deduplicated per file
        return _stage_group(group, got, staging, emit)
    if got is None and len(group) >= _SPLIT_FROM:  # one file with a bad line: its half is read apart
        mid = len(group) // 2
        return (_read_group(group[:mid], run_id, manifest, staging, steps_acc, emit, run_files)
                + _read_group(group[mid:], run_id, manifest, staging, steps_acc, emit, run_files))
    return [ingest_file(g.idx, g.path, g.rel, run_id, manifest, staging, steps_acc, emit, run_files, g.reader)
            for g in group]


def _stage_group(group: list[_Pending], got: FilesChunk, staging: RunStaging, emit: ProgressFn) -> list[FileReport]:
    """Stage a batch's rows as one part per table (under the first file's prefix: the parts of the
    files after it sort after it) and give each file its report."""
    t0 = time.perf_counter()
    n = len(group)
    rels = pl.Series([g.rel for g in group], dtype=pl.String)
    prefix = f"f{group[0].idx:05d}"
    rows_out = np.zeros(n, dtype=np.int64)
    tables: list[set[str]] = [set() for _ in group]
    for table, df in got.tables.items():
        if df.height == 0:
            continue
        per = np.bincount(df.get_column(FILE_COLUMN).to_numpy(), minlength=n)
        rows_out += per
        for i in np.flatnonzero(per):
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
    staging.seal(prefix)
    share = (time.perf_counter() - t0) / n
    out = []
    for i, g in enumerate(group):
        emit("file_start", {"path": g.rel, "bytes": g.before.st_size})
        t = time.perf_counter() - share
        fr = FileReport(path=g.rel, format=g.reader.name, bytes=g.before.st_size, lines=got.lines[i],
                        rows_ok=got.rows_ok[i], rows_rejected=got.rows_rejected[i], rows_skipped=got.rows_skipped[i],
                        rows_out=int(rows_out[i]), sha256=g.sha256)
        fr.tables = tables[i]
        fr.first_reason = first_reason[i]
        emit("file_progress", {"path": g.rel, "lines": fr.lines, "rows": fr.rows_out})
        set_status(fr, first_reason[i])
        fr.state = file_state(g.path, fr, g.before, g.reader)
        out.append(file_done(fr, t, emit))
    return out
