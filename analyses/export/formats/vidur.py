"""Vidur request traces: one request per sample (per turn for multi-turn tasks; a later turn
arrives when the previous turn and its tool calls are done)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analyses.export.records import request_timeline
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.sampler import Generated


def write_vidur(g: Generated, w: dict[str, Any], path: Path, step_interval_s: float | None = None) -> Path:
    r = request_timeline(g, w, step_interval_s)
    r.select(
        pl.col("arrived_at").round(6), num_prefill_tokens=pl.col("prefill").cast(pl.Int64), num_decode_tokens=pl.col("decode").cast(pl.Int64)
    ).write_csv(path)
    return path


def _write(job: ExportJob) -> list[Path]:
    return [write_vidur(job.generated, job.workload, job.out / "vidur_trace.csv", job.step_interval_s)]


FORMAT = ExportFormat(
    name="vidur",
    order=40,
    description="Vidur request trace (arrival time, prefill and decode tokens per request)",
    files="vidur_trace.csv",
    consumer="vidur",
    loader="TraceRequestLengthGenerator",
    try_it="python -m vidur.main --request_generator_config_type synthetic --length_generator_config_type trace "
    "--trace_request_length_generator_config_trace_file vidur_trace.csv",
    write=_write,
)
