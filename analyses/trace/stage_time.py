"""RL stages in the profiler's own terms, beside the console log's, and the per-rank GPU timeline.

* ``trace_stage_time``: per run, rank, ProfilerStep and stage (:mod:`analyses.trace.stages`): the
  wall time of the stage's spans (CPU side, summed; a stage opened twice in a step counts twice),
  the GPU work launched in it (kernels, their summed time, the union of their intervals) and the
  idle time before them by cause (HTA's categories; :mod:`analyses.trace.idle`). Over every kernel
  of the trace, not HTA's window: the last ProfilerStep counts too.
* ``trace_stage_vs_log``: per run and stage, the profiler's mean seconds per traced step (over
  ranks and steps) beside the console log's ``timing_s/<stage>`` mean over its logged steps, and
  each one's share of its step (ProfilerStep wall time; ``timing_s/step``). They measure the
  same spans only when the traced steps are typical of the run; the ratio says how far apart.
* ``trace_timeline``: per run and rank, the trace cut into up to ``TIMELINE_BINS`` equal bins and
  each bin's share of GPU busy time and of idle time by cause (the cause of a gap in the rank's
  GPU activity is the category of the kernel that ends it). Time is seconds from the run's first
  traced event, so the ranks line up.
"""

from __future__ import annotations

from analyses.trace.sqlparts import US, WINDOW_KERNELS, merged_intervals
from analyses.trace.stages import STAGES

TIMELINE_BINS = 400


def span_stage(name: str = "name") -> str:
    """SQL: the stage a span name means (the registry of :mod:`analyses.trace.stages`), else NULL."""
    whens = " ".join(f"WHEN '{span}' THEN '{s.name}'" for s in STAGES for span in s.spans)
    return f"CASE lower(trim({name}, ' #\t')) {whens} END"


def stage_time_sql() -> str:
    k = "(SELECT run_id, path, rank, step, stage, ts_us AS s, ts_us + dur_us AS e, dur_us FROM trace_kernels)"
    return f"""
WITH spans AS (
    SELECT run_id, rank, step, {span_stage()} AS stage, sum(dur_us) AS span_us, count(*) AS spans
    FROM trace_ops WHERE cat = 'user_annotation' AND {span_stage()} IS NOT NULL GROUP BY ALL
), gpu AS (
    SELECT run_id, rank, step, stage, count(*) AS kernels, sum(dur_us) AS kernel_us FROM {k} GROUP BY ALL
), busy AS (
    SELECT run_id, rank, step, stage, sum(e - s) AS busy_us
    FROM ({merged_intervals(k, ("run_id", "path", "rank", "step", "stage"))}) GROUP BY ALL
), idle AS (
    SELECT run_id, rank, step, stage,
           sum(idle_us) FILTER (WHERE idle_category = 'host_wait') AS host_wait_us,
           sum(idle_us) FILTER (WHERE idle_category = 'kernel_wait') AS kernel_wait_us,
           sum(idle_us) FILTER (WHERE idle_category = 'other') AS other_idle_us
    FROM trace_idle_intervals GROUP BY ALL
)
SELECT run_id, rank, step, stage, coalesce(spans, 0) AS spans, span_us * {US} AS span_s,
       coalesce(kernels, 0) AS kernels, coalesce(kernel_us, 0) * {US} AS kernel_s, coalesce(busy_us, 0) * {US} AS gpu_busy_s,
       coalesce(host_wait_us, 0) * {US} AS host_wait_s, coalesce(kernel_wait_us, 0) * {US} AS kernel_wait_s,
       coalesce(other_idle_us, 0) * {US} AS other_idle_s
FROM spans FULL JOIN gpu USING (run_id, rank, step, stage) FULL JOIN busy USING (run_id, rank, step, stage)
     FULL JOIN idle USING (run_id, rank, step, stage)"""


def stage_vs_log_sql() -> str:
    names = ", ".join(f"'{s.name}'" for s in STAGES)
    return f"""
WITH steps AS (
    SELECT run_id, rank, step, dur_us FROM trace_ops
    WHERE cat NOT LIKE 'gpu_%' AND regexp_matches(name, '^ProfilerStep\\s*#\\s*\\d+$')
), tr AS (
    SELECT s.run_id, s.stage, avg(s.span_s) AS trace_mean_s, count(*) AS trace_rank_steps,
           avg(s.span_s / nullif(p.dur_us * {US}, 0)) AS trace_step_share
    FROM trace_stage_time s JOIN steps p USING (run_id, rank, step)
    WHERE s.stage IS NOT NULL AND s.span_s IS NOT NULL GROUP BY ALL
), lg AS (
    SELECT m.run_id, substr(m.metric, 10) AS stage, avg(m.value) AS log_mean_s, count(*) AS log_steps,
           avg(m.value / nullif(st.value, 0)) AS log_step_share
    FROM step_metrics m LEFT JOIN step_metrics st
      ON st.run_id = m.run_id AND st.step = m.step AND st.metric = 'timing_s/step' AND NOT coalesce(st.is_validation, false)
    WHERE m.metric IN (SELECT 'timing_s/' || unnest([{names}])) AND NOT coalesce(m.is_validation, false)
    GROUP BY ALL
)
SELECT run_id, stage, trace_mean_s, trace_rank_steps, trace_step_share, log_mean_s, log_steps, log_step_share,
       trace_mean_s / nullif(log_mean_s, 0) AS trace_over_log
FROM tr FULL JOIN lg USING (run_id, stage)
WHERE run_id IN (SELECT run_id FROM trace_ranks)"""


def timeline_sql(bins: int = TIMELINE_BINS) -> str:
    src = f"(SELECT run_id, path, rank, ev, ts_us AS s, ts_us + dur_us AS e FROM {WINDOW_KERNELS})"
    return f"""
WITH runs AS ({merged_intervals(src, ("run_id", "path", "rank"))}),
r AS (
    SELECT run_id, path, rank, s, e, lead(s) OVER (PARTITION BY run_id, path ORDER BY s) AS next_s FROM runs
), gap_cause AS (  -- the cause of a gap: the idle category of the first kernel after it
    SELECT k.run_id, k.path, k.ts_us AS s, arg_min(i.idle_category, k.ev) AS cause
    FROM {WINDOW_KERNELS} k JOIN trace_idle_intervals i USING (run_id, path, ev) GROUP BY ALL
), seg AS (
    SELECT run_id, rank, s, e, 'busy' AS state FROM r
    UNION ALL
    SELECT r.run_id, r.rank, r.e, r.next_s, coalesce(g.cause, 'other')
    FROM r LEFT JOIN gap_cause g ON g.run_id = r.run_id AND g.path = r.path AND g.s = r.next_s
    WHERE r.next_s IS NOT NULL
), span AS (
    SELECT run_id, min(s) AS t0, greatest((max(e) - min(s)) / {int(bins)}, 1) AS w FROM seg GROUP BY run_id
), b AS (
    SELECT seg.run_id, seg.rank, seg.state, seg.s - span.t0 AS s, seg.e - span.t0 AS e, span.w,
           unnest(range(CAST(floor((seg.s - span.t0) / span.w) AS BIGINT),
                        CAST(floor((seg.e - span.t0) / span.w) AS BIGINT) + 1)) AS bin
    FROM seg JOIN span USING (run_id) WHERE seg.e > seg.s
)
SELECT run_id, rank, bin, bin * any_value(w) * {US} AS t_s, any_value(w) * {US} AS width_s,
       sum(least(e, (bin + 1) * w) - greatest(s, bin * w)) FILTER (WHERE state = 'busy') / any_value(w) AS busy_share,
       sum(least(e, (bin + 1) * w) - greatest(s, bin * w)) FILTER (WHERE state = 'host_wait') / any_value(w) AS host_wait_share,
       sum(least(e, (bin + 1) * w) - greatest(s, bin * w)) FILTER (WHERE state = 'kernel_wait') / any_value(w) AS kernel_wait_share,
       sum(least(e, (bin + 1) * w) - greatest(s, bin * w)) FILTER (WHERE state = 'other') / any_value(w) AS other_share
FROM b WHERE least(e, (bin + 1) * w) > greatest(s, bin * w) GROUP BY run_id, rank, bin"""
