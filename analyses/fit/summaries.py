"""Per-step summaries of a run's lengths -- what every RL framework prints at every training step --
as one frame with one row per step, whichever framework printed them.

Two sources give the same frame:

* :func:`summaries_from_metrics` reads a run's ``step_metrics`` (canonical names,
  :mod:`analyses.steps`): verl's ``response_length/*``, ``prompt_length/*``, ``global_seqlen/*``,
  ``num_turns/*``, ``timing_s/agent_loop/tool_calls/*`` and ``perf/total_num_tokens``; TRL's and
  Unsloth's ``completions/*`` (their ``*_terminated_length`` too) and the cumulative ``num_tokens``;
* :func:`summaries_from_samples` computes them from per-sample records exactly as verl prints them
  (the proof on runs whose samples are known, ``polytrace fidelity --from-summaries``).

Columns (NULL where the source does not say):

``n``
    samples (responses) in the step's batch, with ``n_source``: ``config`` (train batch size x
    rollout n, from the run's facts), ``tokens`` (``perf/total_num_tokens`` / (mean prompt + mean
    response), or the step's increase of TRL's cumulative ``num_tokens`` over its steps), ``samples``
    (counted);
``n_prompts``
    prompts per step (``n / samples_per_prompt``);
``averaged_steps``
    how many generation batches the row averages: 1 for verl; transformers' ``Trainer`` (TRL,
    Unsloth) logs the mean over the steps since its previous log, so a row at step 20 after one at
    step 10 averages 10 -- its min and max are means of per-step extremes, not extremes;
``response_{mean,min,max,clip_ratio}``, ``terminated_{mean,min,max}``
    response lengths; the share at the cap; TRL's statistics of the responses not cut at the cap;
``prompt_{mean,min,max,clip_ratio}``
    prompt lengths (verl repeats a prompt once per response, so these are over prompts);
``seqlen_{min,max,mean}``, ``seqlen_ranks``
    verl's ``global_seqlen``: prompt + response tokens summed over each of ``seqlen_ranks``
    contiguous chunks of the batch (the data-parallel ranks before sequence balancing);
``turns_{mean,min,max}``, ``tool_time_{mean,min,max}``
    agentic runs: assistant turns per trajectory, and the seconds each trajectory spent in tool
    calls. verl's ``num_turns`` counts the conversation's messages (``user_turns + assistant_turns
    + 1`` in its tool agent loop: two per assistant turn, the tool's reply and the next turn), so it
    is halved here;
``total_tokens``
    prompt + response tokens of the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(), "n": pl.Float64(), "n_source": pl.String(), "n_prompts": pl.Float64(),
    "averaged_steps": pl.Float64(),
    "response_mean": pl.Float64(), "response_min": pl.Float64(), "response_max": pl.Float64(),
    "response_clip_ratio": pl.Float64(),
    "terminated_mean": pl.Float64(), "terminated_min": pl.Float64(), "terminated_max": pl.Float64(),
    "prompt_mean": pl.Float64(), "prompt_min": pl.Float64(), "prompt_max": pl.Float64(), "prompt_clip_ratio": pl.Float64(),
    "seqlen_min": pl.Float64(), "seqlen_max": pl.Float64(), "seqlen_mean": pl.Float64(), "seqlen_ranks": pl.Float64(),
    "turns_mean": pl.Float64(), "turns_min": pl.Float64(), "turns_max": pl.Float64(),
    "tool_time_mean": pl.Float64(), "tool_time_min": pl.Float64(), "tool_time_max": pl.Float64(),
    "total_tokens": pl.Float64(),
}

# summary column <- canonical metric (analyses.steps), first present wins
METRIC_COLUMNS: dict[str, tuple[str, ...]] = {
    "response_mean": ("response_length/mean",),
    "response_min": ("response_length/min",),
    "response_max": ("response_length/max",),
    "response_clip_ratio": ("response_length/clip_ratio",),
    "terminated_mean": ("completions/mean_terminated_length",),
    "terminated_min": ("completions/min_terminated_length",),
    "terminated_max": ("completions/max_terminated_length",),
    "prompt_mean": ("prompt_length/mean",),
    "prompt_min": ("prompt_length/min",),
    "prompt_max": ("prompt_length/max",),
    "prompt_clip_ratio": ("prompt_length/clip_ratio",),
    "seqlen_min": ("global_seqlen/min",),
    "seqlen_max": ("global_seqlen/max",),
    "seqlen_mean": ("global_seqlen/mean",),
    "turns_mean": ("num_turns/mean",),
    "turns_min": ("num_turns/min",),
    "turns_max": ("num_turns/max",),
    "tool_time_mean": ("timing_s/agent_loop/tool_calls/mean",),
    "tool_time_min": ("timing_s/agent_loop/tool_calls/min",),
    "tool_time_max": ("timing_s/agent_loop/tool_calls/max",),
    "total_tokens": ("perf/total_num_tokens",),
}
CUMULATIVE_TOKENS = "perf/cumulative_num_tokens"
# spellings transformers' Trainer prints (its logs average every metric over the logging interval)
AVERAGED_SPELLINGS = ("completions/mean_length", "train/completions/mean_length", "completion_length")


@dataclass(frozen=True)
class BatchFacts:
    """What the run's configuration says about a step's batch (None: not said)."""

    train_batch_size: int | None = None  # prompts per step
    rollout_n: int | None = None  # responses per prompt
    step_samples: int | None = None  # responses per step where only their total is said (transformers)
    world_size: int | None = None  # data-parallel ranks (verl's global_seqlen partitions)
    max_prompt_length: int | None = None

    @property
    def samples_per_step(self) -> int | None:
        if self.train_batch_size:
            return int(self.train_batch_size) * int(self.rollout_n or 1)
        return int(self.step_samples) if self.step_samples else None


def empty_summaries() -> pl.DataFrame:
    return pl.DataFrame(schema=SUMMARY_SCHEMA)


def conform_summaries(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with every summary column (NULL where missing), in order, sorted by step."""
    cols = [pl.col(c).cast(t) if c in df.columns else pl.lit(None, t).alias(c) for c, t in SUMMARY_SCHEMA.items()]
    return df.select(cols).sort("step")


def summaries_from_samples(samples: pl.DataFrame, cap: float | None, tool_calls: pl.DataFrame | None = None,
                           samples_per_prompt: int | None = None) -> pl.DataFrame:
    """The summaries verl would print for each step of per-sample records (``samples``: training
    samples of full steps, warehouse columns). ``global_seqlen``: verl sums prompt + response tokens
    over ``world_size`` contiguous chunks of the batch in generation order; here the chunks are the
    run's DP ranks (the batch ordered by DP rank, local index, sample), so runs without DP ranks
    get none. The clip ratio counts responses at ``cap`` (0 when no cap is known, as verl compares
    with its configured cap)."""
    s = samples.with_columns(pl.col("prompt_tokens").cast(pl.Float64).fill_null(0.0),
                             pl.col("response_tokens").cast(pl.Float64))
    r, p = pl.col("response_tokens"), pl.col("prompt_tokens")
    at_cap = (r >= cap) if cap is not None else pl.lit(False)
    aggs = [
        pl.len().cast(pl.Float64).alias("n"),
        r.mean().alias("response_mean"), r.min().alias("response_min"), r.max().alias("response_max"),
        at_cap.mean().cast(pl.Float64).alias("response_clip_ratio"),
        p.mean().alias("prompt_mean"), p.min().alias("prompt_min"), p.max().alias("prompt_max"),
        pl.lit(0.0).alias("prompt_clip_ratio"),
        (r + p).sum().alias("total_tokens"),
    ]
    multi = "n_turns" in s.columns and bool((s["n_turns"].fill_null(1) > 1).any())
    if multi:
        nt = pl.col("n_turns").fill_null(1).cast(pl.Float64)
        aggs += [nt.mean().alias("turns_mean"), nt.min().alias("turns_min"), nt.max().alias("turns_max")]
    out = s.group_by("step").agg(aggs)
    if multi:
        tt = _tool_time_per_sample(s, tool_calls).group_by("step").agg(
            tool_time_mean=pl.col("tool_time_s").mean(), tool_time_min=pl.col("tool_time_s").min(),
            tool_time_max=pl.col("tool_time_s").max())
        out = out.join(tt, on="step", how="left")
    if "dp_rank" in s.columns and s["dp_rank"].drop_nulls().len() == s.height:
        order = [c for c in ("dp_rank", "local_index", "sample_id") if c in s.columns]
        ranks = s.sort("step", *order).group_by("step", "dp_rank").agg(t=(r + p).sum())
        sl = ranks.group_by("step").agg(seqlen_min=pl.col("t").min(), seqlen_max=pl.col("t").max(),
                                        seqlen_mean=pl.col("t").mean(), seqlen_ranks=pl.len().cast(pl.Float64))
        out = out.join(sl, on="step", how="left")
    k = float(samples_per_prompt) if samples_per_prompt else None
    out = out.with_columns(n_source=pl.lit("samples"), averaged_steps=pl.lit(1.0),
                           n_prompts=(pl.col("n") / k) if k else pl.lit(None, pl.Float64))
    return conform_summaries(out)


def _tool_time_per_sample(s: pl.DataFrame, tool_calls: pl.DataFrame | None) -> pl.DataFrame:
    if tool_calls is None or tool_calls.height == 0:
        return s.select("step", tool_time_s=pl.lit(0.0))
    tt = tool_calls.group_by("step", "sample_id").agg(tool_time_s=pl.col("latency_s").sum())
    return s.select("step", "sample_id").join(tt, on=["step", "sample_id"], how="left").with_columns(
        pl.col("tool_time_s").fill_null(0.0))


def summaries_from_metrics(step_metrics: pl.DataFrame, facts: BatchFacts | None = None) -> pl.DataFrame:
    """The summaries of a run's training steps from its ``step_metrics`` (validation rows left out).

    The batch's sample count ``n``: the config's (``facts``) when it gives one, else
    ``total_tokens / (prompt mean + response mean)`` (verl counts prompt and response tokens), else
    the step's increase of a cumulative token counter (TRL's ``num_tokens``) over the averaged
    steps divided by the same mean when prompt lengths are logged. Steps without a response mean
    are left out.
    """
    facts = facts or BatchFacts()
    m = step_metrics.filter(~pl.col("is_validation").fill_null(False))
    wanted = sorted({x for v in METRIC_COLUMNS.values() for x in v} | {CUMULATIVE_TOKENS})
    m = m.filter(pl.col("metric").is_in(wanted))
    if m.height == 0:
        return empty_summaries()
    averaged = bool(step_metrics.filter(pl.col("raw_metric").is_in(AVERAGED_SPELLINGS)).height)
    wide = m.group_by("step", "metric").agg(pl.col("value").last()).pivot(on="metric", index="step", values="value").sort("step")
    cols = []
    for col, names in METRIC_COLUMNS.items():
        present = [pl.col(x) for x in names if x in wide.columns]
        cols.append(pl.coalesce(present).cast(pl.Float64).alias(col) if present else pl.lit(None, pl.Float64).alias(col))
    if CUMULATIVE_TOKENS in wide.columns:
        cols.append(pl.col(CUMULATIVE_TOKENS).cast(pl.Float64).alias("_cum"))
    out = wide.select("step", *cols).filter(pl.col("response_mean").is_not_null())
    if bool(step_metrics.filter(pl.col("raw_metric").str.starts_with("num_turns/")).height):
        # verl's num_turns: user + assistant + 1 messages, two per assistant turn (module text)
        out = out.with_columns((pl.col(c) / 2).clip(lower_bound=1.0) for c in ("turns_mean", "turns_min", "turns_max"))
    if out.height == 0:
        return empty_summaries()
    # transformers counts steps from 1 and logs the mean since its previous log (the first: since step 0)
    gap = pl.col("step") - pl.col("step").shift(1).fill_null(0)
    out = out.with_columns(averaged_steps=pl.max_horizontal(gap, pl.lit(1)).cast(pl.Float64) if averaged else pl.lit(1.0))
    if "_cum" in out.columns and out["total_tokens"].null_count() == out.height:
        prev = pl.col("_cum").shift(1).fill_null(0.0)
        out = out.with_columns(total_tokens=(pl.col("_cum") - prev) / pl.col("averaged_steps"))
    per_sample = pl.col("prompt_mean") + pl.col("response_mean")
    tokens_n = (pl.col("total_tokens") / per_sample).round(0)
    config_n = facts.samples_per_step
    if config_n:
        out = out.with_columns(n=pl.lit(float(config_n)), n_source=pl.lit("config"))
    else:
        out = out.with_columns(n=tokens_n, n_source=pl.when(tokens_n.is_not_null()).then(pl.lit("tokens")))
    if facts.world_size:
        out = out.with_columns(seqlen_ranks=pl.lit(float(facts.world_size)))
    elif "seqlen_mean" in out.columns:
        # verl's global_seqlen/mean is the step's tokens over its partitions: the world size
        out = out.with_columns(seqlen_ranks=(pl.col("total_tokens") / pl.col("seqlen_mean")).round(0))
    k = facts.rollout_n if facts.train_batch_size else None
    out = out.with_columns(n_prompts=(pl.col("n") / float(k)) if k else pl.lit(None, pl.Float64))
    return conform_summaries(out.drop("_cum", strict=False))


def clipped_count(df: pl.DataFrame) -> np.ndarray:
    """Responses at the cap per row (the clip ratio times the row's samples; 0 where unknown)."""
    return (df["response_clip_ratio"].fill_null(0.0) * df["n"].fill_null(0.0)).to_numpy()
