"""Tool-call latency tails per tool, by turn index, and the latency CCDF for plotting.

Calls of validation samples (their ``samples`` row has ``validate``) are left out, as in every view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.schema import TOOL_OK_STATUSES
from analyses.views.group import ReadView, View, ViewGroup
from analyses.views.sql import QUANTILE_DEFINITION, disc_quantiles, ratio, training_rows

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

_ok = ", ".join(f"'{s}'" for s in TOOL_OK_STATUSES)
_failed = f"status IS NOT NULL AND lower(status) NOT IN ({_ok})"
_calls = training_rows("tool_calls")  # calls of validation samples are not part of the training workload

TOOL_LATENCY = View(
    "tool_latency",
    f"""
SELECT *, {ratio("p99", "p50")} AS p99_over_p50, {ratio("failures", "calls")} AS failure_share
FROM (
    SELECT run_id, coalesce(tool_name, 'unknown') AS tool_name, count(*) AS calls,
           count(*) FILTER (WHERE {_failed}) AS failures,
           count(latency_s) AS timed_calls, avg(latency_s) AS mean_s,
           {disc_quantiles("latency_s")}, max(latency_s) AS max_s
    FROM {_calls} GROUP BY ALL
)
""",
    "Per run x tool: calls, failures (status not one of "
    f"{', '.join(TOOL_OK_STATUSES)}; NULL status is not a failure), failure_share, timed_calls, mean_s, "
    f"p50, p90, p99, p999 (seconds), max_s, p99_over_p50. Quantiles: {QUANTILE_DEFINITION}.",
)

TOOL_LATENCY_BY_TURN = View(
    "tool_latency_by_turn",
    f"""
SELECT run_id, coalesce(tool_name, 'unknown') AS tool_name, turn, count(*) AS calls,
       count(*) FILTER (WHERE {_failed}) AS failures, avg(latency_s) AS mean_s,
       quantile_disc(latency_s, 0.5) AS p50, quantile_disc(latency_s, 0.9) AS p90,
       quantile_disc(latency_s, 0.99) AS p99, max(latency_s) AS max_s
FROM {_calls} GROUP BY ALL
""",
    "Per run x tool x turn index: calls, failures, mean_s, p50, p90, p99, max_s of latency.",
)

TOOL_LATENCY_CDF = View(
    "tool_latency_cdf",
    f"""
WITH c AS (
    SELECT run_id, coalesce(tool_name, 'unknown') AS tool_name, latency_s AS value, count(*) AS n
    FROM {_calls} WHERE latency_s IS NOT NULL GROUP BY ALL
)
SELECT run_id, tool_name, value, n,
       sum(n) OVER w / sum(n) OVER (PARTITION BY run_id, tool_name) AS cdf,
       1 - sum(n) OVER w / sum(n) OVER (PARTITION BY run_id, tool_name) AS ccdf,
       1 - (sum(n) OVER w - n) / sum(n) OVER (PARTITION BY run_id, tool_name) AS share_ge
FROM c
WINDOW w AS (PARTITION BY run_id, tool_name ORDER BY value ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
""",
    "Exact empirical CDF of tool-call latency: one row per run x tool x distinct latency, cdf, ccdf (share > value) and share_ge (share >= value).",
)

def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    return [F.FigureSpec("tool_latency__ccdf", F.tool_latency_figure(read("tool_latency_cdf"), read("tool_latency")), True),
            F.FigureSpec("tool_latency__by_turn", F.tool_latency_by_turn_figure(read("tool_latency_by_turn")))]


GROUP = ViewGroup(
    name="tool_latency",
    order=60,
    title="Tool-call latency",
    question="How slow are tool calls, and how heavy is their tail?",
    needs="tool_calls",
    main=TOOL_LATENCY,
    views=(TOOL_LATENCY, TOOL_LATENCY_BY_TURN, TOOL_LATENCY_CDF),
    headline_sql="""
        SELECT run_id, tool_name, calls, failures, round(p50, 3) AS p50_s, round(p90, 3) AS p90_s,
               round(p99, 3) AS p99_s, round(p999, 3) AS p999_s, round(max_s, 3) AS max_s,
               round(p99_over_p50, 2) AS p99_over_p50
        FROM tool_latency ORDER BY run_id, tool_name""",
    figures=_figures,
)
