"""Training health per step, and the alerts a run raises: did the training itself go wrong?

``training_health`` puts per step what the trainer logged about its batch (response length,
clip ratio, aborts, turns, reward, entropy, KL, MFU, memory) under one set of column names,
whichever framework or verl generation wrote the run: each column reads canonical metric names
(:data:`analyses.steps.CANONICAL_METRICS`, of the kinds in :data:`analyses.steps.HEALTH_KINDS`).
Runs that log per-sample rows instead (PolyTrace workload logs, rollout dumps) get the length,
clip, reward and turn columns from their training samples (``source = 'samples'``).

``health_alerts`` applies :data:`ALERT_RULES`, the one place where the rules and thresholds live
(docs/views.md states them):

``drop`` rules
    a step is *low* when its value is below ``threshold`` x the run's *earlier level* (the highest
    median of :data:`LEVEL_WINDOW` consecutive steps before it: the level the run had reached; a
    full window is required), measured from the *floor*: 0, or the run's first level (its first full
    window) when that is negative. So it is ``value < floor + threshold x (earlier level - floor)``,
    with the earlier level above the floor. For a quantity that is never negative (lengths, entropy,
    throughput, a 0/1 reward) the floor is 0 and this is ``value < threshold x earlier level``. A
    signed reward (a penalty for a wrong format, rewards in [-1, 1]) that climbed from -1 to -0.2 is
    low below -0.6, having lost half of what it gained; a fraction of a negative level (half of -0.2)
    would call every later improvement a collapse, and a level near 0 would call noise one. A signed
    reward that never rose above its start has gained nothing to lose: it raises no collapse (there
    is no scale to measure a fall by: the open-agentrl run i80's reward slides from -0.68 to -1);
``above`` rules
    a step is *high* when its value is at least ``threshold``.

A rule raises an alert when at least ``sustain`` consecutive steps of the run (in step order,
among the steps that have the column) are low/high: one noisy step is not an alert. The alert's
``first_step`` is the first step of the first such stretch, ``last_step`` the last step of the
last one. Partial steps (``partial``: fewer than :data:`analyses.run_facts.PARTIAL_STEP_SHARE` of
the median step's training samples) are shown in ``training_health`` and left out of the alerts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyses.run_facts import IDLE_UTIL_PCT, PARTIAL_STEP_SHARE, UTIL_METRIC
from analyses.steps import HEALTH_KINDS, canonical_info
from analyses.views.group import ReadView, View, ViewGroup

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import polars as pl

    from analyses.figures import FigureSpec


@dataclass(frozen=True)
class HealthColumn:
    """A ``training_health`` column: the first of ``metrics`` (canonical step metrics) logged at the
    step, else ``from_samples`` (an aggregate over the step's training samples), else NULL."""

    name: str
    metrics: tuple[str, ...]
    from_samples: str | None = None


HEALTH_COLUMNS: tuple[HealthColumn, ...] = (
    HealthColumn("response_length_mean", ("response_length/mean",), "avg(response_tokens)"),
    HealthColumn("response_length_max", ("response_length/max",), "max(response_tokens)"),
    HealthColumn("response_length_min", ("response_length/min",), "min(response_tokens)"),
    HealthColumn("clip_ratio", ("response_length/clip_ratio",),
                 "avg(CAST(coalesce(truncated, response_tokens >= max_response_length) AS DOUBLE))"),
    HealthColumn("aborted_ratio", ("response/aborted_ratio",)),
    HealthColumn("turns_mean", ("num_turns/mean",), "avg(n_turns)"),
    HealthColumn("turns_max", ("num_turns/max",), "max(n_turns)"),
    HealthColumn("reward_mean", ("critic/score/mean", "critic/rewards/mean"), "avg(reward)"),
    HealthColumn("reward_std", ("critic/score/std",), "stddev_samp(reward)"),
    HealthColumn("entropy", ("actor/entropy",)),
    HealthColumn("kl", ("actor/kl_loss", "critic/kl")),
    HealthColumn("mfu", ("perf/mfu/actor",)),
    HealthColumn("memory_allocated_gb", ("perf/max_memory_allocated_gb",)),
    HealthColumn("memory_reserved_gb", ("perf/max_memory_reserved_gb",)),
)

for _c in HEALTH_COLUMNS:  # every metric a column reads is canonical and of a health kind
    for _m in _c.metrics:
        _info = canonical_info(_m)
        if _info is None or _info.kind not in HEALTH_KINDS:
            raise ValueError(f"training_health column {_c.name!r} reads {_m!r}, not a canonical metric of a health kind")


@dataclass(frozen=True)
class AlertRule:
    """One health alert: ``kind`` is raised when ``sustain`` consecutive steps of ``column`` are
    below ``threshold`` x the earlier level (``test = 'drop'``) or at least ``threshold`` (``'above'``)."""

    kind: str
    column: str
    test: str
    threshold: float
    sustain: int
    meaning: str
    regime_change: bool  # the steps' workload differs from here on: step_variance fences each regime apart
    severity: str  # "error": the training broke (a collapse); "warn": worth a look (cap pressure, slowdown)


# the median of this many consecutive steps is a level; the earlier level is the highest before a step
LEVEL_WINDOW = 5
ALERT_RULES: tuple[AlertRule, ...] = (
    AlertRule("response_length_collapse", "response_length_mean", "drop", 0.03, 5,
              "mean response length below 3 % of the run's earlier level for 5+ steps (the policy stopped answering)", True,
              "error"),
    AlertRule("clip_ratio_high", "clip_ratio", "above", 0.10, 3,
              "10 %+ of the responses cut at the length cap for 3+ steps", True, "warn"),
    AlertRule("reward_collapse", "reward_mean", "drop", 0.5, 5,
              "mean reward below half the run's earlier level for 5+ steps, measured from 0, or from the run's "
              "first level when that is negative (it lost half of what it had gained)", False, "error"),
    AlertRule("entropy_collapse", "entropy", "drop", 0.05, 5,
              "policy entropy below 5 % of the run's earlier level for 5+ steps (the policy went deterministic; "
              "a converging PPO run, e.g. verl's Qwen2.5-0.5B GSM8K baseline, bottoms out near 8 %)", False, "error"),
    AlertRule("throughput_drop", "throughput_tokens_per_s", "drop", 0.5, 5,
              "job throughput (tokens/s) below half the run's earlier level for 5+ steps", True, "warn"),
)
ALERT_TESTS = ("drop", "above")
ALERT_SEVERITIES = ("error", "warn")
_COLUMNS = {c.name for c in HEALTH_COLUMNS} | {"throughput_tokens_per_s", "step_time_s"}
for _r in ALERT_RULES:
    if _r.column not in _COLUMNS or _r.test not in ALERT_TESTS or _r.sustain < 1 or _r.severity not in ALERT_SEVERITIES:
        raise ValueError(f"alert rule {_r.kind!r} is malformed")


def _metric_col(c: HealthColumn) -> str:
    picks = ", ".join(f"max(value) FILTER (WHERE metric = '{m}')" for m in c.metrics)
    return f"coalesce({picks}) AS {c.name}" if len(c.metrics) > 1 else f"{picks} AS {c.name}"


_WANTED = ", ".join(f"'{m}'" for c in HEALTH_COLUMNS for m in c.metrics)
_SAMPLE_COLS = [c for c in HEALTH_COLUMNS if c.from_samples]

TRAINING_HEALTH = View(
    "training_health",
    f"""
WITH m AS (
    SELECT run_id, step, {", ".join(_metric_col(c) for c in HEALTH_COLUMNS)}
    FROM step_metrics
    WHERE NOT is_validation AND isfinite(value) AND metric IN ({_WANTED})
    GROUP BY run_id, step
), s AS (
    SELECT run_id, step, count(*) AS n_samples, {", ".join(f"{c.from_samples} AS {c.name}" for c in _SAMPLE_COLS)}
    FROM samples LEFT JOIN (SELECT run_id, max_response_length FROM runs) USING (run_id)
    WHERE NOT coalesce(validate, false)
    GROUP BY run_id, step
), st AS (
    SELECT run_id, step, throughput_tokens_per_s, step_time_s FROM steps
), keys AS (
    SELECT run_id, step FROM m UNION SELECT run_id, step FROM s UNION SELECT run_id, step FROM st
)
SELECT k.run_id, k.step,
       CASE WHEN m.step IS NOT NULL OR st.step IS NOT NULL THEN 'step_log' ELSE 'samples' END AS source,
       s.n_samples,
       coalesce(s.n_samples < {PARTIAL_STEP_SHARE} * median(s.n_samples) OVER (PARTITION BY k.run_id), false) AS partial,
       {", ".join(f"coalesce(m.{c.name}, s.{c.name}) AS {c.name}" if c.from_samples else f"m.{c.name}" for c in HEALTH_COLUMNS)},
       st.throughput_tokens_per_s, st.step_time_s
FROM keys k LEFT JOIN m USING (run_id, step) LEFT JOIN s USING (run_id, step) LEFT JOIN st USING (run_id, step)
""",
    "Per run x training step: source ('step_log' when the trainer logged the step, else 'samples'), n_samples "
    f"(training samples of the step, when the run has samples), partial (n_samples < {PARTIAL_STEP_SHARE} x the "
    "median over the run's steps: a step cut short, e.g. the last step of a run stopped mid-rollout; the other "
    "views flag it and leave it out of their slopes and means), "
    + ", ".join(c.name for c in HEALTH_COLUMNS)
    + ", throughput_tokens_per_s, step_time_s. Each column is the first of its canonical step metrics the step logged "
    "(response_length/mean|max|min, response_length/clip_ratio, response/aborted_ratio, num_turns/mean|max, "
    "critic/score/mean (else critic/rewards/mean), critic/score/std, actor/entropy, actor/kl_loss (else critic/kl), "
    "perf/mfu/actor, perf/max_memory_allocated_gb|reserved_gb; TRL and older verl spellings are aliases), else the "
    "same quantity over the step's training samples (mean/max/min response_tokens, share truncated, mean/std reward, "
    "mean/max n_turns); throughput and step time from steps. NULL when neither exists.",
)

_long = "\nUNION ALL\n".join(
    f"SELECT run_id, step, '{r.kind}' AS kind, '{r.column}' AS metric, '{r.test}' AS test, "
    f"CAST({r.threshold} AS DOUBLE) AS threshold, {r.sustain} AS sustain, {r.regime_change} AS regime_change, "
    f"'{r.severity}' AS severity, "
    f"CAST({r.column} AS DOUBLE) AS value "
    f"FROM th WHERE {r.column} IS NOT NULL AND isfinite({r.column})"
    for r in ALERT_RULES
)

HEALTH_ALERTS = View(
    "health_alerts",
    f"""
WITH th AS MATERIALIZED (SELECT * FROM training_health WHERE NOT partial),
-- materialized: every rule reads it, and inlined it would pivot step_metrics once per rule
long AS ({_long}
), lvl AS (
    SELECT *, CASE WHEN count(*) OVER w = {LEVEL_WINDOW} THEN median(value) OVER w END AS level
    FROM long
    WINDOW w AS (PARTITION BY run_id, kind ORDER BY step ROWS BETWEEN {LEVEL_WINDOW - 1} PRECEDING AND CURRENT ROW)
), ref AS (
    SELECT *, max(level) OVER w AS earlier_level,
           -- the floor a drop is measured from: 0, or the run's first level when that is negative
           least(0, coalesce(arg_min(level, CASE WHEN level IS NOT NULL THEN step END) OVER w, 0)) AS floor
    FROM lvl
    WINDOW w AS (PARTITION BY run_id, kind ORDER BY step ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), hit AS (
    SELECT *, coalesce(CASE test WHEN 'drop' THEN earlier_level > floor
                                              AND value < floor + threshold * (earlier_level - floor)
                                 ELSE value >= threshold END, false) AS hit
    FROM ref
), isl AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, kind ORDER BY step)
              - row_number() OVER (PARTITION BY run_id, kind, hit ORDER BY step) AS island
    FROM hit
), stretch AS (
    -- metric, test, threshold, regime_change, severity and sustain are the rule's (one per kind):
    -- grouped by, never picked by any_value, so no plan can change what a row says
    SELECT run_id, kind, metric, test, threshold, regime_change, severity,
           min(step) AS first_step, max(step) AS last_step, count(*) AS n_steps,
           arg_min(value, step) AS first_value, arg_min(earlier_level, step) AS earlier_level,
           arg_min(floor, step) AS floor, min(value) AS min_value, max(value) AS max_value
    FROM isl WHERE hit GROUP BY run_id, kind, metric, test, threshold, regime_change, severity, sustain, island
    HAVING count(*) >= sustain
)
SELECT run_id, kind, metric, min(first_step) AS first_step, max(last_step) AS last_step,
       CAST(sum(n_steps) AS BIGINT) AS n_steps, count(*) AS stretches,
       arg_min(first_value, first_step) AS first_value, arg_min(earlier_level, first_step) AS earlier_level,
       arg_min(floor, first_step) AS floor, threshold, regime_change, severity,
       CASE test
         WHEN 'drop' THEN printf('%s fell to %.4g at step %d, below %g x its earlier level %.4g%s; low for %d step(s) '
                                 || 'in %d stretch(es) up to step %d',
                                 metric, arg_min(first_value, first_step), min(first_step), threshold,
                                 arg_min(earlier_level, first_step),
                                 CASE WHEN arg_min(floor, first_step) < 0
                                      THEN printf(' above its floor %.4g', arg_min(floor, first_step)) ELSE '' END,
                                 CAST(sum(n_steps) AS BIGINT), count(*), max(last_step))
         ELSE printf('%s >= %g for %d step(s) in %d stretch(es), steps %d-%d (max %.4g)',
                     metric, threshold, CAST(sum(n_steps) AS BIGINT), count(*), min(first_step),
                     max(last_step), max(max_value))
       END AS detail
FROM stretch GROUP BY run_id, kind, metric, test, threshold, regime_change, severity
""",
    "Per run x alert kind raised (" + ", ".join(r.kind for r in ALERT_RULES) + "): metric (the training_health "
    "column), first_step (first step of the first sustained stretch), last_step (last step of the last), n_steps "
    "(steps in sustained stretches), stretches, first_value, earlier_level (drop rules: the level it fell from), floor "
    "(drop rules: what the drop is measured from: 0, or the run's first level when negative), "
    "threshold, regime_change (the step workload changes: step_variance fences the steps before and after apart), "
    "severity ('error' for collapses, 'warn' for cap pressure and slowdowns: the Dagster alert checks' severity), "
    "detail (one sentence). Rules and thresholds: analyses.views.training_health.ALERT_RULES "
    "(docs/views.md).",
)

RUN_OVERVIEW = View(
    "run_overview",
    f"""
WITH f AS (
    SELECT run_id, string_agg(DISTINCT format, ', ' ORDER BY format)
               FILTER (WHERE status IN ('ok', 'partial') AND format <> 'unknown') AS formats,
           count(*) AS files, count(*) FILTER (WHERE status NOT IN ('ok', 'partial')) AS files_not_read,
           CAST(sum(rows_rejected) AS BIGINT) AS rejected_lines, CAST(sum(rows_superseded) AS BIGINT) AS superseded_rows,
           CAST(sum(rows_repeated) AS BIGINT) AS repeated_rows, CAST(sum(rows_ok) AS BIGINT) AS parsed_lines,
           string_agg(path || ': ' || status || coalesce(' (' || error || ')', ''), '; ' ORDER BY path) AS file_reasons
    FROM source_files GROUP BY run_id
), h AS (
    SELECT run_id, count(*) AS steps, count(*) FILTER (WHERE partial) AS partial_steps, min(step) AS first_step,
           max(step) AS last_step
    FROM training_health GROUP BY run_id
), rt AS (
    SELECT run_id, count(DISTINCT step) AS steps, min(step) AS first_step, max(step) AS last_step,
           count(DISTINCT rank) AS ranks
    FROM rank_times GROUP BY run_id
), win AS (
    SELECT run_id, epoch(max(end_ts)) - epoch(min(start_ts)) AS s FROM step_windows GROUP BY run_id
), st AS (
    SELECT run_id, sum(step_time_s) AS s FROM steps GROUP BY run_id
), tel AS (
    SELECT run_id, nullif(epoch(max(ts)) - epoch(min(ts)), 0) AS s FROM gpu_samples WHERE ts IS NOT NULL GROUP BY run_id
), gpu AS (
    -- GPUs with utilization telemetry; idle for the whole run = every sample below {IDLE_UTIL_PCT} % (run_facts)
    SELECT run_id, count(*) AS gpus_seen, count(*) FILTER (WHERE mx >= {IDLE_UTIL_PCT}) AS gpus_busy
    FROM (SELECT run_id, host, gpu, max(value) AS mx FROM gpu_samples
          WHERE metric = '{UTIL_METRIC}' AND value IS NOT NULL GROUP BY ALL)
    GROUP BY run_id
), a AS (
    SELECT run_id, count(*) AS n_alerts,
           string_agg(printf('%s (steps %d-%d)', kind, first_step, last_step), '; ' ORDER BY first_step, kind) AS alerts
    FROM health_alerts GROUP BY run_id
)
SELECT r.run_id, r.model, r.framework, r.task,
       coalesce(gpu.gpus_busy, r.n_gpus) AS gpus_used,
       CASE WHEN gpu.gpus_busy IS NOT NULL THEN 'telemetry' ELSE r.n_gpus_source END AS gpus_used_source,
       gpu.gpus_seen - gpu.gpus_busy AS gpus_idle_whole_run,
       coalesce(h.steps, rt.steps, 0) AS steps, coalesce(h.first_step, rt.first_step) AS first_step,
       coalesce(h.last_step, rt.last_step) AS last_step, coalesce(h.partial_steps, 0) AS partial_steps, rt.ranks,
       coalesce(win.s, st.s, tel.s) AS duration_s,
       CASE WHEN win.s IS NOT NULL THEN 'step_windows' WHEN st.s IS NOT NULL THEN 'sum_of_step_times'
            WHEN tel.s IS NOT NULL THEN 'telemetry_span' END AS duration_source,
       r.max_response_length, r.max_response_length_source,
       f.formats, f.files, f.files_not_read, f.rejected_lines, f.superseded_rows, f.repeated_rows,
       coalesce(f.parsed_lines, 0) > 0 AS has_data,
       coalesce(a.n_alerts, 0) + (coalesce(f.parsed_lines, 0) = 0)::INTEGER AS n_alerts,
       CASE WHEN coalesce(f.parsed_lines, 0) = 0 THEN 'no data: ' || coalesce(f.file_reasons, 'the run has no file')
            ELSE coalesce(a.alerts, 'none') END AS alerts
FROM runs r LEFT JOIN f USING (run_id) LEFT JOIN h USING (run_id) LEFT JOIN rt USING (run_id)
LEFT JOIN win USING (run_id) LEFT JOIN st USING (run_id) LEFT JOIN tel USING (run_id) LEFT JOIN gpu USING (run_id)
LEFT JOIN a USING (run_id)
""",
    "Per run, what a reader looks for first: model, framework, task (run.toml); gpus_used (GPUs whose telemetry is "
    f"not idle for the whole run, < {IDLE_UTIL_PCT} % in every sample; else runs.n_gpus) with gpus_used_source and "
    "gpus_idle_whole_run; steps (training steps, else the steps of per-rank times), first_step, last_step, "
    "partial_steps, ranks (with per-rank times); duration_s (span of the step windows, else the sum of step times, "
    "else the telemetry span; duration_source says which); the response cap and its source; formats ingested, files, "
    "files_not_read (status other than ok/partial), rejected_lines (source_files.rows_rejected), superseded_rows "
    "(rows_superseded: step metrics stored once because a later line or a better file has them too) and of them "
    "repeated_rows (rows_repeated: logged again later in the same file, docs/integrity.md); has_data (some file gave "
    "a parsed line); n_alerts and alerts (health_alerts: kind (steps first-last); for a run without data, "
    "'no data: ' and each file's path: status (reason)).",
)

# what the figure draws, top to bottom (columns of training_health)
PANEL = (("response_length_mean", "response length (mean)"), ("clip_ratio", "clip ratio"), ("reward_mean", "reward"),
         ("entropy", "entropy"), ("kl", "KL"))


def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    health, alerts = read("training_health"), read("health_alerts")

    def build(frame: pl.DataFrame, run: str) -> go.Figure:
        return F.training_health_figure(frame, alerts, run, PANEL)

    return F.per_run(health, runs, "training_health__panel", build, True)


GROUP = ViewGroup(
    name="training_health",
    order=5,
    title="Run overview and training health",
    question="What ran (model, GPUs, steps, duration, what was ingested and rejected), and did the training itself go "
             "wrong: responses collapsing or hitting the cap, reward or entropy collapsing, throughput dropping?",
    needs="runs and source_files; step_metrics (response_length/*, rewards, entropy, KL, ...) or samples for health",
    main=RUN_OVERVIEW,
    views=(TRAINING_HEALTH, HEALTH_ALERTS, RUN_OVERVIEW),
    headline_sql="""
        SELECT run_id, model, gpus_used, gpus_idle_whole_run, steps, round(duration_s / 3600, 2) AS duration_h,
               formats, rejected_lines, max_response_length AS cap, max_response_length_source AS cap_source, alerts
        FROM run_overview ORDER BY run_id""",
    figures=_figures,
)
