"""Where the GPU time goes: HTA's ``get_temporal_breakdown``, ``get_gpu_kernel_breakdown`` and
``get_comm_comp_overlap`` (``hta/analyzers/breakdown_analysis.py``, ``communication_analysis.py``),
all over HTA's window (``trace_kernels.in_hta_window``).

* Temporal breakdown, per rank: ``kernel_time`` = last GPU event end − first start, ``idle`` =
  that minus the union of all GPU events, ``compute`` = the union of COMPUTATION kernels,
  ``non_compute`` = kernel_time − compute − idle.
* Kernel types (first table of ``get_gpu_kernel_breakdown``, ``include_memory_kernels=True``):
  each type's kernels merged, then the time during which exactly a set of types ran, labelled
  ``COMPUTATION``, ``COMMUNICATION overlapping MEMORY``, ...; summed over the ranks of the run,
  with its share in percent (HTA rounds it to one decimal; we do not round). HTA can list a
  combination with 0 µs when boundaries of two types coincide (a zero-length state of its sort);
  we list combinations that last.
* Top kernels (second table): per rank and type, the kernels by total time; past ``num_kernels``
  (10) names or the ``duration_ratio`` (0.8) quantile of their running sum the rest is one
  ``others`` row (see :func:`analyses.trace.sqlparts.grouped_top` for how HTA's own statistics of
  the kept kernels are off once it groups, and what we report instead).
* Communication-computation overlap, per rank: time when a COMPUTATION and a COMMUNICATION kernel
  run at once, as a percentage of the time communication runs (HTA rounds it to 2 decimals;
  NULL without communication, where HTA gives NaN).
"""

from __future__ import annotations

from analyses.trace.sqlparts import (
    US,
    WINDOW_KERNELS,
    grouped_top,
    lead,
    mask_label,
    merged_intervals,
    type_segments,
)

TOP_NUM_KERNELS = 10
TOP_DURATION_RATIO = 0.8


def temporal_sql(keys: tuple[str, ...] = ()) -> str:
    """Per run, rank and ``keys``: kernel_time_s, idle_s, compute_s, non_compute_s and their shares.
    With ``keys`` (e.g. stage) each group's events are treated as HTA treats a rank's."""
    part = ("run_id", "path", "rank", *keys)
    out = ("run_id", "rank", *keys)
    src = f"(SELECT {lead(part)}kernel_type, ts_us AS s, ts_us + dur_us AS e FROM {WINDOW_KERNELS})"
    comp = f"(SELECT * FROM {src} WHERE kernel_type = 'COMPUTATION')"
    j = " AND ".join(f"a.{k} IS NOT DISTINCT FROM b.{k}" for k in part)
    return f"""
WITH span AS (SELECT {lead(part)}max(e) - min(s) AS kernel_us FROM {src} GROUP BY ALL),
busy AS (SELECT {lead(part)}sum(e - s) AS busy_us FROM ({merged_intervals(src, part)}) GROUP BY ALL),
comp AS (SELECT {lead(part)}sum(e - s) AS compute_us FROM ({merged_intervals(comp, part)}) GROUP BY ALL),
per_file AS (
    SELECT a.*, b.busy_us, coalesce(c.compute_us, 0) AS compute_us
    FROM span a JOIN busy b ON {j} LEFT JOIN comp c ON {j.replace('b.', 'c.')}
)
SELECT {lead(out)}sum(kernel_us) * {US} AS kernel_time_s, sum(kernel_us - busy_us) * {US} AS idle_s,
       sum(compute_us) * {US} AS compute_s, sum(kernel_us - compute_us - (kernel_us - busy_us)) * {US} AS non_compute_s,
       sum(kernel_us - busy_us) / nullif(sum(kernel_us), 0) AS idle_share,
       sum(compute_us) / nullif(sum(kernel_us), 0) AS compute_share,
       sum(busy_us - compute_us) / nullif(sum(kernel_us), 0) AS non_compute_share
FROM per_file GROUP BY ALL"""


def kernel_type_sql(keys: tuple[str, ...] = (), by_rank: bool = False) -> str:
    """Seconds and share (percent) of each kernel-type combination per run (and rank, ``keys``)."""
    out = ("run_id", *(("rank",) if by_rank else ()), *keys)
    return f"""
WITH t AS (SELECT {lead(out)}{mask_label()} AS kernel_type, sum(us) AS us
           FROM ({type_segments(keys)}) GROUP BY ALL HAVING sum(us) > 0)
SELECT {lead(out)}kernel_type, us * {US} AS sum_s, 100 * us / sum(us) OVER (PARTITION BY {", ".join(out)}) AS share_pct
FROM t"""


def overlap_sql(keys: tuple[str, ...] = ()) -> str:
    """Communication-computation overlap per run, rank and ``keys``."""
    out = ("run_id", "rank", *keys)
    return f"""
SELECT {lead(out)}100 * coalesce(sum(us) FILTER (WHERE mask & 3 = 3), 0)
                   / nullif(sum(us) FILTER (WHERE mask & 2 = 2), 0) AS overlap_pct,
       coalesce(sum(us) FILTER (WHERE mask & 2 = 2), 0) * {US} AS comm_s,
       coalesce(sum(us) FILTER (WHERE mask & 3 = 3), 0) * {US} AS overlap_s
FROM ({type_segments(keys)}) GROUP BY ALL"""


def top_kernels_sql(num_kernels: int = TOP_NUM_KERNELS, duration_ratio: float = TOP_DURATION_RATIO) -> str:
    """HTA's kernel table: per run, rank and type, the top kernels and an ``others`` row."""
    src = (f"(SELECT run_id, rank, kernel_type, name, dur_us FROM {WINDOW_KERNELS} "
           "WHERE kernel_type IN ('COMPUTATION', 'COMMUNICATION', 'MEMORY'))")
    return f"""
SELECT run_id, rank, kernel_type, name, s * {US} AS sum_s, mx * {US} AS max_s, mn * {US} AS min_s, mean * {US} AS mean_s,
       sd * {US} AS std_s, n AS count, is_others,
       s / sum(s) OVER (PARTITION BY run_id, rank, kernel_type) AS share_of_type
FROM ({grouped_top(src, ("run_id", "rank", "kernel_type"), num_kernels, duration_ratio)})"""


def kernels_by_sql(keys: tuple[str, ...]) -> str:
    """Every kernel name's count and time per run, rank, ``keys`` and type (no grouping)."""
    part = ("run_id", "rank", *keys, "kernel_type")
    return f"""
SELECT {lead(part)}name, count(*) AS count, sum(dur_us) * {US} AS sum_s, avg(dur_us) * {US} AS mean_s,
       max(dur_us) * {US} AS max_s,
       sum(dur_us) / sum(sum(dur_us)) OVER (PARTITION BY {", ".join(part[:-1])}) AS share_of_gpu_time
FROM {WINDOW_KERNELS} GROUP BY {", ".join(part)}, name"""
