"""SQL fragments the profiler-trace views share.

Every view reads the ``trace_kernels`` / ``trace_ops`` / ``trace_ranks`` tables. Sequences (gaps,
running sums) are computed per trace file (``path``: one rank's trace) and reported per
``run_id, rank``; a run holds one trace per rank (HTA's trace set), two files of one rank add up.
Times in the tables are microseconds, view columns ending in ``_s`` are seconds.
"""

from __future__ import annotations

US = 1e-6

# HTA's window, as the mirrored analyses see the trace
WINDOW_KERNELS = "(SELECT * FROM trace_kernels WHERE in_hta_window)"
WINDOW_OPS = "(SELECT * FROM trace_ops WHERE in_hta_window)"

TYPE_BITS = (("COMPUTATION", 1), ("COMMUNICATION", 2), ("MEMORY", 4))


def cols(keys: tuple[str, ...], prefix: str = "") -> str:
    """``a, b`` (or ``p.a, p.b``) for a key tuple; empty string for none."""
    return ", ".join(f"{prefix}{k}" for k in keys)


def lead(keys: tuple[str, ...]) -> str:
    """``a, b, `` — keys to put in front of a select list (empty for none)."""
    return cols(keys) + ", " if keys else ""


def merged_intervals(source: str, part: tuple[str, ...], start: str = "s", end: str = "e") -> str:
    """A SELECT of the union of ``[start, end)`` intervals of ``source`` per ``part``: rows
    ``part..., s, e`` of disjoint merged runs (touching intervals merge), HTA's
    ``merge_kernel_intervals``: sorted by start, a run starts where the start passes the running
    maximum of the ends before it."""
    p = cols(part)
    return f"""
    SELECT {lead(part)}min({start}) AS s, max({end}) AS e FROM (
        SELECT *, sum(CASE WHEN {start} > prev_e THEN 1 ELSE 0 END)
                      OVER (PARTITION BY {p} ORDER BY {start}, {end} ROWS UNBOUNDED PRECEDING) AS run_no
        FROM (SELECT *, max({end}) OVER (PARTITION BY {p} ORDER BY {start}, {end}
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
              FROM {source})
    ) GROUP BY {p}, run_no"""


def type_segments(keys: tuple[str, ...]) -> str:
    """A SELECT of ``run_id, path, rank, keys..., mask, us``: how long, per trace file (and ``keys``),
    the window's GPU work was of each combination of kernel types (``mask``: COMPUTATION 1 +
    COMMUNICATION 2 + MEMORY 4), HTA's ``_get_gpu_kernel_type_time``: each type's kernels merged,
    then a sweep over the merged boundaries."""
    part = ("run_id", "path", "rank", *keys, "kernel_type")
    seg = ("run_id", "path", "rank", *keys)
    bit = "CASE kernel_type " + " ".join(f"WHEN '{t}' THEN {b}" for t, b in TYPE_BITS) + " END"
    src = (f"(SELECT {lead(seg)}kernel_type, ts_us AS s, ts_us + dur_us AS e FROM {WINDOW_KERNELS} "
           f"WHERE kernel_type IN ('COMPUTATION', 'COMMUNICATION', 'MEMORY'))")
    p = cols(seg)
    return f"""
    SELECT {lead(seg)}running AS mask, sum(next_t - t) AS us FROM (
        SELECT *, sum(d) OVER (PARTITION BY {p} ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS running,
               lead(t) OVER (PARTITION BY {p} ORDER BY t, d) AS next_t
        FROM (SELECT {lead(seg)}s AS t, {bit} AS d FROM ({merged_intervals(src, part)})
              UNION ALL SELECT {lead(seg)}e, -{bit} FROM ({merged_intervals(src, part)}))
    ) WHERE running > 0 AND next_t IS NOT NULL GROUP BY ALL"""


def mask_label(mask: str = "mask") -> str:
    """HTA's label of a kernel-type combination: ``COMPUTATION overlapping COMMUNICATION``, ..."""
    parts = [f"CASE WHEN {mask} & {b} > 0 THEN '{t}' END" for t, b in TYPE_BITS]
    return f"concat_ws(' overlapping ', {', '.join(parts)})"


def describe(col: str) -> str:
    """pandas' ``describe()`` of ``col`` as aggregates: count, mean, std (sample), min, 25/50/75 %
    (linear interpolation, pandas' default = DuckDB quantile_cont), max."""
    return (f"count({col}) AS count, avg({col}) AS mean, stddev_samp({col}) AS std, min({col}) AS min, "
            f"quantile_cont({col}, 0.25) AS p25, quantile_cont({col}, 0.5) AS p50, "
            f"quantile_cont({col}, 0.75) AS p75, max({col}) AS max")


def grouped_top(source: str, part: tuple[str, ...], num: int, duration_ratio: float, keep: str = "false") -> str:
    """HTA's ``_aggr_gpu_kernel_time`` over ``source`` (rows ``part..., name, dur_us``): per name
    sum, max, min, mean, std (sample, 0 for one event) and count; when a ``part`` has more than
    ``num`` names, sorted by sum (descending), those past the ``num``-th or whose running sum
    passes the ``duration_ratio`` quantile (linear) of the running sums become one ``others`` row
    (unless ``keep``, an SQL condition on ``name``, holds). The others row's max/min/mean/std are,
    as in HTA, over the grouped names' sums. Unlike HTA, a kept name keeps its own statistics (HTA
    regroups the kept names' sums too, so once it groups, each kept name shows max = min = mean =
    sum and std = 0)."""
    p = cols(part)
    return f"""
    WITH a AS (
        SELECT {lead(part)}name, sum(dur_us) AS s, max(dur_us) AS mx, min(dur_us) AS mn, avg(dur_us) AS mean,
               coalesce(stddev_samp(dur_us), 0) AS sd, count(*) AS n
        FROM {source} GROUP BY ALL
    ), o AS (
        SELECT *, row_number() OVER (PARTITION BY {p} ORDER BY s DESC, name) AS rn,
               sum(s) OVER (PARTITION BY {p} ORDER BY s DESC, name ROWS UNBOUNDED PRECEDING) AS cum,
               count(*) OVER (PARTITION BY {p}) AS n_names
        FROM a
    ), g AS (
        SELECT *, n_names > {num} AND NOT ({keep})
                  AND (cum > quantile_cont(cum, {duration_ratio}) OVER (PARTITION BY {p}) OR rn > {num}) AS grouped
        FROM o
    )
    SELECT {lead(part)}name, s, mx, mn, mean, sd, n, false AS is_others FROM g WHERE NOT grouped
    UNION ALL
    SELECT {lead(part)}'others', sum(s), max(s), min(s), avg(s), coalesce(stddev_samp(s), 0), CAST(sum(n) AS BIGINT), true
    FROM g WHERE grouped GROUP BY ALL"""
