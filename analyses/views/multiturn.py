"""Multi-turn structure: turns and tool calls per trajectory, prefix-cache share, engine latency.

A trajectory is a training sample with turn information: rows in ``turns``, or ``n_turns``
recorded on the sample. Its turn count is the sample's ``n_turns`` when recorded, else its
number of ``turns`` rows; its tool-call count is ``n_tool_calls``, else its ``tool_calls`` rows.

Trajectories of a partial step (``training_health.partial``: Search-R1's last step, 47 trajectories
after 2048) are flagged (``partial_step``) and counted (``partial_trajectories``) but left out of
the means, quantiles, shares and pmfs: the trajectories that finish first are the short ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.views.group import ReadView, View, ViewGroup
from analyses.views.sql import in_partial_step, ratio, training_rows

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

# turns and tool calls of validation samples are not part of the training workload
_turns = training_rows("turns")
_calls = training_rows("tool_calls")

TRAJECTORIES = View(
    "trajectories",
    f"""
WITH t AS (
    SELECT run_id, step, sample_id, count(*) AS turn_rows, CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
           CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens, CAST(sum(completion_tokens) AS BIGINT) AS completion_tokens,
           sum(engine_latency_s) AS engine_latency_s
    FROM {_turns} GROUP BY ALL
), c AS (
    SELECT run_id, step, sample_id, count(*) AS call_rows FROM {_calls} GROUP BY ALL
), s AS (
    SELECT run_id, step, sample_id, n_turns, n_tool_calls FROM samples
    WHERE NOT coalesce(validate, false) AND (n_turns IS NOT NULL OR n_tool_calls IS NOT NULL)
)
-- a trajectory has turn rows, or turn counts on its sample, or both: one full join (a union of
-- the keys joined back to both sides cost twice as much at 14 M trajectories)
SELECT run_id, step, sample_id, {in_partial_step("k")} AS partial_step,
       coalesce(k.n_turns, k.turn_rows) AS n_turns,
       coalesce(k.n_tool_calls, c.call_rows, 0) AS n_tool_calls,
       k.prompt_tokens, k.cached_tokens, k.completion_tokens, k.engine_latency_s
FROM (SELECT * FROM t FULL JOIN s USING (run_id, step, sample_id)) k LEFT JOIN c USING (run_id, step, sample_id)
""",
    "One row per trajectory: partial_step (its step is partial), n_turns, n_tool_calls, and over its turns: prompt_tokens, cached_tokens, "
    "completion_tokens, engine_latency_s (sums).",
)

# turns of full steps only (a partial step's turns are shown in trajectories, never averaged)
_full_turns = f"(SELECT * EXCLUDE (in_partial) FROM (SELECT u.*, {in_partial_step('u')} AS in_partial FROM {_turns} u) WHERE NOT in_partial)"

MULTITURN = View(
    "multiturn",
    f"""
WITH per_run AS (
SELECT run_id, count(*) FILTER (WHERE NOT partial_step) AS trajectories,
       count(*) FILTER (WHERE partial_step) AS partial_trajectories,
       avg(n_turns) FILTER (WHERE NOT partial_step) AS turns_mean,
       quantile_disc(n_turns, 0.5) FILTER (WHERE NOT partial_step) AS turns_p50,
       quantile_disc(n_turns, 0.9) FILTER (WHERE NOT partial_step) AS turns_p90,
       max(n_turns) FILTER (WHERE NOT partial_step) AS turns_max,
       avg(n_tool_calls) FILTER (WHERE NOT partial_step) AS tool_calls_mean,
       quantile_disc(n_tool_calls, 0.9) FILTER (WHERE NOT partial_step) AS tool_calls_p90,
       max(n_tool_calls) FILTER (WHERE NOT partial_step) AS tool_calls_max,
       {ratio("sum(cached_tokens) FILTER (WHERE NOT partial_step)", "sum(prompt_tokens) FILTER (WHERE NOT partial_step)")}
           AS prefix_cache_share
FROM trajectories GROUP BY run_id
), latency AS (
    -- one pass over the turns for both quantiles (a subquery per column scanned them twice)
    SELECT run_id, quantile_disc(engine_latency_s, 0.5) AS turn_latency_p50_s,
           quantile_disc(engine_latency_s, 0.99) AS turn_latency_p99_s
    FROM {_full_turns} GROUP BY run_id
)
SELECT per_run.*, latency.turn_latency_p50_s, latency.turn_latency_p99_s FROM per_run LEFT JOIN latency USING (run_id)
""",
    "Per run, over the trajectories of full steps: trajectories, partial_trajectories (of partial steps: counted, "
    "left out of the rest), turns per trajectory (mean, p50, p90, max), tool calls per trajectory (mean, p90, "
    "max), prefix_cache_share = cached / prompt tokens over all turns, engine latency per turn (p50, p99, s).",
)

MULTITURN_PMF = View(
    "multiturn_pmf",
    """
WITH v AS (
    SELECT run_id, 'turns' AS variable, n_turns AS value FROM trajectories WHERE n_turns IS NOT NULL AND NOT partial_step
    UNION ALL
    SELECT run_id, 'tool_calls', n_tool_calls FROM trajectories WHERE n_tool_calls IS NOT NULL AND NOT partial_step
)
SELECT run_id, variable, value, count(*) AS n,
       count(*) / sum(count(*)) OVER (PARTITION BY run_id, variable) AS share
FROM v GROUP BY run_id, variable, value
""",
    "pmf per run (full steps) of turns per trajectory and tool calls per trajectory (variable 'turns'|'tool_calls'): "
    "value, n, share.",
)

MULTITURN_BY_TURN = View(
    "multiturn_by_turn",
    f"""
SELECT run_id, turn, count(*) AS n, avg(prompt_tokens) AS prompt_tokens_mean,
       {ratio("sum(cached_tokens)", "sum(prompt_tokens)")} AS prefix_cache_share,
       avg(completion_tokens) AS completion_tokens_mean, avg(engine_latency_s) AS engine_latency_mean_s,
       quantile_disc(engine_latency_s, 0.5) AS engine_latency_p50_s,
       quantile_disc(engine_latency_s, 0.9) AS engine_latency_p90_s,
       quantile_disc(engine_latency_s, 0.99) AS engine_latency_p99_s
FROM {_full_turns} GROUP BY run_id, turn
""",
    "Per run x turn index (full steps): n, mean prompt tokens, prefix_cache_share, mean completion tokens, "
    "engine latency mean/p50/p90/p99 (s).",
)

def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    return [F.FigureSpec("multiturn__pmf", F.multiturn_pmf_figure(read("multiturn_pmf")), True),
            F.FigureSpec("multiturn__by_turn", F.multiturn_by_turn_figure(read("multiturn_by_turn")))]


GROUP = ViewGroup(
    name="multiturn",
    order=70,
    title="Multi-turn structure",
    question="How many turns and tool calls per trajectory, and how much prefix is cached?",
    needs="turns / samples.n_turns",
    main=MULTITURN,
    views=(TRAJECTORIES, MULTITURN, MULTITURN_PMF, MULTITURN_BY_TURN),
    headline_sql="""
        SELECT run_id, trajectories, round(turns_mean, 2) AS turns_mean, turns_max, round(tool_calls_mean, 2) AS tool_calls_mean,
               tool_calls_max, round(prefix_cache_share, 3) AS prefix_cache_share,
               round(turn_latency_p50_s, 2) AS turn_latency_p50_s, round(turn_latency_p99_s, 2) AS turn_latency_p99_s
        FROM multiturn ORDER BY run_id""",
    figures=_figures,
)
