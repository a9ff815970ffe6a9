"""The frames a fit needs for one run, read from the warehouse (the only warehouse access in
:mod:`analyses.fit`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

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
