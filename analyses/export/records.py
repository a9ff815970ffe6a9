"""Generated workloads as the records export formats share: one row per prompt (packed
lengths), one per trajectory (multi-turn), one per inference request (request traces)."""

from __future__ import annotations

from typing import Any

import polars as pl

from analyses.export.sampler import Generated

DEFAULT_STEP_INTERVAL_S = 60.0  # arrival spacing of steps in request traces, when no step time is known


def packed_records(samples: pl.DataFrame) -> pl.DataFrame:
    """One row per prompt, columns in PolyTrace's packed_lengths order."""
    return (
        samples.sort("step", "group", "sample_index")
        .group_by("step", "group", maintain_order=True)
        .agg(
            rank=pl.col("rank").first(), dp_rank=pl.col("dp_rank").first(), tp_rank=pl.col("tp_rank").first(),
            local_index=pl.col("local_index").first(), input=pl.col("prompt_tokens").first(), output=pl.col("response_tokens"),
        )
        .with_columns(n_sampling=pl.col("output").list.len().cast(pl.Int64), validate=pl.lit(False))
        .sort("step", "dp_rank", "rank", "local_index")
        .select("step", "rank", "dp_rank", "tp_rank", "local_index", "input", "output", "n_sampling", "validate")
    )


def multiturn_records(g: Generated, cap: float | None) -> pl.DataFrame:
    assert g.turns is not None and g.tool_calls is not None
    keys = ["step", "group", "sample_index"]
    turns = g.turns.sort(*keys, "turn").group_by(keys, maintain_order=True).agg(
        turns=pl.struct("turn", "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason", "tool_call_count",
                        "engine_latency_s")
    )
    calls = g.tool_calls.sort(*keys, "turn", "call_index").group_by(keys, maintain_order=True).agg(
        tool_calls=pl.struct("turn", "tool_name", "latency_s", pl.col("response_tokens").alias("response_token_len"), "status")
    )
    s = g.samples.join(turns, on=keys, how="left").join(calls, on=keys, how="left")
    return s.sort(*keys).select(
        "step",
        prompt_len="prompt_tokens",
        max_response_len=pl.lit(int(cap) if cap is not None else None, pl.Int64),
        turns="turns",
        tool_calls=pl.col("tool_calls").fill_null(pl.lit([], dtype=calls.schema["tool_calls"])),
        finish_reason=pl.when(pl.col("truncated")).then(pl.lit("length")).otherwise(pl.lit("stop")),
        final_response_len="response_tokens",
        turn_count="n_turns",
        tool_call_count="n_tool_calls",
        validate=pl.lit(False),
        prompt_group_id="group",
        sample_id="sample_index",
    )


def request_timeline(g: Generated, w: dict[str, Any], step_interval_s: float | None) -> pl.DataFrame:
    """One row per inference request: arrival (s), prefill and decode tokens, group/session ids."""
    interval = step_interval_s if step_interval_s is not None else DEFAULT_STEP_INTERVAL_S
    first = int(w["batch"].get("first_step", 0))
    if g.turns is None:
        r = g.samples.select(
            "step", "group", "sample_index", turn=pl.lit(0, pl.Int64), offset_s=pl.lit(0.0),
            prefill="prompt_tokens", decode="response_tokens", cached=pl.lit(0, pl.Int64),
        )
        r = r.with_columns(tool_calls=pl.lit(None, dtype=pl.List(pl.Struct({"name": pl.String, "latency_ms": pl.Float64, "response_length": pl.Int64}))))
    else:
        keys = ["step", "group", "sample_index"]
        tool_t = g.tool_calls.group_by(*keys, "turn").agg(
            tool_s=pl.col("latency_s").sum(),
            tool_calls=pl.struct(name="tool_name", latency_ms=pl.col("latency_s") * 1000, response_length="response_tokens"),
        )
        t = g.turns.join(tool_t, on=[*keys, "turn"], how="left").sort(*keys, "turn").with_columns(
            busy=pl.col("engine_latency_s").fill_null(0) + pl.col("tool_s").fill_null(0)
        )
        r = t.with_columns(offset_s=(pl.col("busy").cum_sum() - pl.col("busy")).over(keys)).select(
            *keys, "turn", "offset_s", prefill="prompt_tokens", decode="completion_tokens", cached="cached_tokens",
            tool_calls="tool_calls",
        )
    return r.with_columns(arrived_at=(pl.col("step") - first) * interval + pl.col("offset_s")).sort("arrived_at", "step", "group", "sample_index", "turn")
