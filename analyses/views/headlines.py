"""The headline numbers of each view group: one small table per group, for the report, the
Dagster asset metadata and the notebook. Plain SQL over the views; :func:`to_markdown` renders."""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import polars as pl

HEADLINE_SQL: dict[str, str] = {
    "lengths": """
        SELECT run_id, task, kind, n, round(mean, 1) AS mean, p50, p90, p99, p999, max,
               round(max_over_mean, 2) AS max_over_mean, round(p99_over_p50, 2) AS p99_over_p50,
               round(truncation_share, 4) AS truncation_share
        FROM length_quantiles ORDER BY run_id, task, kind DESC""",
    "step_variance": """
        SELECT run_id, metric, n_steps, round(mean, 2) AS mean, round(cv, 3) AS cv,
               round(max_over_min, 2) AS max_over_min, n_outliers, outlier_steps
        FROM step_variance ORDER BY run_id, metric""",
    "stage_breakdown": """
        SELECT run_id, count(*) AS steps, round(sum(rollout_s) / nullif(sum(rollout_s + inference_s + training_s + other_s), 0), 3) AS rollout_share,
               round(sum(inference_s) / nullif(sum(rollout_s + inference_s + training_s + other_s), 0), 3) AS inference_share,
               round(sum(training_s) / nullif(sum(rollout_s + inference_s + training_s + other_s), 0), 3) AS training_share,
               round(sum(other_s) / nullif(sum(rollout_s + inference_s + training_s + other_s), 0), 3) AS other_share
        FROM stage_breakdown GROUP BY run_id ORDER BY run_id""",
    "rank_imbalance": """
        SELECT run_id, phase, quantity, count(*) AS steps, round(median(max_over_mean), 3) AS median_max_over_mean,
               round(min(max_over_mean), 3) AS min_max_over_mean, round(max(max_over_mean), 3) AS max_max_over_mean,
               round(max(max_over_min), 3) AS max_max_over_min, round(avg(idle_share), 3) AS mean_idle_share
        FROM rank_imbalance GROUP BY ALL ORDER BY run_id, phase, quantity""",
    "gpu_utilization": """
        SELECT run_id, max(n_gpus) AS gpus, sum(n_samples) AS samples, round(avg(mean_util_pct), 1) AS mean_util_pct,
               round(avg(idle_share), 3) AS idle_share, round(max(gpu_spread_pct), 1) AS gpu_spread_pct,
               (SELECT count(DISTINCT step) FROM gpu_utilization s WHERE s.run_id = g.run_id AND s.scope = 'step') AS aligned_steps
        FROM gpu_utilization g WHERE scope = 'run' GROUP BY run_id ORDER BY run_id""",
    "tool_latency": """
        SELECT run_id, tool_name, calls, failures, round(p50, 3) AS p50_s, round(p90, 3) AS p90_s,
               round(p99, 3) AS p99_s, round(p999, 3) AS p999_s, round(max_s, 3) AS max_s,
               round(p99_over_p50, 2) AS p99_over_p50
        FROM tool_latency ORDER BY run_id, tool_name""",
    "multiturn": """
        SELECT run_id, trajectories, round(turns_mean, 2) AS turns_mean, turns_max, round(tool_calls_mean, 2) AS tool_calls_mean,
               tool_calls_max, round(prefix_cache_share, 3) AS prefix_cache_share,
               round(turn_latency_p50_s, 2) AS turn_latency_p50_s, round(turn_latency_p99_s, 2) AS turn_latency_p99_s
        FROM multiturn ORDER BY run_id""",
    "filter_waste": """
        SELECT run_id, trainer_steps, gen_batches, round(gen_batches_per_step, 2) AS gen_batches_per_step,
               prompts_generated, prompts_kept, prompts_used, round(filtered_share, 3) AS filtered_share,
               round(unused_share, 3) AS unused_share
        FROM filter_waste_run ORDER BY run_id""",
}


def headline_frame(con: duckdb.DuckDBPyConnection, group: str, runs: Iterable[str] | None = None) -> pl.DataFrame:
    """The headline table of ``group`` (see :data:`HEADLINE_SQL`), optionally for ``runs`` only."""
    sql = f"SELECT * FROM ({HEADLINE_SQL[group]}) h"
    if runs is None:
        return con.sql(sql).pl()
    return con.sql(sql + " WHERE run_id IN (SELECT unnest($1))", params=[list(runs)]).pl()


def format_value(v: object, max_items: int = 20) -> str:
    """One table cell as text: NULL empty, floats to 4 significant digits, lists cut at ``max_items``."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(str(x) for x in v[:max_items]) + (" …" if len(v) > max_items else "")
    return str(v)


def _cell(v: object) -> str:
    return format_value(v).replace("|", "\\|")


def to_markdown(df: pl.DataFrame, max_rows: int = 40) -> str:
    """A GitHub-flavoured markdown table (Dagster renders these in asset metadata)."""
    if df.width == 0:
        return "_no columns_"
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * df.width + "\n"
    body = "".join("| " + " | ".join(_cell(v) for v in row) + " |\n" for row in df.head(max_rows).iter_rows())
    more = f"\n_{df.height - max_rows} more rows_\n" if df.height > max_rows else ""
    return head + (body or "| " + " | ".join("" for _ in df.columns) + " |\n") + more
