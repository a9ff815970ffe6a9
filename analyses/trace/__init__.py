"""Profiler-trace analyses at the depth of HolisticTraceAnalysis (HTA 0.5.0), over the warehouse.

HTA loads a directory of Kineto traces into pandas and answers questions about it; here the Kineto
reader streams each trace into the warehouse (``trace_kernels``, ``trace_ops``, ``trace_ranks``;
:mod:`analyses.trace.model`) and each of HTA's analyses is SQL over those tables, one module per
analysis, each saying which HTA function it mirrors and where it differs:

=====================================  ==========================================  =====================
HTA (``TraceAnalysis.`` ...)           here                                        views
=====================================  ==========================================  =====================
get_temporal_breakdown                 :mod:`.breakdown`                           temporal_breakdown
get_idle_time_breakdown                :mod:`.idle`                                kernel_idle_breakdown
get_gpu_kernel_breakdown               :mod:`.breakdown`                           kernel_type_breakdown, top_kernels
get_comm_comp_overlap                  :mod:`.breakdown`                           comm_comp_overlap
get_cuda_kernel_launch_stats           :mod:`.launches`                            kernel_launch_stats
get_queue_length_summary               :mod:`.counters`                            queue_length_summary
get_time_spent_blocked_on_full_queue   :mod:`.counters`                            queue_full_time
get_memory_bw_summary                  :mod:`.counters`                            memory_bw_summary
get_gpu_user_annotation_breakdown      :mod:`.user_annotations`                         user_annotation_breakdown
get_frequent_cuda_kernel_sequences     :mod:`.sequences`                           frequent_kernel_sequences
get_potential_stragglers               :mod:`.stragglers`                          trace_stragglers
TraceDiff.compare_traces / ops_diff    :mod:`.diff`                                trace_op_summary
=====================================  ==========================================  =====================

and, new, the RL stage of every kernel and idle interval (:mod:`.stages`), with ``*_by_stage``
views and the profiler's stage time beside the console log's (:mod:`.stage_time`).

:class:`TraceAnalysis` is the facade with HTA's method names and arguments, for the analyses
that take arguments the views fix to HTA's defaults; it returns Polars frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from analyses.trace import breakdown, counters, diff, idle, launches, sequences, stragglers, user_annotations

if TYPE_CHECKING:  # the views import this package's modules: Polars once an analysis returns a frame
    import duckdb
    import polars as pl

__all__ = ["TraceAnalysis", "TraceSelection"]

TraceSelection = diff.TraceSelection


class TraceAnalysis:
    """HTA's ``TraceAnalysis`` over one run's traces in the warehouse.

    ``con`` is a catalog connection (``PolyTrace(warehouse).connect()``); ``run_id`` the run whose
    traces (one per rank) are analysed. Times in the frames are seconds (``*_s``) or, where HTA's
    own columns are microseconds, ``*_us``.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str) -> None:
        self.con = con
        self.run_id = run_id

    def _q(self, sql: str, ranks: Sequence[int] | None = None, params: list[Any] | None = None) -> pl.DataFrame:
        where = "run_id = ?" + (" AND list_contains(?, rank)" if ranks is not None else "")
        p = [*(params or []), self.run_id, *([list(ranks)] if ranks is not None else [])]
        return self.con.sql(f"SELECT * FROM ({sql}) q WHERE {where}", params=p).pl()

    def get_temporal_breakdown(self) -> pl.DataFrame:
        return self._q(breakdown.temporal_sql()).sort("rank")

    def get_idle_time_breakdown(self, ranks: Sequence[int] | None = None, streams: Sequence[int] | None = None,
                                consecutive_kernel_delay_us: float = idle.DELAY_US, by_stage: bool = False) -> pl.DataFrame:
        import polars as pl

        src = f"({idle.idle_intervals_sql(consecutive_kernel_delay_us)})"
        df = self._q(idle.idle_breakdown_sql(("stage",) if by_stage else (), source=src), ranks)
        if streams:
            df = df.filter(pl.col("stream").is_in(list(streams)))
        return df.sort("rank", "stream", "idle_category")

    def get_gpu_kernel_breakdown(self, duration_ratio: float = breakdown.TOP_DURATION_RATIO,
                                 num_kernels: int = breakdown.TOP_NUM_KERNELS) -> tuple[pl.DataFrame, pl.DataFrame]:
        types = self._q(breakdown.kernel_type_sql()).sort("sum_s", descending=True)
        top = self._q(breakdown.top_kernels_sql(num_kernels, duration_ratio)).sort("kernel_type", "name", "rank")
        return types, top

    def get_comm_comp_overlap(self) -> pl.DataFrame:
        return self._q(breakdown.overlap_sql()).sort("rank")

    def get_cuda_kernel_launch_stats(self, ranks: Sequence[int] | None = None,
                                     runtime_cutoff_us: float = launches.RUNTIME_CUTOFF_US,
                                     launch_delay_cutoff_us: float = launches.LAUNCH_DELAY_CUTOFF_US,
                                     include_memory_events: bool = True) -> pl.DataFrame:
        return self._q(launches.launch_stats_sql(runtime_cutoff_us, launch_delay_cutoff_us, include_memory_events),
                       ranks).sort("rank", "correlation")

    def get_queue_length_summary(self, ranks: Sequence[int] | None = None) -> pl.DataFrame:
        return self._q(counters.queue_summary_sql(), ranks).sort("rank", "stream")

    def get_time_spent_blocked_on_full_queue(self, max_queue_length: int = counters.MAX_QUEUE_LENGTH) -> pl.DataFrame:
        return self._q(counters.queue_full_sql(max_queue_length)).sort("rank", "stream")

    def get_memory_bw_summary(self, ranks: Sequence[int] | None = None) -> pl.DataFrame:
        return self._q(counters.memory_bw_summary_sql(), ranks).sort("rank", "copy_kind")

    def get_gpu_user_annotation_breakdown(self, use_gpu_annotation: bool = True,
                                          duration_ratio: float = user_annotations.DURATION_RATIO,
                                          num_kernels: int = user_annotations.NUM_KERNELS,
                                          allowlist_patterns: Sequence[str] | None = None) -> pl.DataFrame:
        import polars as pl

        regex = "|".join(f"(?:{p})" for p in allowlist_patterns) if allowlist_patterns else None
        df = self._q(user_annotations.annotation_breakdown_sql(num_kernels, duration_ratio, regex))
        return df.filter(pl.col("on_gpu") == use_gpu_annotation).sort("rank", "name")

    def get_frequent_cuda_kernel_sequences(self, operator_name: str, min_pattern_len: int = sequences.MIN_PATTERN_LEN,
                                           rank: int = 0) -> pl.DataFrame:
        """Every pattern rooted at the shallowest ops whose name contains ``operator_name`` (HTA
        also writes an overlaid trace file of the ``top_k``; we return the table only)."""
        if not operator_name:
            raise ValueError("operator_name must be a non-empty string")
        sql = sequences.frequent_sequences_sql(min_pattern_len)
        return self._q(sql, params=[operator_name, rank]).sort(["count", "pattern"], descending=[True, False])

    def get_potential_stragglers(self, num_candidates: int = stragglers.NUM_CANDIDATES,
                                 min_normalized_duration: float = stragglers.MIN_NORMALIZED_DURATION) -> list[int]:
        metric = f"({stragglers.straggler_metric_sql(min_normalized_duration, max(num_candidates, 1))})"
        df = self._q(stragglers.stragglers_sql(max(num_candidates, 1), source=metric))
        return df.filter("is_potential_straggler").sort(["straggler_count", "rank"], descending=[True, False])["rank"].to_list()

    def compare_traces(self, control: diff.TraceSelection, test: diff.TraceSelection, device: str = "all",
                       use_short_name: bool = False) -> pl.DataFrame:
        return diff.trace_diff(self.con, control, test, device, use_short_name)
