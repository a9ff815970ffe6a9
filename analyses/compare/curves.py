"""Per-step curves of several runs (or step ranges) on shared x axes, for the overlaid figure of
the report's comparison section and of ``polytrace compare --format html``.

x axes: the step as logged (runs aligned by step number), steps from the first one drawn (step
ranges of one run aligned at their start), wall time since the first step (cumulative step time)
and tokens seen (cumulative tokens per step).
"""

from __future__ import annotations

import duckdb
import polars as pl

from analyses.compare.sides import Side

PANELS: tuple[tuple[str, str], ...] = (
    ("response_length_mean", "response length, mean (tokens)"),
    ("gen_time_s", "generation time (s)"),
    ("step_time_s", "step time (s)"),
    ("throughput_tokens_per_s", "throughput (tokens/s)"),
    ("clip_ratio", "truncation share"),
    ("reward_mean", "reward, mean"),
    ("entropy", "entropy"),
    ("mean_util_pct", "GPU utilization (%)"),
)
# a figure draws at most this many points per series: every k-th step of a longer one (and its last),
# so 76 runs of thousands of steps stay a readable figure and a report of a few MB
MAX_POINTS = 400
AXES: tuple[tuple[str, str], ...] = (
    ("step", "step"),
    ("from_start", "steps from the first step drawn"),
    ("elapsed_s", "wall time since the first step (s)"),
    ("tokens_seen", "tokens seen"),
)

_SQL = """
SELECT h.run_id, h.step, h.response_length_mean, h.clip_ratio, h.reward_mean, h.entropy,
       h.throughput_tokens_per_s, h.step_time_s, s.gen_time_s, s.total_tokens, g.mean_util_pct
FROM training_health h
LEFT JOIN steps s USING (run_id, step)
LEFT JOIN (SELECT run_id, step, mean_util_pct FROM gpu_step_utilization WHERE n_samples > 0) g USING (run_id, step)
WHERE h.run_id IN (SELECT unnest($1)) AND NOT h.partial
"""


def _read(con: duckdb.DuckDBPyConnection, runs: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-step rows with the x axes, alerts) of ``runs``, each series named by its run id."""
    raw = con.sql(_SQL, params=[runs]).pl().rename({"run_id": "series"})
    alerts = con.sql("SELECT run_id AS series, kind, metric, first_step, last_step, detail FROM health_alerts "
                     "WHERE run_id IN (SELECT unnest($1))", params=[runs]).pl()
    return with_axes(raw), alerts


def run_curves(con: duckdb.DuckDBPyConnection, runs: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(curves, alerts) of ``runs``, each series named by its run id, thinned for drawing (:func:`thin`)."""
    curves, alerts = _read(con, runs)
    return thin(curves), alerts


def side_curves(con: duckdb.DuckDBPyConnection, sides: list[tuple[str, Side, tuple[int, ...]]]
                ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(curves, alerts) of comparison sides: (series label, side, steps compared)."""
    curves, alerts = _read(con, sorted({s.run_id for _l, s, _st in sides}))
    out_c, out_a = [], []
    for label, side, steps in sides:
        keep = pl.Series(list(steps), dtype=pl.Int64).implode()
        c = curves.filter((pl.col("series") == side.run_id) & pl.col("step").is_in(keep))
        out_c.append(thin(with_axes(c.drop("from_start", "elapsed_s", "tokens_seen").with_columns(series=pl.lit(label)))))
        if steps:
            a = alerts.filter((pl.col("series") == side.run_id) & (pl.col("first_step") <= max(steps))
                              & (pl.col("last_step") >= min(steps)))
            out_a.append(a.with_columns(series=pl.lit(label)))
    return pl.concat(out_c, how="diagonal_relaxed"), (pl.concat(out_a) if out_a else alerts.clear())


def thin(curves: pl.DataFrame, max_points: int = MAX_POINTS) -> pl.DataFrame:
    """At most ``max_points`` rows per series (every k-th step, the last kept), for drawing only:
    the axes are computed before, so wall time and tokens seen still add up every step."""
    if curves.height == 0:
        return curves
    n = pl.len().over("series")
    k = ((n + max_points - 1) // max_points).clip(lower_bound=1)
    i = pl.int_range(pl.len()).over("series")
    return curves.filter((i % k == 0) | (i == n - 1))


def with_axes(curves: pl.DataFrame) -> pl.DataFrame:
    """``curves`` (series, step, metrics, step_time_s, total_tokens) sorted, with the x columns of
    :data:`AXES`; wall time and tokens seen are NULL for a series that logs no step time or tokens."""
    c = curves.sort("series", "step")
    cum = {"elapsed_s": "step_time_s", "tokens_seen": "total_tokens"}
    return c.with_columns(
        from_start=(pl.col("step") - pl.col("step").min().over("series")),
        **{k: pl.when(pl.col(v).is_not_null().any().over("series"))
           .then(pl.col(v).fill_null(0).cum_sum().over("series")) for k, v in cum.items()},
    )
