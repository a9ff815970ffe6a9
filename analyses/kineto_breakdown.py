"""GPU time breakdown of a PyTorch profiler (Kineto) trace: pure interval math on Polars frames.

Definitions follow HolisticTraceAnalysis (HTA, ``hta/analyzers/breakdown_analysis.py``,
``hta/utils/utils.py``) so our figures can be checked against its ``get_temporal_breakdown``:

* GPU events are the trace's ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events (HTA: every
  event with a ``stream`` and a ``correlation``), all streams and devices of a rank together.
* ``gpu_busy`` is the length of the union of their ``[ts, ts + dur)`` intervals (touching
  intervals merge, as in HTA's ``merge_kernel_intervals``).
* ``gpu_span`` is first start to last end (HTA's ``kernel_time``); ``gpu_idle = span - busy``.
* Kernel kinds are HTA's kernel types (:func:`analyses.trace.model.kernel_type`): ``comm`` =
  COMMUNICATION (``^nccl.*Kernel``), ``memcpy`` = MEMORY (``Memcpy``/``Memset``/``dma``),
  ``compute`` = COMPUTATION, ``other`` = OTHER.
* ``compute``, ``comm``, ``memcpy`` are unions of their kind's intervals (they may overlap each
  other); ``non_compute = span - compute - idle`` (HTA's definition: busy time not covered by a
  compute kernel).
* A GPU event belongs to the ProfilerStep of its launch (``analyses.trace.model``: HTA's
  ``add_iteration``); an event whose launch is not in the trace falls back to its own start time.

* Sub-microsecond timestamps (traces written with ns resolution, float ``ts``) are rounded as
  HTA does (``round_down_time_stamps``: start = ceil(ts), end = floor(ts + dur)), a workaround
  HTA applies for pytorch/pytorch#122425. It shortens each event by up to 1 µs: on HTA's
  ``nccl_data`` sample the exact compute time is 2.3 % higher than the rounded one. Readers
  apply it by default so figures agree with HTA; :func:`hta_round` is the single place.

Times in the input frames are microseconds (the trace's unit); outputs are seconds.
"""

from __future__ import annotations

import polars as pl

US = 1e-6

KINDS = ("compute", "comm", "memcpy", "other")
PHASES = ("step_wall", "gpu_span", "gpu_busy", "gpu_idle", "compute", "comm", "memcpy", "non_compute")


def has_sub_us(ts: pl.Series) -> bool:
    """True when timestamps carry fractions of a microsecond (HTA then rounds)."""
    return bool(ts.len() and (ts != ts.floor()).any())


def hta_round(df: pl.DataFrame) -> pl.DataFrame:
    """HTA's rounding of ns-resolution events: ts = ceil(ts), dur = floor(ts + dur) - ceil(ts).

    A sub-µs event that spans no integer microsecond gets a negative duration, as in HTA.
    """
    if "dur" not in df.columns:
        return df.with_columns(pl.col("ts").ceil())
    return df.with_columns(
        ts=pl.col("ts").ceil(), dur=(pl.col("ts") + pl.col("dur")).floor() - pl.col("ts").ceil()
    )


def union_length(lf: pl.LazyFrame, by: list[str], start: str = "ts", end: str = "end") -> pl.LazyFrame:
    """Per group of ``by``, the total length of the union of ``[start, end)`` intervals.

    Vectorized: sort by start; an interval opens a new merged run when it starts after the
    running maximum of the previous ends in its group (HTA's ``ts > end.shift().cummax()``).
    """
    keys = by or ["_all"]
    if not by:
        lf = lf.with_columns(_all=pl.lit(0))
    runs = (
        lf.sort([*keys, start])
        .with_columns(_prev_end=pl.col(end).cum_max().shift(1).over(keys))
        .with_columns(
            _run=(pl.col(start) > pl.col("_prev_end")).fill_null(True).cast(pl.Int64).cum_sum().over(keys)
        )
        .group_by([*keys, "_run"])
        .agg(pl.col(start).min().alias("_s"), pl.col(end).max().alias("_e"))
        .group_by(keys)
        .agg(union=(pl.col("_e") - pl.col("_s")).sum())
    )
    return runs if by else runs.drop("_all")


def breakdown(gpu: pl.DataFrame | pl.LazyFrame, by: list[str]) -> pl.DataFrame:
    """Wide breakdown per group of ``by`` from GPU events with ``ts``, ``dur`` (µs) and ``kind``.

    Columns: ``by`` + gpu_span, gpu_busy, gpu_idle, compute, comm, memcpy, non_compute (seconds)
    and n_events. A group with no events of a kind gets 0 for it. With ``by=[]`` one row for
    all events (HTA's per-rank granularity).
    """
    lf = (gpu.lazy() if isinstance(gpu, pl.DataFrame) else gpu).with_columns(end=pl.col("ts") + pl.col("dur"))
    keys = by or ["_all"]
    lf = lf if by else lf.with_columns(_all=pl.lit(0))
    out = lf.group_by(keys).agg(gpu_span=pl.col("end").max() - pl.col("ts").min(), n_events=pl.len())
    out = out.join(union_length(lf, keys).rename({"union": "gpu_busy"}), on=keys, how="left")
    for kind in ("compute", "comm", "memcpy"):
        u = union_length(lf.filter(pl.col("kind") == kind), keys).rename({"union": kind})
        out = out.join(u, on=keys, how="left")
    secs = ["gpu_span", "gpu_busy", "gpu_idle", "compute", "comm", "memcpy", "non_compute"]
    out = (
        out.with_columns(pl.col("compute", "comm", "memcpy").fill_null(0.0))
        .with_columns(gpu_idle=pl.col("gpu_span") - pl.col("gpu_busy"))
        .with_columns(non_compute=pl.col("gpu_span") - pl.col("compute") - pl.col("gpu_idle"))
        .with_columns([(pl.col(c) * US).alias(c) for c in secs])
        .select(*keys, *secs, "n_events")
        .sort(keys)
        .collect()
    )
    return out if by else out.drop("_all")


def step_rows(gpu_with_steps: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Long per-step rows (step, phase, seconds) for ``rank_times``: the wall time of the CPU
    ProfilerStep window plus the GPU breakdown of the events assigned to the step."""
    wide = breakdown(gpu_with_steps.filter(pl.col("step").is_not_null()), ["step"])
    wall = steps.group_by("step").agg(step_wall=(pl.col("dur").sum() * US))
    wide = wall.join(wide, on="step", how="left").sort("step")
    return (
        wide.unpivot(index="step", on=list(PHASES), variable_name="phase", value_name="seconds")
        .filter(pl.col("seconds").is_not_null())
        .sort("step", "phase")
    )
