"""Per-step throughput and time variance, from ``steps``.

Outliers use Tukey's fences on quantile_cont (linear interpolation): a step is an outlier of a
metric when its value is below Q1 - 1.5 IQR or above Q3 + 1.5 IQR of the steps of its *regime*.
A run's regimes are cut at its health alerts that change the step workload (``health_alerts``
with ``regime_change``: a response-length collapse, responses hitting the cap, a throughput
drop; at the alert's first step and the step after its last): a run whose responses collapsed at step 12 runs a different workload
from there on, and fences over both would flag every healthy step as an outlier of the collapse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.views.group import ReadView, View, ViewGroup
from analyses.views.sql import ratio

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

STEP_SERIES_METRICS = ("throughput_tokens_per_s", "step_time_s", "gen_time_s")
TUKEY_K = 1.5

_long = "\nUNION ALL\n".join(
    f"SELECT run_id, step, '{m}' AS metric, {m} AS value FROM steps WHERE {m} IS NOT NULL"
    for m in STEP_SERIES_METRICS
)

STEP_SERIES = View(
    "step_series",
    f"""
WITH long AS ({_long}),
changes AS MATERIALIZED (SELECT run_id, first_step, last_step FROM health_alerts WHERE regime_change),
bounds AS (SELECT run_id, first_step AS b FROM changes UNION SELECT run_id, last_step + 1 FROM changes
), tagged AS (
    SELECT l.*, (SELECT count(*) FROM bounds x WHERE x.run_id = l.run_id AND x.b <= l.step) AS regime FROM long l
), fences AS (
    SELECT run_id, metric, regime, quantile_cont(value, 0.25) AS q1, quantile_cont(value, 0.75) AS q3
    FROM tagged GROUP BY run_id, metric, regime
)
SELECT l.run_id, l.step, l.metric, l.value, l.regime,
       l.value < f.q1 - {TUKEY_K} * (f.q3 - f.q1) OR l.value > f.q3 + {TUKEY_K} * (f.q3 - f.q1) AS is_outlier
FROM tagged l JOIN fences f USING (run_id, metric, regime)
""",
    "Per run x step x metric (throughput_tokens_per_s, step_time_s, gen_time_s): value, regime (0, 1, ...: the "
    "run's steps cut at each workload-changing health alert's first step and the step after its last), is_outlier "
    f"(Tukey fences: outside [Q1 - {TUKEY_K} IQR, Q3 + {TUKEY_K} IQR] of the steps of the same regime, quantile_cont).",
)

STEP_VARIANCE = View(
    "step_variance",
    f"""
SELECT run_id, metric, count(*) AS n_steps, avg(value) AS mean, stddev_samp(value) AS std,
       {ratio("stddev_samp(value)", "avg(value)")} AS cv, min(value) AS min,
       quantile_cont(value, 0.5) AS median, max(value) AS max,
       {ratio("max(value)", "min(value)")} AS max_over_min,
       count(DISTINCT regime) AS n_regimes, count(*) FILTER (WHERE is_outlier) AS n_outliers,
       list(step ORDER BY step) FILTER (WHERE is_outlier) AS outlier_steps
FROM step_series GROUP BY run_id, metric
""",
    "Per run x metric (throughput_tokens_per_s, step_time_s, gen_time_s): n_steps, mean, std (sample), "
    "cv = std/mean, min, median (quantile_cont), max, max_over_min, n_regimes, n_outliers and outlier_steps (Tukey "
    "fences per regime, see step_series).",
)


def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    s = read("step_series")
    return [F.FigureSpec(f"step_variance__{m}", F.step_series_figure(s, m), m == "throughput_tokens_per_s")
            for m in STEP_SERIES_METRICS]


GROUP = ViewGroup(
    name="step_variance",
    order=20,
    title="Per-step throughput and variance",
    question="How much does a step's throughput and time vary, and which steps are outliers?",
    needs="steps (throughput, step / generation time from the trainer log)",
    main=STEP_VARIANCE,
    views=(STEP_SERIES, STEP_VARIANCE),
    headline_sql="""
        SELECT run_id, metric, n_steps, round(mean, 2) AS mean, round(cv, 3) AS cv,
               round(max_over_min, 2) AS max_over_min, n_outliers, outlier_steps
        FROM step_variance ORDER BY run_id, metric""",
    figures=_figures,
)
