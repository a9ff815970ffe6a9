"""Frequent CUDA kernel sequences: HTA's ``get_frequent_cuda_kernel_sequences``
(``hta/analyzers/cuda_kernel_analysis.py``).

For an operator name: among the window's CPU-side ops whose name contains it, those at the
shallowest call-stack depth (``trace_ops.depth``, HTA's CallGraph: the backward thread hangs under
the main thread) that launched at least ``min_pattern_len`` kernels in their subtree are roots;
each root's pattern is its name followed by the names of its subtree's kernels in start order,
``|``-joined. Per pattern: how many roots have it, their kernels' total duration and the roots'
own total duration, sorted by count (descending) then pattern. HTA returns every pattern (its
``top_k`` only chooses which ones it overlays on a trace file it writes); so does the view, ranked.

The view ``frequent_kernel_sequences`` does this for every op name as the operator (an exact
name, HTA's default ``min_pattern_len`` of 3); :func:`frequent_sequences_sql` takes HTA's
arguments (substring match, any length) for the facade.

Differences from HTA, stated:

* HTA places events of the GPU-side annotation lanes (``gpu_user_annotation``) in its call graph
  with depth -1 on device 0's lane (it takes a lane with pid 0 for a GPU stream and skips it) and
  as ordinary ops on the other devices' lanes; a GPU-side copy of the operator's name then sets
  the shallowest depth, and HTA finds no root. We keep those lanes out of the call stack.
* HTA's own ns rounding gives some sub-µs events a duration of -1 µs, which its call-graph sort
  refuses (``ValueError: Unexpected case``): it cannot run this analysis on ns-resolution traces.
  We can.
* Kernels of a root that start in the same microsecond: HTA orders them with an unstable sort; we
  by (start, event number).
"""

from __future__ import annotations

from analyses.trace.sqlparts import US, WINDOW_KERNELS, WINDOW_OPS

MIN_PATTERN_LEN = 3


def _roots(candidates: str, min_pattern_len: int, by_name: bool) -> str:
    part = "run_id, path, name" if by_name else "run_id, path"
    return f"""
SELECT * FROM (
    SELECT c.*, min(depth) OVER (PARTITION BY {part}) AS min_depth FROM ({candidates}) c
) WHERE depth = min_depth AND num_kernels >= {int(min_pattern_len)}"""


def _patterns(roots: str, operator_col: str) -> str:
    """Per root: the pattern; then per (run, rank, operator, pattern) the counts.

    A kernel is in a root's subtree when its launch (or its backward link) has a pos in the
    root's [pos, sub_end) of the same trace file. Subtrees of one depth never overlap, so per depth
    at most one root holds a given pos: an ASOF join (the root starting last at or before it, then
    checked against its end) finds it, per depth, in sorted order. The file is folded into the key
    (file number x 2**32 + pos). A range join did the same in minutes at x40 (DuckDB picks a
    piecewise merge join there, quadratic in practice)."""
    k = f"(SELECT run_id, path, ev, name, ts_us, launch_pos, link_pos FROM {WINDOW_KERNELS} WHERE stream > 0)"
    return f"""
WITH files AS (SELECT run_id, path, row_number() OVER (ORDER BY run_id, path) * 4294967296 AS f FROM trace_ranks),
r AS (SELECT x.*, f.f + x.pos AS lo, f.f + x.sub_end AS hi FROM ({roots}) x JOIN files f USING (run_id, path)),
depths AS (SELECT DISTINCT depth FROM r),
k AS (  -- each kernel once per root depth, through its launch and through its backward link
    SELECT x.ev AS k_ev, x.name AS k_name, x.ts_us AS k_ts, d.depth, f.f + g.p AS g
    FROM {k} x JOIN files f USING (run_id, path)
    CROSS JOIN (SELECT unnest([x.launch_pos, x.link_pos]) AS p) g
    CROSS JOIN depths d
    WHERE g.p IS NOT NULL
),
m AS (
    SELECT r.run_id, r.path, r.rank, r.ev AS root_ev, r.name AS root_name, {operator_col} AS operator,
           r.dur_us AS op_dur_us, r.kernel_dur_sum_us, k.k_ev, k.k_name, k.k_ts
    FROM k ASOF JOIN r ON k.depth = r.depth AND k.g >= r.lo
    WHERE k.g < r.hi
),
p AS (
    SELECT run_id, path, rank, operator, root_ev, any_value(op_dur_us) AS op_dur_us,
           any_value(kernel_dur_sum_us) AS kernel_dur_us, count(*) AS pattern_len,
           any_value(root_name) || '|' || string_agg(k_name, '|' ORDER BY k_ts, k_ev) AS pattern
    FROM m GROUP BY run_id, path, rank, operator, root_ev
)
SELECT run_id, rank, operator, pattern, any_value(pattern_len) AS pattern_len, count(*) AS count,
       sum(kernel_dur_us) * {US} AS kernel_dur_s, sum(op_dur_us) * {US} AS op_dur_s,
       row_number() OVER (PARTITION BY run_id, rank, operator ORDER BY count(*) DESC, pattern) AS rank_in_operator
FROM p GROUP BY run_id, rank, operator, pattern"""


def all_sequences_sql(min_pattern_len: int = MIN_PATTERN_LEN) -> str:
    """The view: every op name (cpu_op, user_annotation, ...) as the operator."""
    cand = f"SELECT * FROM {WINDOW_OPS} WHERE depth IS NOT NULL"
    return _patterns(_roots(cand, min_pattern_len, by_name=True), "r.name")


def frequent_sequences_sql(min_pattern_len: int = MIN_PATTERN_LEN) -> str:
    """HTA's call: ops whose name contains ``$1`` (the operator), on rank ``$2``."""
    cand = (f"SELECT * FROM {WINDOW_OPS} WHERE depth IS NOT NULL AND contains(name, $1) "
            "AND rank IS NOT DISTINCT FROM $2")
    return _patterns(_roots(cand, min_pattern_len, by_name=False), "$1")
