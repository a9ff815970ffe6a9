"""Scoring a generated workload against real steps: the per-step statistics and the scores
that model selection (:mod:`analyses.fit.select`) and the fidelity check
(:mod:`analyses.fit.fidelity`) both use."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from analyses.fit.score_refs import accuracy_from_errors

TRAIN_FRACTION = 2 / 3
STATS_BASE = ("total_tokens", "longest_response", "p99_response", "makespan_tokens")
STATS_MULTI = ("turns", "tool_time_s")


def per_sample_tool_time(samples: pl.DataFrame, tool_calls: pl.DataFrame | None, keys: tuple[str, ...]) -> pl.DataFrame:
    if tool_calls is None or tool_calls.height == 0:
        return samples.with_columns(tool_time_s=pl.lit(0.0))
    tt = tool_calls.group_by(*keys).agg(tool_time_s=pl.col("latency_s").sum())
    return samples.join(tt, on=list(keys), how="left").with_columns(pl.col("tool_time_s").fill_null(0.0))


def step_statistics(samples: pl.DataFrame, multi: bool, has_ranks: bool) -> pl.DataFrame:
    """One row per step with the fidelity statistics."""
    s = samples.with_columns(pl.col("prompt_tokens").cast(pl.Float64), pl.col("response_tokens").cast(pl.Float64))
    aggs = [
        (pl.col("prompt_tokens") + pl.col("response_tokens")).sum().alias("total_tokens"),
        pl.col("response_tokens").max().alias("longest_response"),
        pl.col("response_tokens").quantile(0.99, "linear").alias("p99_response"),
    ]
    if multi:
        aggs += [pl.col("n_turns").sum().cast(pl.Float64).alias("turns"), pl.col("tool_time_s").sum().alias("tool_time_s")]
    out = s.group_by("step").agg(aggs)
    if has_ranks:
        mk = s.group_by("step", "dp_rank").agg(t=pl.col("response_tokens").sum()).group_by("step").agg(makespan_tokens=pl.col("t").max())
        out = out.join(mk, on="step")
    return out.sort("step")


def _ape(real: pl.DataFrame, gen: pl.DataFrame, names: list[str]) -> dict[str, float]:
    """Mean over steps of |gen - real| / real, per statistic (steps where real is 0 skipped)."""
    j = real.join(gen, on="step", suffix="_gen")
    out = {}
    for c in names:
        r, g = j[c].to_numpy(), j[f"{c}_gen"].to_numpy()
        ok = r > 0
        out[c] = float(np.mean(np.abs(g[ok] - r[ok]) / r[ok])) if ok.any() else float("nan")
    return out


def score_generated(real: pl.DataFrame, per_seed: list[pl.DataFrame], names: list[str]) -> dict[str, Any]:
    """Scores of a generator's per-seed step statistics against the real ones (see analyses.fit.fidelity)."""
    allg = pl.concat(per_seed)
    mean_gen = allg.group_by("step").agg([pl.col(c).mean() for c in names])
    ape = _ape(real, mean_gen, names)
    single = [_ape(real, g, names) for g in per_seed]
    level = {}
    for c in names:
        r = float(real[c].mean())
        level[c] = abs(float(allg[c].mean()) - r) / r if r > 0 else float("nan")

    return {
        "accuracy_pct": accuracy_from_errors(ape),
        "errors_pct": {c: 100.0 * v for c, v in ape.items()},
        "single_replay_accuracy_pct": float(np.mean([accuracy_from_errors(e) for e in single])),
        "single_replay_by_seed_pct": [accuracy_from_errors(e) for e in single],
        "level_accuracy_pct": accuracy_from_errors(level),
        "level_errors_pct": {c: 100.0 * v for c, v in level.items()},
        "generated_mean": {c: float(allg[c].mean()) for c in names},
    }
