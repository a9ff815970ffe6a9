"""Length distributions: exact quantiles, the empirical CDF, and drift across steps.

Only training samples count (``validate`` is not true). A prompt is counted once per
(run, step, group): the n responses sampled from one prompt share it, so counting it n times
would weight nothing differently but inflate ``n``. Samples of one group that carry different
prompt lengths (multi-turn records counting a trajectory's own turns) give one prompt row per
distinct length: picking one of them (``any_value``) made the quantiles depend on the query plan
(the demo's multi-turn run read prompt p50/p99 299/417 or 325/420, with or without a ``WHERE``).
Task is the sample's own, else the run's.

Partial steps (``training_health.partial``: a step cut short holds the responses that finished
first, the short ones) are flagged (``partial_step``), shown per step in ``length_drift``, and
left out of the quantiles, the CDF, the slope and the shift windows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.views.group import ReadView, View, ViewGroup
from analyses.views.sql import QUANTILE_DEFINITION, counted_quantiles, in_partial_step, ratio

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

# Relative change of the median response length that counts as a shift (see length_drift).
SHIFT_MIN_RATIO = 1.25
SHIFT_WINDOW = 3

SAMPLE_LENGTHS = View(
    "sample_lengths",
    f"""
WITH s AS (
    SELECT s.run_id, coalesce(s.task, r.task, 'unknown') AS task, s.step, s.sample_id,
           coalesce(s.group_id, s.sample_id) AS prompt_key, s.prompt_tokens, s.response_tokens,
           coalesce(s.truncated, s.response_tokens >= r.max_response_length) AS response_truncated,
           s.prompt_tokens >= r.max_prompt_length AS prompt_truncated,
           {in_partial_step("s")} AS partial_step
    FROM samples s LEFT JOIN runs r USING (run_id)
    WHERE NOT coalesce(s.validate, false)
)
SELECT run_id, task, step, 'response' AS kind, response_tokens AS tokens, response_truncated AS truncated, partial_step
FROM s WHERE response_tokens IS NOT NULL
UNION ALL
SELECT run_id, task, step, 'prompt' AS kind, prompt_tokens AS tokens, bool_or(prompt_truncated) AS truncated,
       bool_or(partial_step)
FROM s WHERE prompt_tokens IS NOT NULL
GROUP BY run_id, task, step, prompt_key, prompt_tokens
""",
    "One row per training response and per distinct prompt (run, step, group, and its length: the samples of a "
    "group share their prompt; multi-turn records whose samples carry different prompt lengths give a row per "
    "distinct length): run_id, task, step, "
    "kind ('prompt'|'response'), tokens, truncated (the sample's flag, else tokens >= the run's max length, "
    "runs.max_response_length: run.toml's or inferred; NULL when neither is known), partial_step (the step is "
    "partial, training_health.partial).",
)

LENGTH_QUANTILES = View(
    "length_quantiles",
    f"""
WITH h AS (
    -- one pass over sample_lengths (a view: each reference would scan samples again), into a
    -- histogram (quantile_disc cannot spill: see counted_quantiles); rows of partial steps count
    -- only in n_partial, the statistics see the full steps
    SELECT run_id, task, kind, tokens, partial_step, count(*) AS c, sum(CAST(truncated AS DOUBLE)) AS trunc_sum,
           count(truncated) AS trunc_n
    FROM sample_lengths GROUP BY ALL
), f AS (
    SELECT *, sum(c) OVER (PARTITION BY run_id, task, kind ORDER BY tokens
                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
           sum(c) OVER (PARTITION BY run_id, task, kind) AS total
    FROM h WHERE NOT partial_step
), q AS (
    SELECT run_id, task, kind, CAST(sum(c) AS BIGINT) AS n, CAST(sum(tokens * c) AS DOUBLE) / sum(c) AS mean,
           min(tokens) AS min, {counted_quantiles("tokens", "cum", "total")}, max(tokens) AS max,
           sum(trunc_sum) / NULLIF(sum(trunc_n), 0) AS truncation_share
    FROM f GROUP BY run_id, task, kind
), p AS (
    SELECT run_id, task, kind, CAST(sum(c) AS BIGINT) AS n_partial FROM h WHERE partial_step GROUP BY ALL
), q2 AS (
    SELECT q.*, p.n_partial FROM q LEFT JOIN p USING (run_id, task, kind)
)
SELECT q2.* EXCLUDE (n_partial), {ratio("max", "mean")} AS max_over_mean, {ratio("p99", "p50")} AS p99_over_p50, n_partial
FROM q2
""",
    "Per run x task x kind (prompt|response), over the full steps: n, mean, min, p50, p90, p99, p999, max, "
    "max_over_mean, p99_over_p50, truncation_share (share of rows with truncated, NULL when unknown), n_partial "
    f"(rows of partial steps, left out; NULL when none). Quantiles: {QUANTILE_DEFINITION}.",
)

LENGTH_CDF = View(
    "length_cdf",
    """
WITH c AS (
    SELECT run_id, task, kind, tokens AS value, count(*) AS n FROM sample_lengths WHERE NOT partial_step GROUP BY ALL
), w AS (
    SELECT c.*, sum(n) OVER w AS cum, sum(n) OVER (PARTITION BY run_id, task, kind) AS total FROM c
    WINDOW w AS (PARTITION BY run_id, task, kind ORDER BY value ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
), q AS (
    -- length_quantiles.p99 from the counts, without a second pass over sample_lengths:
    -- quantile_disc(x, q) is the ceil(n q)-th smallest value
    SELECT run_id, task, kind, min(value) FILTER (WHERE cum >= ceil(total * 0.99)) AS p99 FROM w GROUP BY ALL
)
SELECT w.run_id, w.task, w.kind, w.value, w.n, w.cum / w.total AS cdf, 1 - w.cum / w.total AS ccdf,
       1 - (w.cum - w.n) / w.total AS share_ge, w.value > q.p99 AS in_tail
FROM w JOIN q USING (run_id, task, kind)
""",
    "The exact empirical CDF over the full steps: one row per run x task x kind x distinct value, with n at that value, "
    "cdf = share <= value, ccdf = 1 - cdf = share > value, share_ge = share >= value (the survival function "
    "plotted on log-log axes: never 0, so the maximum shows), in_tail = value above the group's p99.",
)

# Change points: the mean log-median of the SHIFT_WINDOW steps from s on, against that of the
# SHIFT_WINDOW steps before s. Both windows must be full (no shift in the first/last steps), the
# jump must exceed ln(SHIFT_MIN_RATIO), and be the largest within +-2 steps so one level change
# is flagged once, at its first step.
LENGTH_DRIFT = View(
    "length_drift",
    f"""
WITH h AS (
    -- a histogram per step (quantile_disc cannot spill: see counted_quantiles)
    SELECT run_id, step, tokens, bool_or(partial_step) AS partial, count(*) AS c
    FROM sample_lengths WHERE kind = 'response' GROUP BY run_id, step, tokens
), hc AS (
    SELECT *, sum(c) OVER (PARTITION BY run_id, step ORDER BY tokens
                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
           sum(c) OVER (PARTITION BY run_id, step) AS total
    FROM h
), per_step AS (
    SELECT run_id, step, bool_or(partial) AS partial, CAST(sum(c) AS BIGINT) AS n,
           CAST(sum(tokens * c) AS DOUBLE) / sum(c) AS mean,
           {counted_quantiles("tokens", "cum", "total", (("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99)))},
           max(tokens) AS max
    FROM hc GROUP BY run_id, step
), win AS (
    SELECT *, ln(greatest(p50, 1)) AS log_p50,
           avg(ln(greatest(p50, 1))) OVER (PARTITION BY run_id ORDER BY step
               ROWS BETWEEN {SHIFT_WINDOW} PRECEDING AND 1 PRECEDING) AS before_mean,
           count(*) OVER (PARTITION BY run_id ORDER BY step
               ROWS BETWEEN {SHIFT_WINDOW} PRECEDING AND 1 PRECEDING) AS before_n,
           avg(ln(greatest(p50, 1))) OVER (PARTITION BY run_id ORDER BY step
               ROWS BETWEEN CURRENT ROW AND {SHIFT_WINDOW - 1} FOLLOWING) AS after_mean,
           count(*) OVER (PARTITION BY run_id ORDER BY step
               ROWS BETWEEN CURRENT ROW AND {SHIFT_WINDOW - 1} FOLLOWING) AS after_n
    FROM per_step WHERE NOT partial
), jump AS (
    SELECT *, CASE WHEN before_n = {SHIFT_WINDOW} AND after_n = {SHIFT_WINDOW}
                   THEN after_mean - before_mean END AS log_jump
    FROM win
), full_steps AS (
    SELECT run_id, step,
           CASE WHEN count(*) OVER (PARTITION BY run_id) >= 2
                THEN regr_slope(log_p50, step) OVER (PARTITION BY run_id) END AS run_log_p50_slope_per_step,
           exp(log_jump) AS shift_ratio,
           coalesce(abs(log_jump) > ln({SHIFT_MIN_RATIO})
                    AND abs(log_jump) = max(abs(log_jump)) OVER (PARTITION BY run_id ORDER BY step
                                                                 ROWS BETWEEN 2 PRECEDING AND 2 FOLLOWING),
                    false) AS is_shift
    FROM jump
)
SELECT p.run_id, p.step, p.partial, p.n, p.mean, p.p10, p.p50, p.p90, p.p99, p.max,
       max(f.run_log_p50_slope_per_step) OVER (PARTITION BY p.run_id) AS run_log_p50_slope_per_step,
       f.shift_ratio, coalesce(f.is_shift, false) AS is_shift
FROM per_step p LEFT JOIN full_steps f USING (run_id, step)
""",
    "Per run x step: partial (a partial step: shown, left out of the slope and the shift windows), response-length "
    "n, mean, p10, p50, p90, p99, max; run_log_p50_slope_per_step = "
    "least-squares slope of ln(p50) against step over the run's full steps (0.01 ~ +1%/step; NULL with fewer than 2); "
    "shift_ratio = "
    f"exp(mean ln p50 of steps [s, s+{SHIFT_WINDOW - 1}] - mean ln p50 of the {SHIFT_WINDOW} steps before s); "
    f"is_shift when shift_ratio > {SHIFT_MIN_RATIO} or < 1/{SHIFT_MIN_RATIO} and it is the largest jump within "
    "+-2 steps (both windows full).",
)

def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    cdf, q = read("length_cdf"), read("length_quantiles")
    return [F.FigureSpec("lengths__cdf_response", F.length_cdf_figure(cdf, q, "response"), True),
            F.FigureSpec("lengths__cdf_prompt", F.length_cdf_figure(cdf, q, "prompt")),
            *F.per_run(read("length_drift"), runs, "lengths__drift", F.length_drift_figure, True)]


GROUP = ViewGroup(
    name="lengths",
    order=10,
    title="Length distributions",
    question="How long are prompts and responses, how heavy is the tail, and does it drift?",
    needs="samples (prompt_tokens / response_tokens)",
    main=LENGTH_QUANTILES,
    views=(SAMPLE_LENGTHS, LENGTH_QUANTILES, LENGTH_CDF, LENGTH_DRIFT),
    headline_sql="""
        SELECT run_id, task, kind, n, round(mean, 1) AS mean, p50, p90, p99, p999, max,
               round(max_over_mean, 2) AS max_over_mean, round(p99_over_p50, 2) AS p99_over_p50,
               round(truncation_share, 4) AS truncation_share
        FROM length_quantiles ORDER BY run_id, task, kind DESC""",
    figures=_figures,
)
