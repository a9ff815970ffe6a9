"""Potential stragglers across ranks: HTA's ``get_potential_stragglers`` with its default metric,
``find_stragglers_with_late_start_comm_kernels`` (``hta/analyzers/straggler.py``).

Over the window's events of every rank of a run, in the ProfilerSteps the window holds:

1. the mean step time = (latest end − earliest start of those events) / number of steps;
2. communication kernels (on streams > 0, steps > 0) lasting at least 1 % of it; of each
   (rank, stream, step, kernel name) the last one (file order);
3. the (stream, kernel name) whose duration varies most across ranks (the mean over steps of
   the per-step standard deviation across ranks) is the metric kernel;
4. its start, relative to the earliest event and in units of the mean step time, per rank and
   step; in each step the ``num_candidates`` (2) latest-starting ranks (ties at the threshold all
   count) are flagged; a rank's count is how many steps flagged it, and the ``num_candidates``
   ranks flagged most often are the potential stragglers (ties by rank, where HTA's sort leaves the
   order open). With one step the flag is the count.

Differences from HTA, stated:

* communication kernels are HTA's COMMUNICATION type (``^nccl.*Kernel``); HTA's straggler code
  takes names starting ``ncclKernel`` only, which NCCL ≥ 2.19 no longer writes
  (``ncclDevKernel_*``): on such traces HTA finds no metric kernel and raises;
* with one rank (no spread across ranks) or no such kernel there is no metric: HTA raises
  (``Encountered all NA values``), the views have no rows;
* when a step has fewer ranks than ``num_candidates`` HTA raises (IndexError); we flag them all.
"""

from __future__ import annotations

MIN_NORMALIZED_DURATION = 0.01
NUM_CANDIDATES = 2


def straggler_metric_sql(min_normalized_duration: float = MIN_NORMALIZED_DURATION,
                         num_candidates: int = NUM_CANDIDATES) -> str:
    """Per run, rank and step: the metric kernel's normalized start and whether it flags the rank."""
    return f"""
WITH steps AS (  -- the ProfilerSteps the window holds (HTA: the ones whose event is in it)
    SELECT DISTINCT run_id, CAST(regexp_extract(name, '^ProfilerStep\\s*#\\s*(\\d+)$', 1) AS BIGINT) AS step
    FROM trace_ops WHERE in_hta_window AND regexp_matches(name, '^ProfilerStep\\s*#\\s*\\d{{1,18}}$')
), ev AS (
    SELECT o.run_id, o.ts_us AS t0, o.ts_us + o.dur_us AS t1, o.step FROM trace_ops o JOIN steps USING (run_id, step)
    WHERE o.in_hta_window
    UNION ALL
    SELECT k.run_id, k.ts_us, k.ts_us + k.dur_us, k.step FROM trace_kernels k JOIN steps USING (run_id, step)
    WHERE k.in_hta_window AND k.step_by_launch AND k.stream > 0
), run AS (
    SELECT run_id, min(t0) AS t_min, (max(t1) - min(t0)) / count(DISTINCT step) AS mean_step_us FROM ev GROUP BY run_id
), long_comm AS (
    SELECT k.run_id, k.rank, k.stream, k.step, k.name, arg_max(k.ts_us, k.ev) AS ts_us, arg_max(k.dur_us, k.ev) AS dur_us,
           arg_max(k.stage, k.ev) AS stage
    FROM trace_kernels k JOIN run r USING (run_id) JOIN steps s USING (run_id, step)
    WHERE k.in_hta_window AND k.step_by_launch AND k.stream > 0 AND k.step > 0 AND k.kernel_type = 'COMMUNICATION'
      AND k.dur_us >= r.mean_step_us * {min_normalized_duration!r}
    GROUP BY k.run_id, k.rank, k.stream, k.step, k.name
), spread AS (
    SELECT run_id, stream, name, avg(sd) AS mean_sd FROM (
        SELECT l.run_id, l.stream, l.name, l.step, stddev_samp(l.dur_us / r.mean_step_us) AS sd
        FROM long_comm l JOIN run r USING (run_id) GROUP BY ALL
    ) GROUP BY ALL HAVING avg(sd) IS NOT NULL
), metric_kernel AS (
    SELECT run_id, stream, name FROM (
        SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY mean_sd DESC, stream, name) AS rn FROM spread
    ) WHERE rn = 1
), m AS (
    SELECT l.run_id, l.rank, l.step, l.stream, l.name AS kernel, l.stage,
           (l.ts_us - r.t_min) / r.mean_step_us AS normalized_start_time,
           l.dur_us / r.mean_step_us AS normalized_duration
    FROM long_comm l JOIN metric_kernel USING (run_id, stream, name) JOIN run r USING (run_id)
)
SELECT *, normalized_start_time >= coalesce(
           nth_value(normalized_start_time, {int(num_candidates)}) OVER (
               PARTITION BY run_id, step ORDER BY normalized_start_time DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING), -1e308) AS flagged
FROM m"""


def stragglers_sql(num_candidates: int = NUM_CANDIDATES, source: str = "straggler_metric") -> str:
    """Per run and rank: how many steps flagged it, and whether it is a potential straggler."""
    return f"""
SELECT run_id, rank, count(*) FILTER (WHERE flagged) AS straggler_count, count(*) AS steps,
       any_value(kernel) AS metric_kernel, any_value(stream) AS metric_stream,
       avg(normalized_start_time) AS mean_normalized_start_time,
       row_number() OVER (PARTITION BY run_id ORDER BY count(*) FILTER (WHERE flagged) DESC, rank) <= {int(num_candidates)}
           AS is_potential_straggler
FROM {source} GROUP BY run_id, rank"""
