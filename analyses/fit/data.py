"""A run's data as the fits and their scores take it: the frames read from the warehouse (the only
warehouse access in :mod:`analyses.fit`), which samples and steps count (training samples, full
steps, the batch's shape), and a short run's prompt-group pseudo-steps for scoring."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from analyses.fit.summaries import BatchFacts, summaries_from_metrics
from analyses.run_facts import PARTIAL_STEP_SHARE
from analyses.warehouse import run_ids, scan_table


@dataclass
class RunFrames:
    run_id: str
    samples: pl.DataFrame
    turns: pl.DataFrame | None = None
    tool_calls: pl.DataFrame | None = None
    rank_times: pl.DataFrame | None = None
    steps: pl.DataFrame | None = None
    task: str | None = None
    max_response_length: float | None = None
    info: dict = field(default_factory=dict)
    filter_batches: pl.DataFrame | None = None  # generation batches of a filtering (DAPO) run

    def restrict(self, steps: list[int]) -> RunFrames:
        """The same run with only the given steps."""

        def f(df: pl.DataFrame | None) -> pl.DataFrame | None:
            return None if df is None else df.filter(pl.col("step").is_in(steps))

        return RunFrames(self.run_id, f(self.samples), f(self.turns), f(self.tool_calls), f(self.rank_times), f(self.steps),
                         self.task, self.max_response_length, dict(self.info), self.filter_batches)


def _opt(df: pl.DataFrame) -> pl.DataFrame | None:
    return df if df.height else None


def load_run(root: Path, run_id: str) -> RunFrames:
    """Read one run's samples / turns / tool calls / rank times / steps from the warehouse."""
    if run_id not in run_ids(root):
        raise KeyError(f"run {run_id!r} is not in the warehouse {root}")
    runs = scan_table(root, "runs", [run_id]).collect()
    task = runs["task"][0] if runs.height else None
    mrl = runs["max_response_length"][0] if runs.height else None
    return RunFrames(
        run_id=run_id,
        samples=scan_table(root, "samples", [run_id]).collect(),
        turns=_opt(scan_table(root, "turns", [run_id]).collect()),
        tool_calls=_opt(scan_table(root, "tool_calls", [run_id]).collect()),
        rank_times=_opt(scan_table(root, "rank_times", [run_id]).collect()),
        steps=_opt(scan_table(root, "steps", [run_id]).collect()),
        filter_batches=_opt(scan_table(root, "filter_batches", [run_id]).collect()),
        task=task,
        max_response_length=float(mrl) if mrl is not None else None,
    )


def runs_with_steps(root: Path) -> list[str]:
    """Runs with a step log that has generation times (candidates for the step-time model)."""
    df = scan_table(root, "steps").filter(pl.col("gen_time_s").is_not_null()).select("run_id").unique().collect()
    return sorted(df["run_id"].to_list())


def has_samples(root: Path, run_id: str) -> bool:
    """Whether the run has per-sample lengths (reads only that run's files)."""
    return scan_table(root, "samples", [run_id]).filter(pl.col("response_tokens").is_not_null()).head(1).collect().height > 0


def has_step_times(root: Path, run_id: str) -> bool:
    """Whether the run has a step log with generation times (reads only that run's files)."""
    return scan_table(root, "steps", [run_id]).filter(pl.col("gen_time_s").is_not_null()).head(1).collect().height > 0


def runs_with_samples(root: Path) -> list[str]:
    """Runs that have per-sample lengths (the ones a workload can be fitted to)."""
    df = scan_table(root, "samples").filter(pl.col("response_tokens").is_not_null()).select("run_id").unique().collect()
    return sorted(df["run_id"].to_list())


def training_samples(samples: pl.DataFrame) -> pl.DataFrame:
    """Non-validation samples with lengths, and an integer group code per (step, prompt)."""
    s = samples.filter(pl.col("validate").fill_null(False).not_() & pl.col("response_tokens").is_not_null())
    grp = pl.coalesce(pl.col("group_id"), pl.col("sample_id"), pl.int_range(pl.len()).cast(pl.String))
    return s.with_columns(_g=pl.concat_str([pl.col("step").cast(pl.String), grp], separator="|")).with_columns(
        group=pl.col("_g").rank("dense").cast(pl.Int64) - 1
    ).drop("_g")


PARTIAL_SHARE = PARTIAL_STEP_SHARE  # the one rule of a partial step, shared with the views


def full_and_partial_steps(samples: pl.DataFrame) -> tuple[list[int], list[int]]:
    """(full steps, partial steps) in step order: a cut-off step (fewer than half the median
    step's samples, e.g. the last step of a run stopped mid-rollout) is never fitted or scored."""
    counts = samples.group_by("step").len().sort("step")
    med = float(counts["len"].median() or 0)
    full = [int(k) for k, c in zip(counts["step"], counts["len"], strict=True) if c >= PARTIAL_SHARE * med]
    return full, [int(k) for k in counts["step"] if int(k) not in full]


def is_multi_turn(s: pl.DataFrame) -> bool:
    return bool(s["n_turns"].drop_nulls().len() and (s["n_turns"].fill_null(1) > 1).any())


def batch_shape(s: pl.DataFrame) -> dict[str, Any]:
    """Prompts per step, samples per prompt, DP ranks and the rank of each (mode over steps)."""
    per_step = s.group_by("step").agg(prompts=pl.col("group").n_unique(), samples=pl.len())
    prompts = int(per_step["prompts"].mode().sort()[-1])
    per_group = s.group_by("group").len()["len"]
    n = int(per_group.mode().sort()[-1])
    dp = s.filter(pl.col("dp_rank").is_not_null()).group_by("dp_rank").agg(rank=pl.col("rank").min()).sort("dp_rank")
    dps = [int(v) for v in dp["dp_rank"]] or [0]
    ranks = [int(v) if v is not None else i for i, v in enumerate(dp["rank"])] if dp.height else [0]
    tp = int(ranks[1] - ranks[0]) if len(ranks) > 1 and ranks[1] > ranks[0] else 1
    steps = sorted(int(v) for v in per_step["step"])
    return {
        "prompts_per_step": prompts,
        "samples_per_prompt": n,
        "dp_ranks": dps,
        "rank_of_dp": ranks,
        "tp_size": tp,
        "has_ranks": bool(dp.height),
        "first_step": steps[0],
        "last_step": steps[-1],
        "n_steps": len(steps),
    }


PSEUDO_STEPS = 8  # a run with fewer than 3 full steps is scored on this many prompt-group pseudo-steps


@dataclass
class Split:
    mode: str  # 'steps' | 'prompt_groups'
    steps: list[int]  # full (pseudo-)steps in order
    partial_steps: list[int]
    frames: RunFrames  # with pseudo-steps relabelled when mode == 'prompt_groups'


def split_run(frames: RunFrames) -> Split:
    """The run's full steps, or 8 prompt-group pseudo-steps when it has fewer than 3."""
    s = training_samples(frames.samples)
    full, partial = full_and_partial_steps(s)
    if len(full) >= 3:
        return Split("steps", full, partial, frames)
    s = s.filter(pl.col("step").is_in(full))
    groups = s.select("step", "group").unique().sort("step", "group").with_row_index("gi")
    ng = groups.height
    if ng < PSEUDO_STEPS:
        raise ValueError(f"{frames.run_id}: {len(full)} full step(s) and {ng} prompt group(s): too few to score")
    groups = groups.with_columns(pseudo=(pl.col("gi") * PSEUDO_STEPS // max(ng, 1)).cast(pl.Int64))
    s = s.join(groups.select("step", "group", "pseudo"), on=["step", "group"])
    key = s.select("step", "sample_id", "pseudo")

    def relabel(df: pl.DataFrame | None) -> pl.DataFrame | None:
        if df is None:
            return None
        return df.join(key, on=["step", "sample_id"]).with_columns(step=pl.col("pseudo")).drop("pseudo")

    samples = s.with_columns(step=pl.col("pseudo"), group_id=pl.concat_str([pl.col("step").cast(pl.String), pl.col("group_id")],
                                                                            separator="|")).drop("pseudo", "group")
    rf = RunFrames(frames.run_id, samples, turns=relabel(frames.turns), tool_calls=relabel(frames.tool_calls),
                   task=frames.task, max_response_length=frames.max_response_length, info=dict(frames.info))
    return Split("prompt_groups", list(range(PSEUDO_STEPS)), partial, rf)


@dataclass
class SummaryFrames:
    """A step-only run as a fit from summaries takes it: its per-step summaries and batch facts."""

    run_id: str
    summaries: pl.DataFrame  # analyses.fit.summaries columns
    facts: BatchFacts
    task: str | None = None
    max_response_length: float | None = None
    steps: pl.DataFrame | None = None


def load_summaries(root: Path, run_id: str) -> SummaryFrames:
    """A run's per-step length summaries (from ``step_metrics``) and the batch facts of its
    ``runs`` row (:mod:`analyses.run_facts`)."""
    if run_id not in run_ids(root):
        raise KeyError(f"run {run_id!r} is not in the warehouse {root}")
    runs = scan_table(root, "runs", [run_id]).collect()
    row = runs.row(0, named=True) if runs.height else {}
    facts = BatchFacts(train_batch_size=row.get("train_batch_size"), rollout_n=row.get("rollout_n"),
                       step_samples=row.get("samples_per_step"), max_prompt_length=row.get("max_prompt_length"))
    metrics = scan_table(root, "step_metrics", [run_id]).collect()
    mrl = row.get("max_response_length")
    return SummaryFrames(run_id, summaries_from_metrics(metrics, facts), facts, row.get("task"),
                         float(mrl) if mrl is not None else None, _opt(scan_table(root, "steps", [run_id]).collect()))


def has_summaries(root: Path, run_id: str) -> bool:
    """Whether the run logged per-step response-length means (reads only that run's files)."""
    return scan_table(root, "step_metrics", [run_id]).filter(
        (pl.col("metric") == "response_length/mean") & ~pl.col("is_validation").fill_null(False)).head(1).collect().height > 0


def runs_with_summaries(root: Path) -> list[str]:
    """Runs with per-step length summaries and no per-sample lengths (a workload is fitted from the
    summaries only where the samples are missing)."""
    df = scan_table(root, "step_metrics").filter(
        (pl.col("metric") == "response_length/mean") & ~pl.col("is_validation").fill_null(False)
    ).select("run_id").unique().collect()
    return sorted(set(df["run_id"].to_list()) - set(runs_with_samples(root)))
