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
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, Reader, read_head, rejects_frame
from analyses.readers.late_sniff import late_detect
from analyses.readers.lines import collect_refused

# module:class, most specific first
READER_SPECS: tuple[str, ...] = (
    "analyses.readers.kineto:KinetoTraceReader",
    "analyses.readers.wandb_offline:WandbOfflineReader",
    "analyses.readers.tb_events:TensorBoardReader",
    "analyses.readers.trl_trainer_state:TrainerStateReader",
    "analyses.readers.polytrace_v2:PackedLengthsReader",
    "analyses.readers.polytrace_v2:RewardTimingsReader",
    "analyses.readers.polytrace_v2:MultiturnWorkloadReader",
    "analyses.readers.polytrace_v2:DapoFilterReader",
    "analyses.readers.polytrace_v1:PolyTraceV1Reader",
    "analyses.readers.verl_rollout:VerlRolloutDumpReader",
    "analyses.readers.verl_jsonl:VerlFileLoggerReader",
    "analyses.readers.prometheus:PrometheusTextReader",
    "analyses.readers.prometheus:PrometheusRangeJsonReader",
    "analyses.readers.nvidia_smi:NvidiaSmiCsvReader",
    "analyses.readers.nvidia_smi:NvidiaSmiDmonReader",
    "analyses.readers.worker_times:WorkerTimesReader",
    "analyses.readers.cluster_util:ClusterUtilLongReader",
    "analyses.readers.cluster_util:ClusterUtilWideReader",
    "analyses.readers.kaggle_log:KaggleLogReader",
    "analyses.readers.metrics_export:MetricsJsonlReader",
    "analyses.readers.metrics_export:MetricsCsvReader",
    "analyses.readers.trl_console:TrlConsoleReader",
    "analyses.readers.verl_console:VerlConsoleReader",
)

_readers: list[Reader] | None = None


def all_readers() -> list[Reader]:
    """Instances of every available reader, in sniffing order."""
    global _readers
    if _readers is None:
        out: list[Reader] = []
        for spec in READER_SPECS:
            mod_name, cls_name = spec.split(":")
            out.append(getattr(importlib.import_module(mod_name), cls_name)())
        _readers = out
    return _readers


def detect(path: Path, head: str | None = None) -> Reader | None:
    """The reader for ``path`` by content, or None when no reader recognizes it: the head first,
    then, for a text file, a bounded second look for a late console format."""
    text = read_head(path) if head is None else head
    for r in all_readers():
        if r.sniff(text, path):
            return r
    return late_detect(path, text, [r for r in all_readers() if r.late_sniff])


def reader_by_name(name: str) -> Reader:
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
