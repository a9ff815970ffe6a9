"""Aligning telemetry to training steps: a time window per step.

Pure functions over frames; the ingest calls :func:`derive_step_windows` once per run (after
``steps``). GPU utilization inside the windows is the view ``gpu_step_utilization``
(:mod:`analyses.views.gpu_utilization`), the one implementation the report, notebooks and SQL share.

How a step gets its window (``step_windows.method``), first rule that applies:

``log_ts_minus_step_time``
    The step's log line carries a wall-clock time (``steps.ts``: console timestamps, wandb
    history ``_timestamp``, ...). verl prints a step's metrics when the step ends, so
    ``end_ts = ts`` and ``start_ts = ts - step_time_s``.
``log_ts_previous_step``
    As above, but the step time is unknown: the window starts at the previous logged step's
    ``ts`` (it then also covers validation / checkpointing between the two steps). The first
    step of a run has no window in this case.
``started_at_plus_cumulative_step_time``
    No step has a ``ts`` but run.toml has ``started_at``: step k ends at
    ``started_at + sum(step_time_s of steps <= k)`` (steps in order). This ignores the startup
    before the first step and any time between steps (validation, checkpoints), so windows
    drift late -> early as the run goes on; it is the fallback, named so a view can weigh it.
    The chain stops at the first step without a step time (later windows are unknown).

When some steps have a ``ts`` and others do not, only the former get windows: mixing the two
methods would put windows from different clocks side by side.

A step or stage time that cannot be a duration (NaN, infinite, negative, over a year: a corrupt
value such as ``timing_s/step:inf`` or ``1e300``) is treated as not logged: it never makes a
window, and never fails the run.

``rollout_end_ts = start_ts + gen_time_s`` (capped at ``end_ts``) where the stage time is known:
verl generates first in a step, so ``[start_ts, rollout_end_ts)`` is the rollout stage.
"""

from __future__ import annotations

import polars as pl

from analyses.manifest import RunManifest
from analyses.schema import STEP_WINDOWS, conform

METHOD_LOG_TS = "log_ts_minus_step_time"
METHOD_LOG_PREV = "log_ts_previous_step"
METHOD_CUMSUM = "started_at_plus_cumulative_step_time"


# a stage or step time outside [0, MAX_SECONDS] (NaN, inf, negative, 1e300: a corrupt or misread
# value) is no time: it is treated as unknown, as if the metric had not been logged
MAX_SECONDS = 365 * 24 * 3600.0


def _valid_secs(x: pl.Expr) -> pl.Expr:
    """``x`` where it can be a duration in seconds, else null."""
    return pl.when(x.is_finite() & (x >= 0) & (x <= MAX_SECONDS)).then(x)


def _secs(x: pl.Expr) -> pl.Expr:
    """Float seconds -> Duration (microsecond precision); null where ``x`` is no valid duration."""
    return pl.duration(microseconds=(_valid_secs(x) * 1e6).round(0).cast(pl.Int64))


def derive_step_windows(steps: pl.DataFrame, manifest: RunManifest | None) -> pl.DataFrame:
    """One ``step_windows`` row per step whose window can be known (see module docs).

    ``steps`` needs ``step`` and any of ``ts``, ``step_time_s``, ``gen_time_s``; other columns
    are ignored. The result is conformed to the ``step_windows`` contract (run_id left null: the
    ingest writes it per run partition).
    """
    if steps.height == 0:
        # no step, no window: the typed empty frame without a query. The ingest derives the windows
        # while the run's samples are written on another thread, and the sort and unique below
        # waited for that write's hold on Polars' thread pool (~30-40 ms of a run of packed step files)
        return STEP_WINDOWS.empty()
    cols = {"ts": pl.Datetime("us", "UTC"), "step_time_s": pl.Float64, "gen_time_s": pl.Float64}
    s = (
        steps.select(
            pl.col("step").cast(pl.Int64),
            *[
                (pl.col(c).cast(t) if c in steps.columns else pl.lit(None, dtype=t)).alias(c)
                for c, t in cols.items()
            ],
        )
        .filter(pl.col("step").is_not_null())
        .unique("step", keep="last")
        .sort("step")
        .with_columns(_valid_secs(pl.col("step_time_s")), _valid_secs(pl.col("gen_time_s")))
    )
    started = manifest.started_at if manifest is not None else None
    if s["ts"].is_not_null().any():
        logged = s.filter(pl.col("ts").is_not_null()).with_columns(prev_ts=pl.col("ts").shift(1))
        w = logged.select(
            "step",
            "gen_time_s",
            end_ts=pl.col("ts"),
            start_ts=pl.when(pl.col("step_time_s").is_not_null())
            .then(pl.col("ts") - _secs(pl.col("step_time_s")))
            .otherwise(pl.col("prev_ts")),
            method=pl.when(pl.col("step_time_s").is_not_null())
            .then(pl.lit(METHOD_LOG_TS))
            .when(pl.col("prev_ts").is_not_null())
            .then(pl.lit(METHOD_LOG_PREV)),
        )
    elif started is not None:
        broken = pl.col("step_time_s").is_null().cum_sum() > 0
        end = pl.lit(started).cast(pl.Datetime("us", "UTC")) + _secs(pl.col("step_time_s").cum_sum())
        w = s.filter(~broken).select(
            "step",
            "gen_time_s",
            end_ts=end,
            start_ts=end - _secs(pl.col("step_time_s")),
            method=pl.lit(METHOD_CUMSUM),
        )
    else:
        return conform(pl.DataFrame(schema={"step": pl.Int64}), STEP_WINDOWS)
    rollout_end = pl.col("start_ts") + _secs(pl.col("gen_time_s"))
    w = w.filter(pl.col("start_ts").is_not_null() & pl.col("method").is_not_null()).with_columns(
        rollout_end_ts=pl.when(pl.col("gen_time_s").is_not_null()).then(
            pl.min_horizontal(rollout_end, pl.col("end_ts"))
        )
    )
    return conform(w, STEP_WINDOWS)
