"""Profiler traces at the depth of HolisticTraceAnalysis (HTA 0.5.0), per RL stage.

Every view mirrors one of HTA's analyses (its module in ``analyses/trace/`` says which function,
how, and where our definition differs and why) or answers one of them per RL stage
(``analyses/trace/stages.py``). They read the ``trace_kernels``, ``trace_ops`` and ``trace_ranks``
tables the Kineto reader writes. ``kernel_idle_breakdown``, ``comm_comp_overlap`` and
``kernel_type_breakdown`` carry HTA's numbers under fixed names and columns, so any DuckDB client
can check them against HTA; ``tests/test_trace_vs_hta.py`` does, on every shared trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.trace import (
    breakdown,
    counters,
    diff,
    idle,
    launches,
    sequences,
    stage_time,
    stragglers,
    user_annotations,
)
from analyses.views.group import ReadView, View, ViewGroup

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

_STAGE = ("stage",)


def _v(name: str, sql: str, doc: str) -> View:
    return View(name, sql, doc)


IDLE_INTERVALS = _v(
    "trace_idle_intervals", idle.idle_intervals_sql(),
    "Per window GPU kernel (kernel, memcpy, memset) of a trace: the gap on its stream before it (start_us, end_us, "
    "idle_us; NULL for a stream's first kernel) and HTA's idle_category (host_wait: its launch came after the previous "
    "kernel ended; kernel_wait: gap < 30 µs; other), with the kernel's step and stage. HTA get_idle_time_breakdown's "
    "intervals (analyses/trace/idle.py).")
KERNEL_IDLE_BREAKDOWN = _v(
    "kernel_idle_breakdown",
    f"SELECT run_id, rank, stream, idle_category, idle_time_s FROM ({idle.idle_breakdown_sql()})",
    "Per run x rank x stream x idle_category (host_wait | kernel_wait | other): idle_time_s. HTA's "
    "get_idle_time_breakdown (consecutive_kernel_delay 30, which HTA compares in µs though it documents ns).")
KERNEL_IDLE_BY_STAGE = _v(
    "kernel_idle_by_stage", idle.idle_breakdown_sql(_STAGE),
    "Per run x rank x stream x stage x idle_category: idle_time_s, idle_time_ratio (share of the stream's idle time in "
    "the stage), gaps. A gap belongs to the stage of the kernel that ends it.")
TEMPORAL = _v(
    "temporal_breakdown", breakdown.temporal_sql(),
    "Per run x rank: kernel_time_s (last GPU end - first start in HTA's window), idle_s, compute_s, non_compute_s "
    "and their shares. HTA's get_temporal_breakdown.")
TEMPORAL_BY_STAGE = _v(
    "temporal_breakdown_by_stage", breakdown.temporal_sql(_STAGE),
    "temporal_breakdown per RL stage: each stage's GPU work (kernels launched in it) treated as HTA treats a rank's.")
KERNEL_TYPES = _v(
    "kernel_type_breakdown",
    f"SELECT run_id, kernel_type, sum_s, share_pct FROM ({breakdown.kernel_type_sql()})",
    "Per run x kernel_type as HTA labels it (COMPUTATION, COMMUNICATION, MEMORY and 'X overlapping Y' combinations): "
    "sum_s over the run's ranks and share_pct of the total. HTA get_gpu_kernel_breakdown's first table (HTA rounds "
    "the share to 0.1; we do not).")
KERNEL_TYPES_BY_STAGE = _v(
    "kernel_type_by_stage", breakdown.kernel_type_sql(_STAGE, by_rank=True),
    "Per run x rank x stage x kernel_type: sum_s and share_pct within the rank's stage.")
TOP_KERNELS = _v(
    "top_kernels", breakdown.top_kernels_sql(),
    "Per run x rank x kernel_type (COMPUTATION | COMMUNICATION | MEMORY) x kernel name: sum_s, max_s, min_s, mean_s, "
    "std_s, count, share_of_type; past 10 names or the 0.8 quantile of the running sum the rest is one 'others' row "
    "(is_others). HTA get_gpu_kernel_breakdown's second table, with each kept kernel's own statistics (see "
    "analyses/trace/sqlparts.py).")
KERNELS_BY_STAGE = _v(
    "kernels_by_stage", breakdown.kernels_by_sql(_STAGE),
    "Per run x rank x stage x kernel_type x kernel name: count, sum_s, mean_s, max_s, share_of_gpu_time (of the "
    "rank's kernel time in the stage). Every kernel of HTA's window, none grouped.")
OVERLAP = _v(
    "comm_comp_overlap", f"SELECT run_id, rank, overlap_pct FROM ({breakdown.overlap_sql()})",
    "Per run x rank: overlap_pct, the time a COMPUTATION and a COMMUNICATION kernel run at once as a percentage of "
    "communication time (NULL without communication). HTA's get_comm_comp_overlap.")
OVERLAP_BY_STAGE = _v(
    "comm_comp_overlap_by_stage", breakdown.overlap_sql(_STAGE),
    "Per run x rank x stage: overlap_pct, comm_s, overlap_s.")
LAUNCH_STATS = _v(
    "kernel_launch_stats", launches.launch_stats_sql(),
    "Per launched GPU event of HTA's window (cudaLaunchKernel[ExC], cudaMemcpyAsync, cudaMemsetAsync): "
    "cpu_duration_us, gpu_duration_us, launch_delay_us (GPU start - launch end, clipped at 0), is_short "
    "(cpu <= 50 µs and gpu < cpu), is_runtime_outlier (cpu > 50 µs), is_launch_delay_outlier (delay > 100 µs), "
    "step, stage. HTA's get_cuda_kernel_launch_stats.")
LAUNCH_SUMMARY = _v(
    "kernel_launch_summary", launches.launch_summary_sql(),
    "Per run x rank: launches, short_kernels, runtime_outliers, launch_delay_outliers and the mean / p50 / p99 / "
    "max launch delay (quantile_cont).")
LAUNCH_BY_STAGE = _v(
    "kernel_launch_by_stage", launches.launch_summary_sql(_STAGE), "kernel_launch_summary per RL stage.")
QUEUE_POINTS = _v(
    "trace_queue_length", counters.queue_points_sql(),
    "Per change of a CUDA stream's launch queue (+1 at a launch, -1 when its GPU event starts): ts_us, d, "
    "queue_length after it, hold_us until the next change, stage, step. HTA's get_queue_length_time_series.")
QUEUE_SUMMARY = _v(
    "queue_length_summary", counters.queue_summary_sql(),
    "Per run x rank x stream: count, mean, std, min, p25, p50, p75, max of the queue length (pandas describe(), "
    "linear quantiles). HTA's get_queue_length_summary.")
QUEUE_BY_STAGE = _v("queue_length_by_stage", counters.queue_summary_sql(_STAGE), "queue_length_summary per stage.")
QUEUE_FULL = _v(
    "queue_full_time", counters.queue_full_sql(),
    "Per run x rank x stream whose queue reached 1024: duration_at_max_queue_length_s and its share of HTA's trace "
    "duration. HTA's get_time_spent_blocked_on_full_queue (which keeps one stream per rank; we keep them all).")
MEMORY_POINTS = _v(
    "trace_memory_bw", counters.memory_bw_points_sql(),
    "Per change of a memory-copy kind's bandwidth (copy_kind: Memcpy DtoH | HtoD | DtoD | Memset | Memcpy Unknown): "
    "ts_us and memory_bw_gbps, the summed bandwidth of the copies running after it. HTA's get_memory_bw_time_series.")
MEMORY_SUMMARY = _v(
    "memory_bw_summary", counters.memory_bw_summary_sql(),
    "Per run x rank x copy_kind: describe() of the bandwidth values above 0 (count, mean, std, min, p25, p50, p75, "
    "max; GB/s). HTA's get_memory_bw_summary.")
MEMORY_BY_STAGE = _v("memory_bw_by_stage", counters.memory_bw_summary_sql(_STAGE), "memory_bw_summary per stage.")
ANNOTATIONS = _v(
    "user_annotation_breakdown", user_annotations.annotation_breakdown_sql(),
    "Per run x rank x on_gpu (gpu_user_annotation: the range's GPU span; else the CPU user_annotation) x annotation "
    "name: sum_s, max_s, min_s, mean_s, std_s, count, is_others (past 1000 names). HTA's "
    "get_gpu_user_annotation_breakdown (use_gpu_annotation True and False).")
SEQUENCES = _v(
    "frequent_kernel_sequences", sequences.all_sequences_sql(),
    "Per run x rank x operator (every CPU op name at its shallowest call depth with >= 3 kernels in its subtree) x "
    "pattern (operator|kernel|kernel|... in start order): pattern_len, count, kernel_dur_s, op_dur_s, "
    "rank_in_operator (1 = most frequent). HTA's get_frequent_cuda_kernel_sequences for an exact operator name.")
STRAGGLER_METRIC = _v(
    "straggler_metric", stragglers.straggler_metric_sql(),
    "Per run x rank x step: the metric kernel (the communication kernel whose duration varies most across ranks) and "
    "its normalized_start_time ((start - first event) / mean step time), normalized_duration, stage, flagged (among "
    "the step's 2 latest starters). HTA's straggler metric.")
STRAGGLERS = _v(
    "trace_stragglers", stragglers.stragglers_sql(),
    "Per run x rank: straggler_count (steps that flagged it), steps, metric_kernel, metric_stream, "
    "mean_normalized_start_time, is_potential_straggler (the 2 ranks flagged most often). HTA's get_potential_stragglers.")
OP_SUMMARY = _v(
    "trace_op_summary", diff.OP_SUMMARY_SQL,
    "Per run x rank x step x stage x device (CPU | GPU) x category x name: counts and total_duration_s of the "
    "trace's events (every event, not HTA's window; GPU events by their launch's step). What TraceDiff compares: "
    "analyses.trace.diff.trace_diff or `polytrace trace-diff`.")
STAGE_TIME = _v(
    "trace_stage_time", stage_time.stage_time_sql(),
    "Per run x rank x step x stage: spans and span_s (the stage's record_function spans, CPU wall time), kernels, "
    "kernel_s, gpu_busy_s (union), host_wait_s, kernel_wait_s, other_idle_s (idle before the stage's kernels).")
STAGE_VS_LOG = _v(
    "trace_stage_vs_log", stage_time.stage_vs_log_sql(),
    "Per run x stage: trace_mean_s (profiler: stage seconds per rank and traced step), trace_step_share, "
    "log_mean_s (console log: timing_s/<stage> per logged step), log_step_share (of timing_s/step), trace_over_log.")
TIMELINE = _v(
    "trace_timeline", stage_time.timeline_sql(),
    "Per run x rank x time bin (up to 400 per run; t_s from the run's first traced event): busy_share and the "
    "host_wait / kernel_wait / other share of GPU idle time in the bin (a gap's cause: the idle category of the "
    "kernel that ends it).")

_VIEWS = (IDLE_INTERVALS, KERNEL_IDLE_BREAKDOWN, KERNEL_IDLE_BY_STAGE, TEMPORAL, TEMPORAL_BY_STAGE, KERNEL_TYPES,
          KERNEL_TYPES_BY_STAGE, TOP_KERNELS, KERNELS_BY_STAGE, OVERLAP, OVERLAP_BY_STAGE, LAUNCH_STATS,
          LAUNCH_SUMMARY, LAUNCH_BY_STAGE, QUEUE_POINTS, QUEUE_SUMMARY, QUEUE_BY_STAGE, QUEUE_FULL, MEMORY_POINTS,
          MEMORY_SUMMARY, MEMORY_BY_STAGE, ANNOTATIONS, SEQUENCES, STRAGGLER_METRIC, STRAGGLERS, OP_SUMMARY,
          STAGE_TIME, STAGE_VS_LOG, TIMELINE)

def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws
    from analyses.trace.figures import (
        idle_by_stage_figure,
        kernel_types_figure,
        timeline_figure,
        top_kernels_figure,
    )

    stragglers = read("trace_stragglers")
    out = F.per_run(read("trace_timeline"), runs, "profiler_trace__timeline",
                    lambda tl, r: timeline_figure(tl, r, stragglers), True)
    kt = read("kernel_type_breakdown")
    if kt.height:
        out.append(F.FigureSpec("profiler_trace__kernel_types", kernel_types_figure(kt), True))
    out += F.per_run(read("top_kernels"), runs, "profiler_trace__top_kernels", top_kernels_figure)
    out += F.per_run(read("kernel_idle_by_stage"), runs, "profiler_trace__idle_by_stage", idle_by_stage_figure)
    return out


GROUP = ViewGroup(
    name="profiler_trace",
    order=45,
    title="Profiler traces (HTA analyses, per RL stage)",
    question="Below the step: which kernels, how much GPU idle and why, did communication overlap compute, which "
             "rank straggled, and in which RL stage?",
    needs="PyTorch profiler (Kineto) traces",
    main=TEMPORAL,
    views=_VIEWS,
    headline_sql="""
        WITH idle AS (
            SELECT run_id, rank, sum(idle_time_s) FILTER (WHERE idle_category = 'host_wait') AS hw,
                   sum(idle_time_s) FILTER (WHERE idle_category = 'kernel_wait') AS kw,
                   sum(idle_time_s) FILTER (WHERE idle_category = 'other') AS ot, sum(idle_time_s) AS total
            FROM kernel_idle_breakdown GROUP BY ALL
        ), top AS (
            SELECT run_id, rank, arg_max(name, sum_s) AS top_kernel, max(share_of_type) AS top_kernel_share_of_type
            FROM top_kernels WHERE NOT is_others GROUP BY ALL
        )
        SELECT t.run_id, t.rank, r.n_steps AS steps, round(t.kernel_time_s, 3) AS kernel_time_s,
               round(1 - t.idle_share, 3) AS gpu_busy_share, round(t.compute_share, 3) AS compute_share,
               round(i.hw / nullif(i.total, 0), 3) AS idle_host_wait, round(i.kw / nullif(i.total, 0), 3) AS idle_kernel_wait,
               round(i.ot / nullif(i.total, 0), 3) AS idle_other, round(o.overlap_pct, 2) AS comm_comp_overlap_pct,
               top.top_kernel, coalesce(s.is_potential_straggler, false) AS potential_straggler
        FROM temporal_breakdown t
        LEFT JOIN (SELECT run_id, rank, max(n_steps) AS n_steps FROM trace_ranks GROUP BY ALL) r USING (run_id, rank)
        LEFT JOIN idle i USING (run_id, rank) LEFT JOIN comm_comp_overlap o USING (run_id, rank)
        LEFT JOIN top USING (run_id, rank) LEFT JOIN trace_stragglers s USING (run_id, rank)
        ORDER BY t.run_id, t.rank""",
    figures=_figures,
)
