"""Launch-queue length, time blocked on a full queue and memory-copy bandwidth: HTA's
``get_queue_length_summary``, ``get_time_spent_blocked_on_full_queue`` and
``get_memory_bw_summary`` (``hta/analyzers/trace_counters.py``), over HTA's window.

* Queue length of a CUDA stream: +1 when a runtime call (``cudaLaunchKernel``, ``cuLaunchKernel``,
  ``cudaMemcpyAsync``, ... HTA's ``get_runtime_launch_events_query``) enqueues a GPU event on it,
  -1 when that event starts; the summary is pandas' ``describe()`` of the values after each change
  (count, mean, std, min, 25/50/75 %, max).
* Time blocked: per stream, the time the length stays at or above ``max_queue_length`` (1024,
  ``CUDA_MAX_LAUNCH_QUEUE_PER_STREAM``), and that over HTA's trace duration (``trace_ranks.hta_span_us``).
* Memory bandwidth, per memory-copy kind (``Memcpy DtoH``, ``Memcpy HtoD``, ``Memcpy DtoD``,
  ``Memset``, ``Memcpy Unknown`` for dma): each copy adds its ``memory bandwidth (GB/s)`` while
  it runs (a 0 µs copy counts as 1 µs, HTA issue #20); the summary describes the values above 0.

Differences from HTA, stated:

* HTA's ``get_time_spent_blocked_on_full_queue`` keeps one stream per rank (it stores each
  stream's result under the rank's key, so the last stream wins); we give every stream.
* Simultaneous changes (a launch and a kernel start in the same microsecond): HTA orders them
  with an unstable sort, so the values at the instant differ between runs of pandas; we apply
  increments first (then by event number). Only the describe() of values that exist for 0 µs
  can differ, within a count or two on real traces.
* Memory bandwidth is a running float sum; a sum that returns to 0 can leave a residue of
  1e-13 GB/s, which HTA counts as a value above 0 when its (unstable) order leaves one; we do
  not count values below 1e-9 GB/s.
"""

from __future__ import annotations

from analyses.trace.events import QUEUE_LAUNCHES
from analyses.trace.sqlparts import US, WINDOW_KERNELS, describe, lead

MAX_QUEUE_LENGTH = 1024
BW_FLOOR_GBPS = 1e-9


def queue_points_sql(increments_first: bool = True) -> str:
    """The queue-length series: one row per change, with the length after it and how long it holds.
    Changes at one instant: increments first (``increments_first=False``: decrements first, the
    other extreme of HTA's unstable order)."""
    names = ", ".join(f"'{n}'" for n in QUEUE_LAUNCHES)
    order = "ts_us, d DESC, ev" if increments_first else "ts_us, d, ev"
    return f"""
WITH k AS (SELECT * FROM {WINDOW_KERNELS} WHERE launch_name IN ({names})),
p AS (
    SELECT run_id, path, rank, stream, launch_ts_us AS ts_us, 1 AS d, launch_ev AS ev, stage, step FROM k
    UNION ALL
    SELECT run_id, path, rank, stream, ts_us, -1, ev, stage, step FROM k
)
SELECT run_id, path, rank, stream, ts_us, d, stage, step,
       CAST(sum(d) OVER (PARTITION BY run_id, path, stream ORDER BY {order} ROWS UNBOUNDED PRECEDING) AS BIGINT)
           AS queue_length,
       lead(ts_us) OVER (PARTITION BY run_id, path, stream ORDER BY {order}) - ts_us AS hold_us
FROM p"""


def queue_summary_sql(keys: tuple[str, ...] = (), source: str = "trace_queue_length") -> str:
    part = ("run_id", "rank", "stream", *keys)
    return f"SELECT {lead(part)}{describe('queue_length')} FROM {source} GROUP BY ALL"


def queue_full_sql(max_queue_length: int = MAX_QUEUE_LENGTH, source: str = "trace_queue_length") -> str:
    return f"""
SELECT q.run_id, q.rank, q.stream, sum(q.hold_us) * {US} AS duration_at_max_queue_length_s,
       sum(q.hold_us) / max(r.hta_span_us) AS relative_duration_at_max_queue_length
FROM {source} q JOIN trace_ranks r USING (run_id, path)
WHERE q.queue_length >= {int(max_queue_length)}
GROUP BY q.run_id, q.rank, q.stream"""


def memory_bw_points_sql() -> str:
    """The bandwidth series per memory-copy kind: one row per change with the total after it."""
    kind = ("CASE WHEN left(name, 6) = 'Memset' THEN 'Memset' WHEN left(name, 6) <> 'Memcpy' THEN 'Memcpy Unknown' "
            "ELSE left(name, 11) END")
    return f"""
WITH m AS (
    SELECT run_id, path, rank, ev, stage, step, {kind} AS copy_kind, ts_us,
           CASE WHEN dur_us = 0 THEN 1 ELSE dur_us END AS dur_us, coalesce(memory_bw_gbps, 0) AS bw
    FROM {WINDOW_KERNELS} WHERE kernel_type = 'MEMORY'
), p AS (
    SELECT run_id, path, rank, copy_kind, ts_us, 0 AS side, ev, bw AS d, stage, step FROM m
    UNION ALL
    SELECT run_id, path, rank, copy_kind, ts_us + dur_us, 1, ev, -bw, stage, step FROM m
)
SELECT run_id, path, rank, copy_kind, ts_us, stage, step,
       sum(d) OVER (PARTITION BY run_id, path, copy_kind ORDER BY ts_us, side, ev ROWS UNBOUNDED PRECEDING) AS memory_bw_gbps
FROM p"""


def memory_bw_summary_sql(keys: tuple[str, ...] = (), source: str = "trace_memory_bw") -> str:
    part = ("run_id", "rank", "copy_kind", *keys)
    return (f"SELECT {lead(part)}{describe('memory_bw_gbps')} FROM {source} "
            f"WHERE memory_bw_gbps > {BW_FLOOR_GBPS!r} GROUP BY ALL")
