"""Generated workloads as the records export formats share: one row per prompt (packed
lengths), one per trajectory (multi-turn), one per inference request (request traces)."""

from __future__ import annotations

from typing import Any

import polars as pl

from analyses.fit.sampler import Generated

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


def multiturn_records(g: Generated, cap: float | None, overhead_tokens: float = 0.0) -> pl.DataFrame:
    """One row per trajectory, with every field upstream's multi-turn replay uses
    (``_async_replay_workload_request``): each turn starts at ``generation_prompt_len`` (its context),
    grows by ``assistant_append_len`` (the completion, all of it in the loss:
    ``assistant_loss_len``) and by each of its tool calls' ``append_len`` (the tool's response and
    its ``overhead_tokens`` of chat template, none in the loss: ``loss_len`` 0), so the next turn's
    context is exactly where the appends end and a replay prefills exactly the turns' own
    ``prompt_tokens``; ``response_loss_mask_rle`` is the same account as ``[in_loss, tokens]`` runs,
    cut at ``final_response_len``."""
    assert g.turns is not None and g.tool_calls is not None
    keys = ["step", "group", "sample_index"]
    per_call = int(round(overhead_tokens))
    t = g.turns.sort(*keys, "turn").with_columns(next_prompt=pl.col("prompt_tokens").shift(-1).over(keys))
    c = g.tool_calls.sort(*keys, "turn", "call_index").with_columns(
        base=pl.col("response_tokens") + per_call, last=pl.col("call_index") == pl.col("call_index").max().over(*keys, "turn"))
    # the turn's tool appends end at the next turn's context; the last call of the turn takes the rounding
    grown = t.select(*keys, "turn", grown=pl.col("next_prompt") - pl.col("prompt_tokens") - pl.col("completion_tokens"))
    c = c.join(grown, on=[*keys, "turn"], how="left").with_columns(
        append_len=pl.when(pl.col("last") & pl.col("grown").is_not_null())
        .then(pl.max_horizontal(pl.col("grown") - (pl.col("base").sum() - pl.col("base")).over(*keys, "turn"), pl.lit(0)))
        .otherwise(pl.col("base")).cast(pl.Int64))
    turns = t.group_by(keys, maintain_order=True).agg(
        turns=pl.struct(
            "turn", pl.col("prompt_tokens").alias("generation_prompt_len"), "prompt_tokens", "cached_tokens",
            "completion_tokens", pl.col("completion_tokens").alias("assistant_append_len"),
            pl.col("completion_tokens").alias("assistant_loss_len"), "finish_reason", "tool_call_count", "engine_latency_s",
        )
    )
    calls = c.group_by(keys, maintain_order=True).agg(
        tool_calls=pl.struct("turn", "tool_name", "latency_s", pl.col("response_tokens").alias("response_token_len"),
                             "append_len", loss_len=pl.lit(0, pl.Int64), status="status")
    )
    s = g.samples.join(turns, on=keys, how="left").join(calls, on=keys, how="left")
    s = s.join(_loss_mask_rle(t, c, g.samples, keys), on=keys, how="left")
    return s.sort(*keys).select(
        "step",
        prompt_len="prompt_tokens",
        max_response_len=pl.lit(int(cap) if cap is not None else None, pl.Int64),
        turns="turns",
        tool_calls=pl.col("tool_calls").fill_null(pl.lit([], dtype=calls.schema["tool_calls"])),
        finish_reason=pl.when(pl.col("truncated")).then(pl.lit("length")).otherwise(pl.lit("stop")),
        final_response_len="response_tokens",
        response_loss_mask_rle="response_loss_mask_rle",
        turn_count="n_turns",
        tool_call_count="n_tool_calls",
        validate=pl.lit(False),
        prompt_group_id="group",
        sample_id="sample_index",
    )


def _loss_mask_rle(turns: pl.DataFrame, calls: pl.DataFrame, samples: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per trajectory, ``[[1, completion], [0, tool append], ...]`` in order, adjacent equal values
    merged, cut at the sample's ``response_tokens`` (its ``final_response_len``)."""
    runs = pl.concat([
        turns.select(*keys, "turn", k=pl.lit(0, pl.Int64), v=pl.lit(1, pl.Int64), n=pl.col("completion_tokens").cast(pl.Int64)),
        calls.select(*keys, "turn", k=pl.col("call_index").cast(pl.Int64) + 1, v=pl.lit(0, pl.Int64), n="append_len"),
    ]).sort(*keys, "turn", "k")
    runs = runs.join(samples.select(*keys, final="response_tokens"), on=keys).with_columns(end=pl.col("n").cum_sum().over(keys))
    runs = runs.with_columns(n=pl.min_horizontal(pl.col("n"), pl.max_horizontal(pl.col("final") - (pl.col("end") - pl.col("n")), 0)))
    runs = runs.filter(pl.col("n") > 0).with_columns(run=(pl.col("v") != pl.col("v").shift(1)).fill_null(True).cum_sum().over(keys))
    merged = runs.group_by(*keys, "run", maintain_order=True).agg(pl.col("v").first(), pl.col("n").sum())
    return merged.group_by(keys, maintain_order=True).agg(response_loss_mask_rle=pl.concat_list("v", "n"))


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
