"""Load imbalance across DP ranks (tokens and time) and within a rollout batch.

Every row compares the units of one (run, step, phase, quantity): max/mean, max/min, max-min,
and idle_share = 1 - mean/max, the share of the units' capacity spent waiting for the busiest one
(for a rollout batch: the share of decode slots idle while the longest response finishes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.views.group import ReadView, View, ViewGroup
from analyses.views.sql import ratio

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

RANK_IMBALANCE = View(
    "rank_imbalance",
    f"""
WITH train_samples AS (
    SELECT * FROM samples WHERE NOT coalesce(validate, false)
), per_unit AS (
    -- tokens per DP rank from the samples each rank generated
    SELECT run_id, step, 'rollout' AS phase, 'response_tokens' AS quantity, 'samples' AS source,
           'dp_rank' AS unit, dp_rank AS unit_id, CAST(sum(response_tokens) AS DOUBLE) AS v
    FROM train_samples WHERE dp_rank IS NOT NULL AND response_tokens IS NOT NULL GROUP BY ALL
    UNION ALL
    SELECT run_id, step, 'rollout', 'sequence_tokens', 'samples', 'dp_rank', dp_rank,
           CAST(sum(coalesce(prompt_tokens, 0) + response_tokens) AS DOUBLE)
    FROM train_samples WHERE dp_rank IS NOT NULL AND response_tokens IS NOT NULL GROUP BY ALL
    UNION ALL
    -- time (and tokens, when recorded) per rank and phase
    -- a normalised trace (PAI: 0..1000 per job) is not in seconds: its ratios hold, its unit does not
    SELECT run_id, step, phase, CASE WHEN source LIKE '%:normalised%' THEN 'time_normalised' ELSE 'seconds' END,
           'rank_times', 'rank', rank, seconds
    FROM rank_times WHERE seconds IS NOT NULL
    UNION ALL
    SELECT run_id, step, phase, 'tokens', 'rank_times', 'rank', rank, CAST(tokens AS DOUBLE)
    FROM rank_times WHERE tokens IS NOT NULL
), agg AS (
    SELECT run_id, step, phase, quantity, source, unit, count(*) AS n_units,
           max(v) AS max, avg(v) AS mean, min(v) AS min,
           -- the busiest unit (lowest id on a tie)
           min(unit_id) FILTER (WHERE v = max_v) AS busiest_unit_id
    FROM (SELECT *, max(v) OVER (PARTITION BY run_id, step, phase, quantity, source, unit) AS max_v FROM per_unit)
    GROUP BY run_id, step, phase, quantity, source, unit
    UNION ALL
    -- within a rollout batch: every response of the step is one decode slot. Slots have no id, so
    -- no busiest unit, and no window over every response (19 s of 20 at 51 M samples)
    SELECT run_id, step, 'rollout_batch', 'response_tokens', 'samples', 'sample', count(*),
           max(v), avg(v), min(v), CAST(NULL AS BIGINT)
    FROM (SELECT run_id, step, CAST(response_tokens AS DOUBLE) AS v FROM train_samples WHERE response_tokens IS NOT NULL)
    GROUP BY run_id, step
), seqlen AS (
    -- verl's global_seqlen/* : tokens per DP rank of the training batch, before and after balancing
    SELECT run_id, step,
           max(value) FILTER (WHERE metric = 'global_seqlen/max') AS mx,
           max(value) FILTER (WHERE metric = 'global_seqlen/min') AS mn,
           max(value) FILTER (WHERE metric = 'global_seqlen/mean') AS me,
           max(value) FILTER (WHERE metric = 'global_seqlen/balanced_max') AS bmx,
           max(value) FILTER (WHERE metric = 'global_seqlen/balanced_min') AS bmn
    FROM step_metrics WHERE NOT coalesce(is_validation, false) AND metric LIKE 'global_seqlen/%'
    GROUP BY run_id, step
), all_rows AS (
    SELECT * FROM agg
    UNION ALL
    SELECT run_id, step, 'train_batch', 'sequence_tokens', 'step_metrics', 'dp_rank', NULL, mx, me, mn, NULL
    FROM seqlen WHERE mx IS NOT NULL
    UNION ALL
    SELECT run_id, step, 'train_batch_balanced', 'sequence_tokens', 'step_metrics', 'dp_rank', NULL, bmx, me, bmn, NULL
    FROM seqlen WHERE bmx IS NOT NULL
)
SELECT run_id, step, phase, quantity, source, unit, n_units, busiest_unit_id, max, mean, min,
       {ratio("max", "mean")} AS max_over_mean, {ratio("max", "min")} AS max_over_min,
       max - min AS max_minus_min, 1 - {ratio("mean", "max")} AS idle_share
FROM all_rows
""",
    "Per run x step x phase x quantity: n_units, busiest_unit_id (the rank / dp_rank holding the max, the lowest on "
    "a tie; NULL for a rollout batch and for global_seqlen, which names no rank), max, mean, min, max_over_mean, "
    "max_over_min, max_minus_min, idle_share = 1 - mean/max. Sources: samples summed per dp_rank (phase 'rollout', response_tokens and "
    "sequence_tokens = prompt + response); rank_times per rank (its phases; seconds, or time_normalised when the source "
    "normalised its times (PAI's 0..1000), and tokens); verl's "
    "global_seqlen/{max,min,mean} (phase 'train_batch') and balanced_{max,min} ('train_batch_balanced'); "
    "and phase 'rollout_batch', unit 'sample': every response of the step (longest/mean response; idle_share "
    "= idle share of decode slots).",
)

def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    return F.per_run(read("rank_imbalance"), runs, "rank_imbalance__per_step", F.imbalance_figure, True)


GROUP = ViewGroup(
    name="rank_imbalance",
    order=40,
    title="Load imbalance",
    question="How unevenly is work spread across DP ranks and across a rollout batch?",
    needs="samples with dp_rank, rank_times, or global_seqlen/* metrics",
    main=RANK_IMBALANCE,
    views=(RANK_IMBALANCE,),
    # the most often busiest unit: the lowest id on a tie (mode() picks any of them)
    headline_sql="""
        WITH busy AS (
            SELECT run_id, phase, quantity, arg_max(u, (n, -u)) AS unit, max(n) AS n
            FROM (SELECT run_id, phase, quantity, busiest_unit_id AS u, count(*) AS n FROM rank_imbalance
                  WHERE busiest_unit_id IS NOT NULL GROUP BY ALL)
            GROUP BY ALL
        )
        SELECT run_id, phase, quantity, count(*) AS steps, round(median(max_over_mean), 3) AS median_max_over_mean,
               round(min(max_over_mean), 3) AS min_max_over_mean, round(max(max_over_mean), 3) AS max_max_over_mean,
               round(max(max_over_min), 3) AS max_max_over_min, round(avg(idle_share), 3) AS mean_idle_share,
               arg_max(step, (max_over_mean, -step)) AS worst_step,
               arg_max(busiest_unit_id, (max_over_mean, -step)) AS worst_step_busiest,
               b.unit AS most_often_busiest, coalesce(b.n, 0) AS most_often_busiest_steps
        FROM rank_imbalance LEFT JOIN busy b USING (run_id, phase, quantity)
        GROUP BY run_id, phase, quantity, b.unit, b.n ORDER BY run_id, phase, quantity""",
    figures=_figures,
)
