"""GPU idle time by cause: HTA's ``get_idle_time_breakdown`` (``hta/analyzers/breakdown_analysis.py``).

Per trace and CUDA stream, the window's kernels (categories kernel, gpu_memcpy, gpu_memset: not
cuda_sync, HTA PR #149) in start order; the gap before each kernel is ``ts - previous end`` and is

* ``host_wait`` when the kernel's launch (its CUDA runtime call) started after the previous
  kernel ended: the CPU did not enqueue work fast enough;
* else ``kernel_wait`` when the gap is shorter than ``consecutive_kernel_delay``: the overhead of
  launching back-to-back kernels;
* else ``other`` (e.g. waiting for an event from another stream).

The first kernel of a stream has no gap (``idle_us`` NULL) and is ``other``, which is why HTA (and
``kernel_idle_breakdown``) always has an ``other`` row, of 0 when nothing else falls in it. A gap
can be negative when kernels of one stream overlap after the rounding of ns traces; HTA adds it
in, so do we.

Differences from HTA, stated:

* ``consecutive_kernel_delay``: HTA documents its default, 30, as nanoseconds, but compares it with
  gaps in the trace's unit, microseconds; its results are those of a 30 µs threshold. We use
  30 µs (``DELAY_US``) so the numbers are HTA's; pass ``consecutive_kernel_delay_us=0.03`` to
  :func:`idle_intervals_sql` for a real 30 ns.
* A kernel whose launch is not in the trace: HTA joins it to event index 0 (its
  ``index_correlation`` 0 means "no linked event" but is used as a row label), so its host-wait test
  compares with whatever event 0's start is; we treat it as having no launch (not host wait). In
  HTA's window every kernel has its launch, so this only matters for traces with fewer than two
  ProfilerSteps.
* Ties in start time on one stream: HTA sorts with an unstable sort; we order by (start, event
  number).

The gap's ``step`` and ``stage`` are those of the kernel that ends it (its launch's): host wait
before a kernel is time the CPU spent before launching it.
"""

from __future__ import annotations

from analyses.trace.events import IDLE_KERNEL_CATS
from analyses.trace.sqlparts import US, WINDOW_KERNELS, lead

DELAY_US = 30.0
CATEGORIES = ("host_wait", "kernel_wait", "other")


def idle_intervals_sql(consecutive_kernel_delay_us: float = DELAY_US) -> str:
    """One row per window kernel of the idle categories' GPU events: the gap before it."""
    cats = ", ".join(f"'{c}'" for c in IDLE_KERNEL_CATS)
    return f"""
WITH k AS (
    SELECT run_id, path, rank, stream, ev, ts_us, ts_us + dur_us AS end_us, launch_ts_us, step, stage
    FROM {WINDOW_KERNELS} WHERE cat IN ({cats})
), g AS (
    SELECT *, lag(end_us) OVER (PARTITION BY run_id, path, stream ORDER BY ts_us, ev) AS prev_end_us FROM k
)
SELECT run_id, path, rank, stream, ev, prev_end_us AS start_us, ts_us AS end_us, ts_us - prev_end_us AS idle_us,
       CASE WHEN launch_ts_us > prev_end_us THEN 'host_wait'
            WHEN ts_us - prev_end_us < {float(consecutive_kernel_delay_us)!r} THEN 'kernel_wait'
            ELSE 'other' END AS idle_category,
       step, stage
FROM g"""


def idle_breakdown_sql(keys: tuple[str, ...] = (), source: str = "trace_idle_intervals") -> str:
    """Idle seconds per run, rank, stream, ``keys`` and category, and the category's share of the
    stream's idle time (HTA's ``idle_time_ratio``)."""
    part = ("run_id", "rank", "stream", *keys)
    p = ", ".join(part)
    return f"""
SELECT {lead(part)}idle_category, coalesce(sum(idle_us), 0) * {US} AS idle_time_s,
       coalesce(sum(idle_us), 0) / nullif(sum(sum(idle_us)) OVER (PARTITION BY {p}), 0) AS idle_time_ratio,
       count(idle_us) AS gaps
FROM {source} GROUP BY {p}, idle_category"""
