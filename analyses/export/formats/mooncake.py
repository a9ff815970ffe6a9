"""Mooncake traces (``mooncake_trace.jsonl``: timestamp ms, input_length, output_length, hash_ids of
512-token prefix blocks shared within a prompt group / trajectory); agentic turns add session_id,
turn and the tool calls the turn triggered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analyses.export.records import request_timeline
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.sampler import Generated

BLOCK = 512  # Mooncake hash block size (tokens)

def write_mooncake(g: Generated, w: dict[str, Any], path: Path, step_interval_s: float | None = None) -> Path:
    r = request_timeline(g, w, step_interval_s)
    multi = g.turns is not None
    # prefix blocks: the prompt's blocks are shared by the group; a trajectory's later context is its own
    gk = r.select("step", "group").unique(maintain_order=True).with_row_index("gid")
    r = r.join(gk, on=["step", "group"])
    pblocks = g.samples.group_by("step", "group").agg(p=pl.col("prompt_tokens").first())
    r = r.join(pblocks, on=["step", "group"])
    prompt_nb = (pl.col("p") + BLOCK - 1) // BLOCK
    total_nb = (pl.col("prefill") + BLOCK - 1) // BLOCK
    max_nb = int(r.select((pl.col("prefill") + BLOCK - 1) // BLOCK).max().item() or 1) + 1
    # ids [0, groups * max_nb) are prompt blocks (max_nb per group); each trajectory's own blocks
    # follow, max_nb per (group, sample): disjoint whatever the number of groups or samples per prompt
    per_group = max(int(w["batch"].get("samples_per_prompt") or 1), int(r["sample_index"].max() or 0) + 1)
    traj_base = (gk.height + pl.col("gid") * per_group + pl.col("sample_index")) * max_nb
    r = r.with_columns(
        hash_ids=pl.concat_list(
            pl.int_ranges(pl.col("gid") * max_nb, pl.col("gid") * max_nb + pl.min_horizontal(prompt_nb, total_nb)),
            pl.int_ranges(traj_base, traj_base + pl.max_horizontal(total_nb - prompt_nb, 0)),
        )
    )
    cols = [
        (pl.col("arrived_at") * 1000).round(3).alias("timestamp"),
        pl.col("prefill").cast(pl.Int64).alias("input_length"),
        pl.col("decode").cast(pl.Int64).alias("output_length"),
        "hash_ids",
    ]
    if multi:
        cols += [pl.format("{}-{}-{}", "step", "group", "sample_index").alias("session_id"), "turn", "tool_calls"]
    r.select(cols).write_ndjson(path)
    return path


def _write(job: ExportJob) -> list[Path]:
    return [write_mooncake(job.generated, job.workload, job.out / "mooncake_trace.jsonl", job.step_interval_s)]


FORMAT = ExportFormat(
    name="mooncake",
    order=50,
    description="Mooncake request trace with prefix-block hash ids (sessions for agentic turns)",
    files="mooncake_trace.jsonl",
    consumer="aiperf (mooncake_trace custom dataset)",
    loader="aiperf MooncakeTrace model and its mooncake trace loader",
    try_it="aiperf profile --custom-dataset-type mooncake_trace --input-file mooncake_trace.jsonl ...",
    write=_write,
)
