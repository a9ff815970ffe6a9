"""Mooncake traces (``mooncake_trace.jsonl``): one request per sample, or per turn of an agentic
trajectory, as aiperf's ``mooncake_trace`` dataset reads them.

* ``timestamp``: integer milliseconds, non-decreasing (the request's arrival: its step's start plus,
  for later turns, the time the earlier turns and their tool calls took).
* ``input_length`` / ``output_length``: the request's new prompt tokens and its completion. A
  later turn of a trajectory is a **per-turn increment** (``session_id``, ``turn``): aiperf's
  multi-turn mode keeps a session's history and threads each response into it, so turn ``k``
  carries only what arrived since turn ``k-1`` answered (the tool results and their template,
  ``prompt_tokens[k] - prompt_tokens[k-1] - completion_tokens[k-1]``, at least one token); the
  context aiperf then sends at turn ``k`` equals the generated trajectory's ``prompt_tokens[k]``.
  Cumulative lengths would send each earlier turn twice (1.7x the real prefill).
* ``hash_ids``: one id per 512-token block of ``input_length`` (aiperf synthesises a prompt block per
  id, the last one shorter). The first request of a prompt group (every sample of a prompt, turn 0)
  shares the prompt's ids, so prefix caching sees what the real batch shared; a later turn's
  increment gets ids of its own, so an id always stands for a block of one size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analyses.export.consumer_versions import AIPERF
from analyses.export.records import request_timeline
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.structure import check_mooncake
from analyses.fit.sampler import Generated

BLOCK = 512  # Mooncake hash block size (tokens)


def mooncake_requests(g: Generated, w: dict[str, Any], step_interval_s: float | None = None) -> pl.DataFrame:
    """The trace's rows (before serialisation): timestamp, input/output lengths, hash ids, sessions."""
    r = request_timeline(g, w, step_interval_s)
    multi = g.turns is not None
    keys = ["step", "group", "sample_index"]
    if multi:
        prev = pl.col("prefill").shift(1).over(keys, order_by="turn")
        prev_out = pl.col("decode").shift(1).over(keys, order_by="turn")
        r = r.with_columns(input_length=pl.when(pl.col("turn") == 0).then(pl.col("prefill"))
                           .otherwise(pl.max_horizontal(pl.col("prefill") - prev - prev_out, pl.lit(1))))
    else:
        r = r.with_columns(input_length=pl.col("prefill"))
    r = r.with_columns(input_length=pl.col("input_length").cast(pl.Int64), nb=(pl.col("input_length") + BLOCK - 1) // BLOCK)
    # ids: the first turn's blocks per prompt group, then each later turn's own blocks, numbered in order
    first = pl.col("turn") == 0
    groups = r.filter(first).group_by("step", "group").agg(nb=pl.col("nb").max()).sort("step", "group")
    groups = groups.with_columns(base=pl.col("nb").cum_sum() - pl.col("nb"))
    n_prompt_ids = int(groups["nb"].sum() or 0)
    r = r.join(groups.select("step", "group", gbase="base"), on=["step", "group"], how="left")
    r = r.with_columns(_later_nb=pl.when(first).then(0).otherwise(pl.col("nb")))
    r = r.sort("arrived_at", *keys, "turn").with_columns(
        own_base=n_prompt_ids + pl.col("_later_nb").cum_sum() - pl.col("_later_nb"))
    r = r.with_columns(hash_ids=pl.when(first).then(pl.int_ranges(pl.col("gbase"), pl.col("gbase") + pl.col("nb")))
                       .otherwise(pl.int_ranges(pl.col("own_base"), pl.col("own_base") + pl.col("nb"))))
    cols = [
        (pl.col("arrived_at") * 1000).round(0).cast(pl.Int64).alias("timestamp"),
        "input_length",
        pl.col("decode").cast(pl.Int64).alias("output_length"),
        "hash_ids",
    ]
    if multi:
        cols += [pl.format("{}-{}-{}", "step", "group", "sample_index").alias("session_id"), "turn", "tool_calls"]
    return r.sort("arrived_at", *keys, "turn").select(cols)


def write_mooncake(g: Generated, w: dict[str, Any], path: Path, step_interval_s: float | None = None) -> Path:
    mooncake_requests(g, w, step_interval_s).write_ndjson(path)
    return path


def _write(job: ExportJob) -> list[Path]:
    return [write_mooncake(job.generated, job.workload, job.out / "mooncake_trace.jsonl", job.step_interval_s)]


FORMAT = ExportFormat(
    name="mooncake",
    order=50,
    description="Mooncake request trace: integer-ms arrivals, per-turn increments in sessions, prefix-block hash ids",
    files="mooncake_trace.jsonl",
    consumer="aiperf (mooncake_trace custom dataset)",
    loader="aiperf MooncakeTrace model and its mooncake trace loader",
    try_it="aiperf profile --custom-dataset-type mooncake_trace --input-file mooncake_trace.jsonl ...",
    write=_write,
    check=check_mooncake,
    checked_against=AIPERF,
)
