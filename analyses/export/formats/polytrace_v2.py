"""PolyTrace v2 workload files, what upstream PolyTrace's replay readers load.

``packed_lengths_step_<k>.jsonl`` (one record per prompt: step, rank, dp_rank, tp_rank, local_index,
input, output[n], n_sampling, validate) for single-turn tasks, ``multiturn_workload_step_<k>.jsonl``
(one record per trajectory) *instead* for multi-turn tasks (both would describe the same samples
twice), and ``reward_timings_step_<k>.jsonl`` where reward time was fitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analyses.export.records import multiturn_records, packed_records
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.sampler import Generated


def write_v2(g: Generated, w: dict[str, Any], d: Path) -> list[Path]:
    """The step files, numbered 0..N-1 as upstream's configs name them (``step_groups``), whatever
    steps of the source run the generated ones stand for."""
    out: list[Path] = []
    first = int(w["batch"].get("first_step", 0))
    g = g.renumbered(first)
    recs = packed_records(g.samples)
    multi = g.turns is not None
    cap = w["variables"]["response_tokens"].get("censor_at")
    # a multi-turn task is written as multiturn_workload files only (as PolyTrace's own multi-turn
    # runs are): a packed view of the same trajectories would make a reader count every sample twice
    for (k,), part in ([] if multi else recs.group_by("step", maintain_order=True)):
        p = d / f"packed_lengths_step_{int(k)}.jsonl"
        part.write_ndjson(p)
        out.append(p)
    if multi:
        overhead = float((w["variables"].get("tool_overhead_tokens") or {}).get("value", 0.0))
        mt = multiturn_records(g, cap, overhead)
        for (k,), part in mt.group_by("step", maintain_order=True):
            p = d / f"multiturn_workload_step_{int(k)}.jsonl"
            part.write_ndjson(p)
            out.append(p)
    if g.rewards is not None:
        rw = g.rewards.select(
            "step", "rank", tp_rank=pl.lit(0, pl.Int64), dp_rank="dp_rank", batch_size=pl.col("batch_size").cast(pl.Int64),
            reward_time_s="reward_time_s", response_sum="response_sum", response_mean="response_mean",
            response_max="response_max", validate=pl.lit(False),
        )
        for (k,), part in rw.group_by("step", maintain_order=True):
            p = d / f"reward_timings_step_{int(k)}.jsonl"
            part.write_ndjson(p)
            out.append(p)
    return out


def _write(job: ExportJob) -> list[Path]:
    return write_v2(job.generated, job.workload, job.out)


FORMAT = ExportFormat(
    name="polytrace-v2",
    order=10,
    description="PolyTrace v2 per-step workload logs (packed lengths, multi-turn trajectories, reward timings)",
    files="packed_lengths_step_<k>.jsonl | multiturn_workload_step_<k>.jsonl, reward_timings_step_<k>.jsonl",
    consumer="upstream PolyTrace (suite.py --validate, Generator.py readers, multi-turn replay)",
    loader="suite.py --validate CONFIG; */verl/trainer/Generator.py; _async_replay_workload_request",
    try_it="python suite.py --validate configs/<config>.yaml (workload_path: the export directory)",
    write=_write,
)
