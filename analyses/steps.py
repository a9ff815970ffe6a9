"""From long ``step_metrics`` to one ``steps`` row per training step.

Canonical names: verl wrote stage timings as ``timing/<stage>`` until early 2025 and as
``timing_s/<stage>`` since; :func:`canonical_metric` maps both to ``timing_s/<stage>`` so the
same column is filled whatever generation wrote the log. A stage may be logged under more than
one name across generations (``gen`` vs ``generate_sequences``); :data:`STEP_COLUMNS` lists the
candidates per column, first present wins.
"""

from __future__ import annotations

import polars as pl

from analyses.schema import STEPS, conform

# steps column -> metric names (canonical), first present wins
STEP_COLUMNS: dict[str, tuple[str, ...]] = {
    "gen_time_s": ("timing_s/gen", "timing_s/generate_sequences", "timing_s/get_batch_rollout_with_filtering"),
    "reward_time_s": ("timing_s/reward", "timing_s/reward_fn"),
    "old_log_prob_time_s": ("timing_s/old_log_prob",),
    "ref_time_s": ("timing_s/ref",),
    "values_time_s": ("timing_s/values",),
    "adv_time_s": ("timing_s/adv",),
    "update_actor_time_s": ("timing_s/update_actor",),
    "update_critic_time_s": ("timing_s/update_critic",),
    "tool_time_s": ("timing_s/tool_calls", "timing_s/agent_loop/slowest/tool_calls"),
    "total_tokens": ("perf/total_num_tokens",),
    "response_len_mean": ("response_length/mean",),
    "response_len_max": ("response_length/max",),
    "response_len_min": ("response_length/min",),
    "response_clip_ratio": ("response_length/clip_ratio",),
    "prompt_len_mean": ("prompt_length/mean",),
    "prompt_len_max": ("prompt_length/max",),
    "prompt_len_min": ("prompt_length/min",),
}
LOGGED_STEP_TIME = "timing_s/step"
PER_GPU_THROUGHPUT = "perf/throughput"
# stages whose sum stands in for the step time when the log has no timing_s/step (verl < 0.2)
STAGE_COLUMNS = (
    "gen_time_s", "reward_time_s", "old_log_prob_time_s", "ref_time_s", "values_time_s", "adv_time_s",
    "update_actor_time_s", "update_critic_time_s",
)
VALIDATION_PREFIXES = ("val/", "val-core/", "val-aux/", "val_", "test_score/", "test/", "validation/")


def canonical_metric(raw: pl.Expr) -> pl.Expr:
    """``timing/x`` -> ``timing_s/x``; everything else unchanged."""
    return raw.str.replace(r"^timing/", "timing_s/")


def is_validation_metric(metric: pl.Expr) -> pl.Expr:
    """Metrics that only validation writes (verl's val-core/, val-aux/, older test_score/...)."""
    return pl.any_horizontal([metric.str.starts_with(p) for p in VALIDATION_PREFIXES])


def derive_steps(
    step_metrics: pl.LazyFrame,
    step_attrs: pl.LazyFrame | None = None,
    n_gpus: int | None = None,
) -> pl.DataFrame:
    """One row per training step (a step with at least one non-validation metric).

    When the same (step, metric) was logged more than once (a resumed run re-logging a step,
    or two files of one run), the last occurrence in (path, line) order wins.
    ``step_attrs`` holds reader-provided per-step facts (``ts``, ``truncated_line``).
    """
    wanted = {m for names in STEP_COLUMNS.values() for m in names} | {LOGGED_STEP_TIME, PER_GPU_THROUGHPUT}
    sm = step_metrics.select("step", "metric", "value", "is_validation", "path", "line_no")
    training_steps = sm.filter(~pl.col("is_validation")).select("step").unique()
    val_steps = sm.filter(pl.col("is_validation")).select("step").unique().with_columns(has_validation=pl.lit(True))
    last = (
        sm.filter(~pl.col("is_validation") & pl.col("metric").is_in(list(wanted)))
        .sort("path", "line_no")
        .group_by("step", "metric")
        .agg(pl.col("value").last())
        .collect()
    )
    wide = last.pivot(on="metric", index="step", values="value") if last.height else pl.DataFrame({"step": []}, schema={"step": pl.Int64})
    for m in wanted:
        if m not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(m))
    cols = [pl.coalesce([pl.col(m) for m in names]).alias(col) for col, names in STEP_COLUMNS.items()]
    out = wide.select("step", LOGGED_STEP_TIME, PER_GPU_THROUGHPUT, *cols)
    stage_sum = pl.sum_horizontal([pl.col(c) for c in STAGE_COLUMNS])
    any_stage = pl.any_horizontal([pl.col(c).is_not_null() for c in STAGE_COLUMNS])
    out = out.with_columns(
        step_time_s=pl.coalesce(pl.col(LOGGED_STEP_TIME), pl.when(any_stage).then(stage_sum)),
        step_time_source=pl.when(pl.col(LOGGED_STEP_TIME).is_not_null())
        .then(pl.lit("logged"))
        .when(any_stage)
        .then(pl.lit("sum_of_stages")),
    )
    # verl's perf/throughput is per GPU; the job's throughput is tokens over step time
    job_tp = pl.col("total_tokens") / pl.col("step_time_s")
    per_gpu = pl.col(PER_GPU_THROUGHPUT) * (n_gpus if n_gpus else None)
    out = out.with_columns(throughput_tokens_per_s=pl.coalesce(job_tp, per_gpu))
    out = training_steps.collect().join(out, on="step", how="left")
    out = out.join(val_steps.collect(), on="step", how="left").with_columns(pl.col("has_validation").fill_null(False))
    if step_attrs is not None:
        attrs = (
            step_attrs.group_by("step")
            .agg(pl.col("ts").drop_nulls().last(), pl.col("truncated_line").fill_null(False).any())
            .collect()
        )
        out = out.join(attrs, on="step", how="left")
    out = out.with_columns(pl.col("truncated_line").fill_null(False)) if "truncated_line" in out.columns else out
    return conform(out.sort("step"), STEPS)
