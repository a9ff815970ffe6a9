"""Vidur request traces: one request per sample (per turn for multi-turn tasks; a later turn
arrives when the previous turn and its tool calls are done), in the three layouts vidur's trace
generators read:

* ``vidur_trace.csv`` (``arrived_at, num_prefill_tokens, num_decode_tokens``):
  ``TraceRequestLengthGenerator`` (request lengths);
* ``vidur_replay_trace.csv`` (``Date, Time, PromptTokenCount, CompletionTokenCount``):
  ``TraceReplayRequestGenerator``, which keeps the rows whose ``Date`` equals its config's
  ``date`` (default ``2023-08-21``; ``--vidur-date`` writes another) and replays ``Time`` seconds;
* ``vidur_interval_trace.csv`` (``arrival_time``): ``TraceRequestIntervalGenerator``, which keeps
  arrivals strictly inside its config's ``[start_time, end_time]`` window (default 1970-01-04
  12:00:00 to 15:00:00): the arrivals start one second into that window (later ones fall out of it
  after three hours of trace; widen the window for longer runs).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from analyses.export.consumer_versions import VIDUR
from analyses.export.records import request_timeline
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.structure import check_vidur
from analyses.fit.sampler import Generated

VIDUR_DEFAULT_DATE = "2023-08-21"  # TraceRequestGeneratorConfig.date
VIDUR_INTERVAL_START = datetime(1970, 1, 4, 12, 0, 1)  # 1 s into TraceRequestIntervalGeneratorConfig's window


def write_vidur(g: Generated, w: dict[str, Any], out: Path, step_interval_s: float | None = None,
                date: str = VIDUR_DEFAULT_DATE) -> list[Path]:
    r = request_timeline(g, w, step_interval_s).select(
        pl.col("arrived_at").round(6), prefill=pl.col("prefill").cast(pl.Int64), decode=pl.col("decode").cast(pl.Int64)
    )
    length, replay, interval = out / "vidur_trace.csv", out / "vidur_replay_trace.csv", out / "vidur_interval_trace.csv"
    r.select("arrived_at", num_prefill_tokens="prefill", num_decode_tokens="decode").write_csv(length)
    r.select(Date=pl.lit(date), Time="arrived_at", PromptTokenCount="prefill", CompletionTokenCount="decode").write_csv(replay)
    r.select(arrival_time=pl.lit(VIDUR_INTERVAL_START) + pl.duration(microseconds=(pl.col("arrived_at") * 1e6).round(0)
                                                                    .cast(pl.Int64))).write_csv(
        interval, datetime_format="%Y-%m-%d %H:%M:%S%.6f")
    return [length, replay, interval]


def _write(job: ExportJob) -> list[Path]:
    date = str(job.options.get("vidur_date") or VIDUR_DEFAULT_DATE)
    return write_vidur(job.generated, job.workload, job.out, job.step_interval_s, date)


FORMAT = ExportFormat(
    name="vidur",
    order=40,
    description="Vidur request traces: lengths, a Date/Time replay trace and an arrival-time trace",
    files="vidur_trace.csv, vidur_replay_trace.csv, vidur_interval_trace.csv",
    consumer="vidur",
    loader="TraceRequestLengthGenerator (vidur_trace.csv), TraceReplayRequestGenerator (vidur_replay_trace.csv), "
    "TraceRequestIntervalGenerator (vidur_interval_trace.csv)",
    try_it="python -m vidur.main --request_generator_config_type trace_replay "
    "--trace_request_generator_config_trace_file vidur_replay_trace.csv",
    write=_write,
    check=check_vidur,
    checked_against=VIDUR,
)
