"""Per-step throughput and time variance, and the stage-time breakdown, from ``steps``.

Outliers use Tukey's fences on quantile_cont (linear interpolation): a step is an outlier of a
metric when its value is below Q1 - 1.5 IQR or above Q3 + 1.5 IQR of that run's steps.
"""

from __future__ import annotations

from analyses.catalog import register_view
from analyses.views._common import ratio

STEP_SERIES_METRICS = ("throughput_tokens_per_s", "step_time_s", "gen_time_s")
TUKEY_K = 1.5

_long = "\nUNION ALL\n".join(
    f"SELECT run_id, step, '{m}' AS metric, {m} AS value FROM steps WHERE {m} IS NOT NULL"
    for m in STEP_SERIES_METRICS
)

register_view(
    "step_series",
    f"""
WITH long AS ({_long}),
fences AS (
    SELECT run_id, metric, quantile_cont(value, 0.25) AS q1, quantile_cont(value, 0.75) AS q3
    FROM long GROUP BY run_id, metric
)
SELECT l.run_id, l.step, l.metric, l.value,
       l.value < f.q1 - {TUKEY_K} * (f.q3 - f.q1) OR l.value > f.q3 + {TUKEY_K} * (f.q3 - f.q1) AS is_outlier
FROM long l JOIN fences f USING (run_id, metric)
""",
    "Per run x step x metric (throughput_tokens_per_s, step_time_s, gen_time_s): value, is_outlier "
    f"(Tukey fences: outside [Q1 - {TUKEY_K} IQR, Q3 + {TUKEY_K} IQR] of the run's steps, quantile_cont).",
)

register_view(
    "step_variance",
    f"""
SELECT run_id, metric, count(*) AS n_steps, avg(value) AS mean, stddev_samp(value) AS std,
       {ratio("stddev_samp(value)", "avg(value)")} AS cv, min(value) AS min,
       quantile_cont(value, 0.5) AS median, max(value) AS max,
       {ratio("max(value)", "min(value)")} AS max_over_min,
       count(*) FILTER (WHERE is_outlier) AS n_outliers,
       list(step ORDER BY step) FILTER (WHERE is_outlier) AS outlier_steps
FROM step_series GROUP BY run_id, metric
""",
    "Per run x metric (throughput_tokens_per_s, step_time_s, gen_time_s): n_steps, mean, std (sample), "
    "cv = std/mean, min, median (quantile_cont), max, max_over_min, n_outliers and outlier_steps (Tukey fences, "
    "see step_series).",
)

# Stage groups of verl's timing keys. adv (advantage computation) is CPU-side and cheap; it is
# counted in `other` with whatever the step time does not explain.
_INFER = "coalesce(reward_time_s, 0) + coalesce(old_log_prob_time_s, 0) + coalesce(ref_time_s, 0) + coalesce(values_time_s, 0)"
_TRAIN = "coalesce(update_actor_time_s, 0) + coalesce(update_critic_time_s, 0)"

register_view(
    "stage_breakdown",
    f"""
WITH t AS (
    SELECT run_id, step, step_time_s, step_time_source,
           coalesce(gen_time_s, 0) AS rollout_s, {_INFER} AS inference_s, {_TRAIN} AS training_s
    FROM steps
    WHERE gen_time_s IS NOT NULL OR reward_time_s IS NOT NULL OR old_log_prob_time_s IS NOT NULL
       OR ref_time_s IS NOT NULL OR values_time_s IS NOT NULL OR update_actor_time_s IS NOT NULL
       OR update_critic_time_s IS NOT NULL
), d AS (
    SELECT *, greatest(coalesce(step_time_s, 0), rollout_s + inference_s + training_s) AS denom_s FROM t
)
SELECT run_id, step, step_time_s, step_time_source, rollout_s, inference_s, training_s,
       denom_s - rollout_s - inference_s - training_s AS other_s,
       {ratio("rollout_s", "denom_s")} AS rollout_share,
       {ratio("inference_s", "denom_s")} AS inference_share,
       {ratio("training_s", "denom_s")} AS training_share,
       {ratio("denom_s - rollout_s - inference_s - training_s", "denom_s")} AS other_share
FROM d
""",
    "Per run x step: seconds and share of rollout (gen), inference (reward + old_log_prob + ref + values) and "
    "training (update_actor + update_critic); other = step time not explained by those (adv, checkpointing, "
    "overheads). Shares are of max(step_time_s, sum of stages), so they sum to 1 even when stages overlap.",
)
