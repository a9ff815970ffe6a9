"""User-annotation breakdown: HTA's ``get_gpu_user_annotation_breakdown``
(``hta/analyzers/breakdown_analysis.py``).

Per rank, the ``record_function`` ranges by name: total, max, min, mean and std of their durations,
over HTA's window, from their GPU-side mirrors (``gpu_user_annotation``, HTA's default
``use_gpu_annotation=True``: the time the range's GPU work spans) or their CPU spans
(``user_annotation``). Past ``num_kernels`` (1000) names, or past the ``duration_ratio`` (0.8)
quantile of the running sum, the rest is one ``others`` row (see
:func:`analyses.trace.sqlparts.grouped_top`); ``allowlist_patterns`` keeps matching names apart.
HTA returns nothing (None) when the trace has no annotation of the kind; the view has no rows.
"""

from __future__ import annotations

from analyses.trace.sqlparts import US, WINDOW_OPS, grouped_top

NUM_KERNELS = 1000
DURATION_RATIO = 0.8


def annotation_breakdown_sql(num_kernels: int = NUM_KERNELS, duration_ratio: float = DURATION_RATIO,
                             allowlist_regex: str | None = None) -> str:
    keep = "false" if not allowlist_regex else "regexp_matches(name, " + _sql_str(allowlist_regex) + ")"
    src = (f"(SELECT run_id, rank, cat = 'gpu_user_annotation' AS on_gpu, name, dur_us FROM {WINDOW_OPS} "
           "WHERE cat IN ('gpu_user_annotation', 'user_annotation'))")
    return f"""
SELECT run_id, rank, on_gpu, name, s * {US} AS sum_s, mx * {US} AS max_s, mn * {US} AS min_s, mean * {US} AS mean_s,
       sd * {US} AS std_s, n AS count, is_others
FROM ({grouped_top(src, ("run_id", "rank", "on_gpu"), num_kernels, duration_ratio, keep)})"""


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"
