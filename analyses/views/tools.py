"""Tool-call latency tails per tool, by turn index, and the latency CCDF for plotting.

Calls of validation samples (their ``samples`` row has ``validate``) are left out, as in every view.
"""

from __future__ import annotations

from analyses.catalog import register_view
from analyses.views._common import QUANTILE_DEFINITION, disc_quantiles, ratio, training_rows

# statuses that mean the call returned normally; NULL status counts as neither success nor failure
OK_STATUSES = ("success", "ok", "succeeded")
_ok = ", ".join(f"'{s}'" for s in OK_STATUSES)
_failed = f"status IS NOT NULL AND lower(status) NOT IN ({_ok})"
_calls = training_rows("tool_calls")  # calls of validation samples are not part of the training workload

register_view(
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
    f"{', '.join(OK_STATUSES)}; NULL status is not a failure), failure_share, timed_calls, mean_s, "
    f"p50, p90, p99, p999 (seconds), max_s, p99_over_p50. Quantiles: {QUANTILE_DEFINITION}.",
)

register_view(
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

register_view(
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
