"""PolyTrace v2 workload files, what upstream PolyTrace's replay readers load.

``packed_lengths_step_<k>.jsonl`` (one record per prompt: step, rank, dp_rank, tp_rank, local_index,
input, output[n], n_sampling, validate) for single-turn tasks, ``multiturn_workload_step_<k>.jsonl``
(one record per trajectory) *instead* for multi-turn tasks (both would describe the same samples
twice), ``reward_timings_step_<k>.jsonl`` where reward time was fitted, and
``dapo_filter_indices.jsonl`` for a filtering (DAPO) run: each generated step is one generation batch."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyses.export.consumer_versions import UPSTREAM_POLYTRACE
from analyses.export.records import multiturn_records, packed_records
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.structure import check_polytrace_v2
from analyses.fit.sampler import Generated

FILTER_FILE = "dapo_filter_indices.jsonl"


def filter_records(w: dict[str, Any], steps: list[int], seed: int, key: str) -> list[dict[str, Any]]:
    """DAPO's ``dapo_filter_indices.jsonl`` for generated steps (one generation batch each): which
    prompts the filter kept (each at the fitted keep rate) and which of those filled the trainer
    batch, counted as DAPO does (a trainer step takes kept prompts until ``train_batch_size``; the
    surplus of the batch that fills it is kept but not used)."""
    f = w["filter"]
    n_prompts = int(w["batch"]["prompts_per_step"])
    n_sampling = int(w["batch"]["samples_per_prompt"])
    tbs = f.get("train_batch_size")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(f"{key}/filter".encode())]))
    out: list[dict[str, Any]] = []
    trainer_step, gen_index, in_batch = 1, 1, 0
    for k in steps:
        kept = [int(i) for i in np.flatnonzero(rng.random(n_prompts) < float(f["keep_rate"]))]
        used = kept if tbs is None else kept[: max(int(tbs) - in_batch, 0)]
        out.append({"workload_step": int(k), "trainer_step": trainer_step, "gen_batch_index": gen_index,
                    "prompt_count": n_prompts, "n_sampling": n_sampling, "train_batch_size": tbs,
                    "num_prompt_in_batch_before": in_batch, "kept_prompt_count": len(kept),
                    "used_prompt_count": len(used), "kept_prompt_indices": kept, "used_prompt_indices": used})
        in_batch += len(used)
        if tbs is None or in_batch >= int(tbs):
            trainer_step, gen_index, in_batch = trainer_step + 1, 1, 0
        else:
            gen_index += 1
    return out


def write_v2(g: Generated, w: dict[str, Any], d: Path, seed: int = 0, key: str = "") -> list[Path]:
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
    if w.get("filter") and not multi:
        p = d / FILTER_FILE
        steps = sorted(int(k) for k in g.samples["step"].unique())
        p.write_text("".join(json.dumps(r) + "\n" for r in filter_records(w, steps, seed, key)))
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
    return write_v2(job.generated, job.workload, job.out, job.seed, job.key)


FORMAT = ExportFormat(
    name="polytrace-v2",
    order=10,
    description="PolyTrace v2 per-step workload logs (packed lengths, multi-turn trajectories, reward timings)",
    files="packed_lengths_step_<k>.jsonl | multiturn_workload_step_<k>.jsonl, reward_timings_step_<k>.jsonl, "
    "dapo_filter_indices.jsonl",
    consumer="upstream PolyTrace (suite.py --validate, Generator.py readers, multi-turn replay)",
    loader="suite.py --validate CONFIG; */verl/trainer/Generator.py; _async_replay_workload_request",
    try_it="python suite.py --validate configs/<config>.yaml with workload_path the export directory; here the model: "
    "python tests/conformance/upstream_polytrace.py --validate CONFIG --workload-path DIR, --replay STEP_FILE",
    write=_write,
    check=check_polytrace_v2,
    checked_against=UPSTREAM_POLYTRACE,
)
