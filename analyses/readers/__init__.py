"""Readers, one module per raw format, and format detection by content sniffing.

Order matters: specific formats are tried before general ones (a PolyTrace v2 file is also
JSONL; a wandb history CSV is also a CSV). The first reader whose ``sniff`` accepts the head
of a file reads it.

A console capture need not show its format in its head: a wandb ``output.log`` of a verl run
can open with megabytes of reward-function debug prints before the first ``step:`` line. So
when no reader accepts the head of a file that looks like text, a second look streams the file
(at most :data:`analyses.readers.late_sniff.LATE_SNIFF_MAX_BYTES`) block by block and offers
the lines of each block that hold a reader's signature literals to the readers that declare
them (``late_sniff``: the low-priority console formats), in the same order; see
:mod:`analyses.readers.late_sniff`.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, Reader, read_head, rejects_frame
from analyses.readers.late_sniff import late_detect
from analyses.readers.lines import collect_refused


@dataclass(frozen=True)
class ReaderSpec:
    """One format's reader as the registry declares it: ``target`` (``module:Class``) and,
    optionally, ``head``: a literal every head the reader's ``sniff`` accepts holds (a necessary
    condition, never a sufficient one). A head without it is not that format, so detection asks
    the next reader without importing the module (the reader modules a small ingest never needs
    were ~5% of its instructions); a head with it is offered to ``sniff`` as before. A literal,
    not a pattern, and ``within`` the head's first characters when the format puts it there: it
    is looked for in every head of every file. tests/test_detect_signatures.py holds the rule over
    every fixture and real log."""

    target: str
    head: str | None = None
    within: int | None = None

    def admits(self, head: str) -> bool:
        """False only when ``head`` cannot be this format (the literal is absent)."""
        return self.head is None or self.head in (head if self.within is None else head[:self.within])


# most specific first
READER_SPECS: tuple[ReaderSpec, ...] = (
    ReaderSpec("analyses.readers.kineto:KinetoTraceReader", '"traceEvents"'),
    ReaderSpec("analyses.readers.wandb_offline:WandbOfflineReader", ":W&B", within=4),
    ReaderSpec("analyses.readers.tb_events:TensorBoardReader", "brain.Event:", within=64),
    ReaderSpec("analyses.readers.trl_trainer_state:TrainerStateReader", '"log_history"'),
    ReaderSpec("analyses.readers.polytrace_v2:PackedLengthsReader"),
    ReaderSpec("analyses.readers.polytrace_v2:RewardTimingsReader"),
    ReaderSpec("analyses.readers.polytrace_v2:MultiturnWorkloadReader"),
    ReaderSpec("analyses.readers.polytrace_v2:DapoFilterReader"),
    ReaderSpec("analyses.readers.polytrace_v1:PolyTraceV1Reader"),
    ReaderSpec("analyses.readers.verl_rollout:VerlRolloutDumpReader"),
    ReaderSpec("analyses.readers.verl_jsonl:VerlFileLoggerReader"),
    ReaderSpec("analyses.readers.prometheus:PrometheusTextReader"),
    ReaderSpec("analyses.readers.prometheus:PrometheusRangeJsonReader"),
    ReaderSpec("analyses.readers.nvidia_smi:NvidiaSmiCsvReader"),
    ReaderSpec("analyses.readers.nvidia_smi:NvidiaSmiDmonReader"),
    ReaderSpec("analyses.readers.worker_times:WorkerTimesReader"),
    ReaderSpec("analyses.readers.cluster_util:ClusterUtilLongReader"),
    ReaderSpec("analyses.readers.cluster_util:ClusterUtilWideReader"),
    ReaderSpec("analyses.readers.kaggle_log:KaggleLogReader"),
    ReaderSpec("analyses.readers.metrics_export:MetricsJsonlReader"),
    ReaderSpec("analyses.readers.metrics_export:MetricsCsvReader"),
    ReaderSpec("analyses.readers.trl_console:TrlConsoleReader"),
    ReaderSpec("analyses.readers.verl_console:VerlConsoleReader"),
)

# one instance per spec, made when first needed (detection compares readers by identity)
_loaded: list[Reader | None] = [None] * len(READER_SPECS)
_load_lock = threading.Lock()


def _reader(i: int) -> Reader:
    r = _loaded[i]
    if r is None:
        with _load_lock:
            r = _loaded[i]
            if r is None:
                mod_name, cls_name = READER_SPECS[i].target.split(":")
                r = _loaded[i] = getattr(importlib.import_module(mod_name), cls_name)()
    return r


def all_readers() -> list[Reader]:
    """Instances of every available reader, in sniffing order (every reader module imported)."""
    return [_reader(i) for i in range(len(READER_SPECS))]


def detect(path: Path, head: str | None = None) -> Reader | None:
    """The reader for ``path`` by content, or None when no reader recognizes it: the head first
    (a reader whose declared signature the head lacks is passed over unimported), then, for a
    text file, a bounded second look for a late console format."""
    text = read_head(path) if head is None else head
    found = detect_head(text, path)
    return found if found is not None else late_detect(path, text, [r for r in all_readers() if r.late_sniff])


def detect_head(head: str, path: Path) -> Reader | None:
    """The first reader, in registry order, whose ``sniff`` accepts ``head`` (readers whose
    declared signature ``head`` lacks are passed over, unimported)."""
    for i, spec in enumerate(READER_SPECS):
        if spec.admits(head):
            r = _reader(i)
            if r.sniff(head, path):
                return r
    return None


def reader_by_name(name: str) -> Reader:
    """The reader whose ``name`` is ``name`` (those imported already are asked first; names are unique)."""
    for r in _loaded:
        if r is not None and r.name == name:
            return r
    for r in all_readers():
        if r.name == name:
            return r
    raise KeyError(name)


def read_file(reader: Reader, ctx: FileContext) -> Iterator[Chunk]:
    """``reader.read(ctx)``, plus the lines the line layer refused before the reader saw them
    (longer than the line limit, NUL bytes: see :mod:`analyses.readers.lines`), added to the
    chunks as rejected lines with their reasons. Every caller that accounts for a file's lines
    reads it through here."""
    with collect_refused() as refused:
        for chunk in reader.read(ctx):
            yield _with_refused(chunk, refused.drain())
        rest = refused.drain()
        if rest:
            yield _with_refused(Chunk(), rest)


def _with_refused(chunk: Chunk, rows: list[tuple[int, str, str]]) -> Chunk:
    if not rows:
        return chunk
    rej = rejects_frame([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    chunk.rejects = rej if chunk.rejects is None else pl.concat([chunk.rejects, rej], how="vertical_relaxed")
    chunk.lines += len(rows)
    chunk.rows_rejected += len(rows)
    return chunk
