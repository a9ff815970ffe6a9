"""What a comparison reads about one run, from the catalog's tables and views, once.

Per-step values come from the characterization views (so a comparison says what the views say);
per-sample values from ``samples`` / ``tool_calls`` with the views' filters (training samples only,
partial steps left out, a prompt counted once per group).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from analyses.compare.quantities import SERIES, imbalance_quantity


@dataclass
class RunData:
    """One run as a comparison sees it (every step; :func:`restrict` keeps the compared ones)."""

    run_id: str
    steps: list[int]
    series: pl.DataFrame  # quantity (Quantity.key), step, value
    samples: dict[str, pl.DataFrame]  # variable -> step, unit, grouped, value
    gpu_time: pl.DataFrame  # ts, value: mean utilization of the used GPUs per timeline bucket
    windows: pl.DataFrame  # step, start_ts, end_ts
    alerts: pl.DataFrame  # kind, metric, first_step, last_step, n_steps, detail
    facts: dict[str, Any] = field(default_factory=dict)
    config: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (value JSON, source)
    axes: pl.DataFrame = field(default_factory=pl.DataFrame)  # step, elapsed_s, tokens_seen
    _by_quantity: dict[str, pl.DataFrame] | None = field(default=None, repr=False)

    def values(self, key: str) -> pl.DataFrame:
        """(step, value) of one quantity, in step order (partitioned once: a comparison asks for ~40)."""
        if self._by_quantity is None:
            self._by_quantity = {k: f.select("step", "value").sort("step")
                                 for (k,), f in self.series.partition_by("quantity", as_dict=True).items()}
        return self._by_quantity.get(key, _EMPTY)


_EMPTY = pl.DataFrame(schema={"step": pl.Int64, "value": pl.Float64})


def _rows(con: duckdb.DuckDBPyConnection, sql: str, run_id: str) -> pl.DataFrame:
    return con.sql(sql, params=[run_id]).pl()


def _long(frame: pl.DataFrame, columns: dict[str, str]) -> pl.DataFrame:
    """(quantity, step, value) from a wide per-step frame; ``columns`` maps column -> quantity key."""
    have = [c for c in columns if c in frame.columns]
    if not have or frame.height == 0:
        return pl.DataFrame(schema={"quantity": pl.String, "step": pl.Int64, "value": pl.Float64})
    return (frame.select("step", *[pl.col(c).cast(pl.Float64).alias(columns[c]) for c in have])
            .unpivot(index="step", variable_name="quantity", value_name="value")
            .filter(pl.col("value").is_not_null() & pl.col("value").is_finite())
            .select("quantity", pl.col("step").cast(pl.Int64), "value"))


def _series(con: duckdb.DuckDBPyConnection, run_id: str, health: pl.DataFrame) -> pl.DataFrame:
    parts = []
    by_source: dict[str, dict[str, str]] = {}
    for q in SERIES:
        by_source.setdefault(q.source, {})[q.column] = q.key
    parts.append(_long(health.filter(~pl.col("partial")), by_source.pop("training_health")))
    filters = {"gpu_step_utilization": "WHERE run_id = $1 AND n_samples > 0"}
    for source, cols in by_source.items():
        step = "trainer_step AS step" if source == "filter_waste" else "step"
        sql = (f"SELECT {step}, {', '.join(cols)} FROM {source} "
               f"{filters.get(source, 'WHERE run_id = $1')}")
        parts.append(_long(_rows(con, sql, run_id), cols))
    imb = _rows(con, "SELECT step, phase, quantity, max_over_mean AS value FROM rank_imbalance "
                     "WHERE run_id = $1 AND max_over_mean IS NOT NULL AND isfinite(max_over_mean)", run_id)
    if imb.height:
        pairs = imb.select("phase", "quantity").unique()
        keys = pairs.with_columns(key=pl.Series([imbalance_quantity(p, q).key for p, q in pairs.iter_rows()],
                                                dtype=pl.String))
        parts.append(imb.join(keys, on=["phase", "quantity"]).select(
            pl.col("key").alias("quantity"), pl.col("step").cast(pl.Int64), pl.col("value").cast(pl.Float64)))
    return pl.concat(parts).sort("quantity", "step")


def _samples(con: duckdb.DuckDBPyConnection, run_id: str, partial: list[int]) -> dict[str, pl.DataFrame]:
    """Training samples of the run's full steps (``partial``: steps training_health flags partial)."""
    full = ~pl.col("step").is_in(pl.Series(partial, dtype=pl.Int64).implode())
    s = _rows(con, """
        SELECT s.step, coalesce(s.group_id, s.sample_id) AS unit, s.group_id IS NOT NULL AS grouped,
               s.response_tokens, s.prompt_tokens, s.n_turns
        FROM samples s WHERE s.run_id = $1 AND NOT coalesce(s.validate, false)""", run_id).filter(full)
    out: dict[str, pl.DataFrame] = {}
    if s.height:
        base = ["step", "unit", "grouped"]
        out["response_length"] = s.select(*base, value=pl.col("response_tokens")).drop_nulls("value")
        # a prompt once per (step, group): the n responses of one prompt share it
        out["prompt_length"] = (s.drop_nulls("prompt_tokens")
                                .group_by("step", "unit", maintain_order=True)
                                .agg(pl.col("grouped").first(), value=pl.col("prompt_tokens").first()))
        out["turns"] = s.select(*base, value=pl.col("n_turns")).drop_nulls("value")
    t = _rows(con, """
        SELECT t.step, coalesce(s.group_id, t.sample_id) AS unit, s.group_id IS NOT NULL AS grouped,
               t.latency_s AS value
        FROM tool_calls t LEFT JOIN (SELECT * FROM samples WHERE run_id = $1) s USING (run_id, step, sample_id)
        WHERE t.run_id = $1 AND NOT coalesce(s.validate, false) AND t.latency_s IS NOT NULL
              AND isfinite(t.latency_s)""", run_id).filter(full)
    if t.height:
        out["tool_latency_s"] = t
    return {k: v.with_columns(pl.col("value").cast(pl.Float64), pl.col("step").cast(pl.Int64))
            for k, v in out.items() if v.height}


def load_run(con: duckdb.DuckDBPyConnection, run_id: str) -> RunData:
    """Everything a comparison needs about ``run_id`` (KeyError when the warehouse lacks it)."""
    facts = _rows(con, "SELECT * FROM runs WHERE run_id = $1", run_id)
    if facts.height == 0:
        raise KeyError(run_id)
    health = _rows(con, "SELECT * FROM training_health WHERE run_id = $1", run_id)
    other = _rows(con, """
        SELECT DISTINCT step FROM (
            SELECT step FROM rank_times WHERE run_id = $1
            UNION ALL SELECT trainer_step FROM filter_batches WHERE run_id = $1
            UNION ALL SELECT step FROM step_windows WHERE run_id = $1
        ) WHERE step IS NOT NULL""", run_id)["step"].to_list()
    partial = health.filter(pl.col("partial"))["step"].to_list()
    # a partial step (cut short mid-rollout) is no step to compare on: every quantity leaves it out
    steps = sorted({int(s) for s in [*health["step"].to_list(), *other] if s is not None} - set(partial))
    gpu_time = _rows(con, """
        SELECT t.ts, avg(t.util_pct) AS value FROM gpu_timeline t
        JOIN (SELECT DISTINCT host, gpu FROM gpu_utilization
              WHERE run_id = $1 AND scope = 'run' AND NOT idle_whole_run) u
          ON t.host = u.host AND t.gpu = u.gpu
        WHERE t.run_id = $1 GROUP BY t.ts ORDER BY t.ts""", run_id)
    windows = _rows(con, "SELECT step, start_ts, end_ts FROM step_windows WHERE run_id = $1 ORDER BY step", run_id)
    alerts = _rows(con, "SELECT kind, metric, first_step, last_step, n_steps, detail FROM health_alerts "
                        "WHERE run_id = $1 ORDER BY first_step, kind", run_id)
    config = {k: (v, s) for k, v, s in con.execute("SELECT key, value, source FROM run_config WHERE run_id = $1",
                                                    [run_id]).fetchall()}
    axes = _rows(con, """
        SELECT step, sum(step_time_s) OVER w AS elapsed_s, sum(total_tokens) OVER w AS tokens_seen
        FROM steps WHERE run_id = $1
        WINDOW w AS (ORDER BY step ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) ORDER BY step""", run_id)
    return RunData(run_id, steps, _series(con, run_id, health), _samples(con, run_id, partial), gpu_time, windows,
                   alerts, facts.to_dicts()[0], config, axes)


def restrict(data: RunData, steps: tuple[int, ...]) -> RunData:
    """``data`` on ``steps`` only (``data`` itself when that is every step it has)."""
    if set(steps) == set(data.steps):
        return data
    keep = pl.col("step").is_in(pl.Series("step", list(steps), dtype=pl.Int64).implode())
    gpu, alerts = over_steps(data, steps)
    return RunData(data.run_id, list(steps), data.series.filter(keep),
                   {k: v.filter(keep) for k, v in data.samples.items()}, gpu, data.windows.filter(keep), alerts,
                   data.facts, data.config, data.axes.filter(keep) if data.axes.height else data.axes)


def over_steps(data: RunData, steps: tuple[int, ...]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(telemetry over time, alerts) of ``steps``: the telemetry is cut to those steps' windows when
    the run has windows and not every step is meant; an alert is kept when its stretch overlaps them."""
    gpu, alerts = data.gpu_time, data.alerts
    if set(steps) != set(data.steps) and data.windows.height and gpu.height:
        w = data.windows.filter(pl.col("step").is_in(pl.Series(list(steps), dtype=pl.Int64).implode()))
        gpu = gpu.filter(pl.col("ts").is_between(w["start_ts"].min(), w["end_ts"].max(), closed="left")) if w.height \
            else gpu.clear()
    if steps and alerts.height:
        alerts = alerts.filter((pl.col("first_step") <= max(steps)) & (pl.col("last_step") >= min(steps)))
    return gpu, alerts
