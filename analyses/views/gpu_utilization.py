"""GPU utilization from telemetry, per GPU and per training step where windows allow.

Utilization is the ``gpu_util_pct`` metric (nvidia-smi utilization.gpu, DCGM GPU_UTIL, wandb
gpu.N.gpu): the share of the sample period in which a kernel ran. A sample is idle when it is
below IDLE_UTIL_PCT: sampling jitter keeps an idle GPU at 0-2 %, never above.

A GPU whose every sample is idle is *idle for the whole run* (``idle_whole_run``): a GPU of the
node the job never used (the open-agentrl run logged 8 GPUs and used 4). It is reported
(``gpus_idle_whole_run``) but left out of the run's utilization, idle share and spread, which are
over the GPUs the job used (``gpus_used``); the same rule gives ``runs.n_gpus`` from telemetry
(:mod:`analyses.run_facts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.run_facts import IDLE_UTIL_PCT, UTIL_METRIC
from analyses.views.group import ReadView, View, ViewGroup

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import polars as pl

    from analyses.figures import FigureSpec

TIMELINE_POINTS = 300

# the utilization samples both views read
_UTIL = f"SELECT run_id, coalesce(host, '') AS host, gpu, ts, value FROM gpu_samples WHERE metric = '{UTIL_METRIC}' AND value IS NOT NULL"

GPU_UTILIZATION = View(
    "gpu_utilization",
    f"""
WITH u AS (
    {_UTIL}
), whole AS (
    SELECT run_id, host, gpu, max(value) < {IDLE_UTIL_PCT} AS idle_whole_run FROM u GROUP BY ALL
), tagged AS (
    SELECT run_id, 'run' AS scope, CAST(NULL AS BIGINT) AS step, host, gpu, value FROM u
    UNION ALL
    SELECT u.run_id, 'step', w.step, u.host, u.gpu, u.value
    FROM u JOIN step_windows w ON u.run_id = w.run_id AND u.ts >= w.start_ts AND u.ts < w.end_ts
), per_gpu AS (
    SELECT run_id, scope, step, host, gpu, count(*) AS n_samples, avg(value) AS mean_util_pct,
           avg(CAST(value < {IDLE_UTIL_PCT} AS DOUBLE)) AS idle_share
    FROM tagged GROUP BY ALL
)
SELECT p.*, wh.idle_whole_run,
       count(*) OVER g AS n_gpus,
       count(*) FILTER (WHERE NOT wh.idle_whole_run) OVER g AS gpus_used,
       count(*) FILTER (WHERE wh.idle_whole_run) OVER g AS gpus_idle_whole_run,
       avg(p.mean_util_pct) FILTER (WHERE NOT wh.idle_whole_run) OVER g AS used_gpus_mean_util_pct,
       avg(p.idle_share) FILTER (WHERE NOT wh.idle_whole_run) OVER g AS used_gpus_idle_share,
       avg(p.mean_util_pct) OVER g AS all_gpus_mean_util_pct,
       max(p.mean_util_pct) FILTER (WHERE NOT wh.idle_whole_run) OVER g
         - min(p.mean_util_pct) FILTER (WHERE NOT wh.idle_whole_run) OVER g AS gpu_spread_pct
FROM per_gpu p JOIN whole wh USING (run_id, host, gpu)
WINDOW g AS (PARTITION BY p.run_id, p.scope, p.step)
""",
    f"Per run x GPU (scope 'run', step NULL) and per run x step x GPU (scope 'step', samples inside the step's "
    f"step_windows [start_ts, end_ts)): n_samples, mean_util_pct, idle_share (share of samples < {IDLE_UTIL_PCT}% "
    f"utilization), idle_whole_run (every sample of the run < {IDLE_UTIL_PCT}%: a GPU the job never used), and over "
    "the GPUs of the same run/step: n_gpus (with telemetry), gpus_used, gpus_idle_whole_run, used_gpus_mean_util_pct "
    "and used_gpus_idle_share (means over the used GPUs), all_gpus_mean_util_pct (over every GPU), gpu_spread_pct "
    "(max - min of the used GPUs' means).",
)

GPU_TIMELINE = View(
    "gpu_timeline",
    f"""
WITH u AS (
    {_UTIL}
), span AS (
    -- a timeline needs two instants: a single scrape (or samples without time) draws none
    SELECT run_id, min(ts) AS t0,
           greatest(1.0, (epoch(max(ts)) - epoch(min(ts))) / {TIMELINE_POINTS}) AS bucket_s
    FROM u WHERE ts IS NOT NULL GROUP BY run_id HAVING count(DISTINCT ts) >= 2
)
SELECT u.run_id, u.host, u.gpu,
       s.t0 + to_microseconds(CAST(floor((epoch(u.ts) - epoch(s.t0)) / s.bucket_s) * s.bucket_s * 1e6 AS BIGINT)) AS ts,
       avg(u.value) AS util_pct, count(*) AS n_samples
FROM u JOIN span s USING (run_id)
WHERE u.ts IS NOT NULL
GROUP BY ALL
""",
    f"GPU utilization over time for plotting: per run x GPU, mean gpu_util_pct in buckets of max(1 s, "
    f"run span / {TIMELINE_POINTS}); ts = bucket start. Only runs with samples at two or more instants (a single "
    "scrape, or samples without a time, has no timeline).",
)

SPREAD_MOMENT = "second"  # GPUs are compared at the same moment: samples bucketed to the second

GPU_STEP_UTILIZATION = View(
    "gpu_step_utilization",
    f"""
WITH u AS (
    {_UTIL} AND ts IS NOT NULL
), used AS (
    SELECT run_id, host, gpu FROM u GROUP BY ALL HAVING max(value) >= {IDLE_UTIL_PCT}
), w AS (
    SELECT run_id, step, method, start_ts, end_ts, rollout_end_ts FROM step_windows
    WHERE start_ts IS NOT NULL AND end_ts IS NOT NULL
), j AS (
    SELECT u.run_id, u.host, u.gpu, u.ts, u.value, w.step,
           w.rollout_end_ts IS NOT NULL AND u.ts < w.rollout_end_ts AS in_rollout
    FROM (SELECT u.* FROM u JOIN used USING (run_id, host, gpu)) u
    ASOF JOIN w ON u.run_id = w.run_id AND u.ts >= w.start_ts
    WHERE u.ts < w.end_ts
), per_step AS (
    SELECT run_id, step, count(*) AS n_samples, count(DISTINCT host || chr(0) || coalesce(gpu, '')) AS n_gpus,
           avg(value) AS mean_util_pct, avg(CAST(value < {IDLE_UTIL_PCT} AS DOUBLE)) AS idle_share,
           count(*) FILTER (WHERE in_rollout) AS rollout_n_samples,
           avg(value) FILTER (WHERE in_rollout) AS rollout_mean_util_pct,
           avg(CAST(value < {IDLE_UTIL_PCT} AS DOUBLE)) FILTER (WHERE in_rollout) AS rollout_idle_share
    FROM j GROUP BY run_id, step
), per_moment AS (
    SELECT run_id, step, date_trunc('{SPREAD_MOMENT}', ts) AS moment, host, gpu, avg(value) AS v FROM j GROUP BY ALL
), moments AS (
    SELECT run_id, step, max(v) / avg(v) AS r FROM per_moment GROUP BY run_id, step, moment
    HAVING count(*) >= 2 AND avg(v) > 0
), spread AS (
    SELECT run_id, step, avg(r) AS spread_max_over_mean, count(*) AS spread_moments, max(r) AS spread_max_over_mean_max
    FROM moments GROUP BY run_id, step
)
SELECT w.run_id, w.step, w.method, w.start_ts, w.end_ts, w.rollout_end_ts,
       coalesce(p.n_samples, 0) AS n_samples, coalesce(p.n_gpus, 0) AS n_gpus, p.mean_util_pct, p.idle_share,
       coalesce(p.rollout_n_samples, 0) AS rollout_n_samples, p.rollout_mean_util_pct, p.rollout_idle_share,
       s.spread_max_over_mean, coalesce(s.spread_moments, 0) AS spread_moments, s.spread_max_over_mean_max
FROM w LEFT JOIN per_step p USING (run_id, step) LEFT JOIN spread s USING (run_id, step)
""",
    "Per run x step window (every window, also without telemetry), over the GPUs the job used: a sample belongs "
    "to the latest window starting at or before it (overlapping windows never count it twice). n_samples, n_gpus, "
    f"mean_util_pct, idle_share (< {IDLE_UTIL_PCT}%); the same inside [start_ts, rollout_end_ts) as rollout_*; "
    "spread_max_over_mean: at each second with >= 2 GPUs and a mean above 0, max / mean utilization across the "
    "GPUs, averaged over the step (spread_moments of them; spread_max_over_mean_max the worst).",
)


def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    import polars as pl

    from analyses import figures as F  # plotly: only when a report draws

    per_step = read("gpu_utilization").filter(pl.col("scope") == "step")
    windows = read("gpu_step_utilization").select("run_id", "step", "start_ts")

    def timeline(frame: pl.DataFrame, run: str) -> go.Figure:
        return F.gpu_timeline_figure(frame, run, windows)

    return [*F.per_run(read("gpu_timeline"), runs, "gpu_utilization__timeline", timeline, True),
            *F.per_run(per_step, runs, "gpu_utilization__per_step", F.gpu_step_figure)]


GROUP = ViewGroup(
    name="gpu_utilization",
    order=50,
    title="GPU utilization",
    question="How busy were the GPUs, per step where telemetry aligns?",
    needs="gpu_samples (gpu_util_pct), step_windows for per-step alignment",
    main=GPU_UTILIZATION,
    views=(GPU_UTILIZATION, GPU_TIMELINE, GPU_STEP_UTILIZATION),
    headline_sql="""
        SELECT run_id, max(n_gpus) AS gpus, max(gpus_used) AS gpus_used, max(gpus_idle_whole_run) AS gpus_idle_whole_run,
               sum(n_samples) AS samples, round(max(used_gpus_mean_util_pct), 1) AS mean_util_pct,
               round(max(used_gpus_idle_share), 3) AS idle_share, round(max(gpu_spread_pct), 1) AS gpu_spread_pct,
               (SELECT count(DISTINCT step) FROM gpu_utilization s WHERE s.run_id = g.run_id AND s.scope = 'step') AS aligned_steps
        FROM gpu_utilization g WHERE scope = 'run' GROUP BY run_id ORDER BY run_id""",
    figures=_figures,
)
