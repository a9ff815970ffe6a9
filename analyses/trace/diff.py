"""Trace diff: HTA's ``TraceDiff.compare_traces`` and ``ops_diff`` (``hta/trace_diff.py``), between
two selections of the warehouse's traces: two runs, two ranks of one run, two step ranges (or two
RL stages) of one rank.

A selection is a run, its ranks (default: the first, as HTA) and ProfilerSteps (default: the
first, as HTA), optionally one stage. Every event in it is counted by name: CPU-side events by
the step holding their start, GPU events by their launch's step (HTA's ``add_iteration``, on the
whole trace, not HTA's window). Per name: counts and total duration in each selection, their
differences, HTA's change category (``+``, ``-``, ``=``) and ``ops_diff``'s kind (``added``,
``deleted``, ``increased``, ``decreased``, ``unchanged``); rows are ranked by impact, the absolute
change in total duration (HTA leaves them in name order).

Difference from HTA: HTA counts a GPU event on stream 0 in no step (its ``add_iteration`` assigns
streams < 0 and > 0); we count it by its launch like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyses.trace.sqlparts import US

if TYPE_CHECKING:  # the views read this module's SQL: DuckDB and Polars where a diff is computed
    import duckdb
    import polars as pl

OP_SUMMARY_SQL = f"""
SELECT run_id, rank, step, stage, 'CPU' AS device, cat, name, count(*) AS counts, sum(dur_us) * {US} AS total_duration_s
FROM trace_ops GROUP BY ALL
UNION ALL
SELECT run_id, rank, CASE WHEN step_by_launch THEN step END, stage, 'GPU', cat, name, count(*), sum(dur_us) * {US}
FROM trace_kernels GROUP BY ALL"""

DEVICES = ("all", "cpu", "gpu")


@dataclass(frozen=True)
class TraceSelection:
    """A part of a run's traces: ``ranks`` and ``steps`` (None: the first of each, HTA's defaults),
    ``stage`` (None: any)."""

    run_id: str
    ranks: tuple[int, ...] | None = None
    steps: tuple[int, ...] | None = None
    stage: str | None = None

    def label(self) -> str:
        parts = [self.run_id]
        if self.ranks:
            parts.append("rank " + ",".join(map(str, self.ranks)))
        if self.steps:
            parts.append("step " + ",".join(map(str, self.steps)))
        if self.stage:
            parts.append(self.stage)
        return " ".join(parts)


def _resolve(con: duckdb.DuckDBPyConnection, sel: TraceSelection) -> TraceSelection:
    ranks = sel.ranks
    if not ranks:
        r = con.sql("SELECT min(rank) FROM trace_ops WHERE run_id = ?", params=[sel.run_id]).fetchall()[0][0]
        if r is None:
            raise ValueError(f"run {sel.run_id!r} has no profiler trace")
        ranks = (int(r),)
    steps = sel.steps
    if not steps:
        s = con.sql("SELECT min(step) FROM trace_ops WHERE run_id = ? AND list_contains(?, rank)",
                    params=[sel.run_id, list(ranks)]).fetchall()[0][0]
        if s is None:
            raise ValueError(f"run {sel.run_id!r} ranks {list(ranks)} have no ProfilerStep")
        steps = (int(s),)
    return TraceSelection(sel.run_id, tuple(ranks), tuple(steps), sel.stage)


def _summary(con: duckdb.DuckDBPyConnection, sel: TraceSelection, device: str) -> pl.DataFrame:
    dev = {"all": "", "cpu": " AND device = 'CPU'", "gpu": " AND device = 'GPU'"}[device]
    sql = (f"SELECT name, CAST(sum(counts) AS BIGINT) AS counts, sum(total_duration_s) AS total_duration_s FROM trace_op_summary "
           f"WHERE run_id = ? AND list_contains(?, rank) AND list_contains(?, step){dev}"
           + (" AND stage IS NOT DISTINCT FROM ?" if sel.stage else "") + " GROUP BY name")
    params = [sel.run_id, list(sel.ranks or ()), list(sel.steps or ())] + ([sel.stage] if sel.stage else [])
    return con.sql(sql, params=params).pl()


def shorten_name(name: str) -> str:
    """HTA's ``shorten_name``: a kernel or operator name without its template and call arguments
    and return type (memory copies keep their names)."""
    if name.startswith(("Memcpy", "Memset", "dma")) or ("<" not in name and "(" not in name):
        return name
    stack: list[str] = []
    for c in name.replace("->", ""):
        if c == ">":
            while stack and stack[-1] != "<":
                stack.pop()
            if stack:
                stack.pop()
        elif c == ")":
            while stack and stack[-1] != "(":
                stack.pop()
            if stack:
                stack.pop()
        else:
            stack.append(c)
    return "".join(stack).split(" ")[-1]


def trace_diff(con: duckdb.DuckDBPyConnection, control: TraceSelection, test: TraceSelection, device: str = "all",
               use_short_name: bool = False) -> pl.DataFrame:
    """Operators and kernels of ``test`` against ``control`` (``con``: a catalog connection)."""
    import polars as pl

    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    c, t = _resolve(con, control), _resolve(con, test)
    a, b = _summary(con, c, device), _summary(con, t, device)
    if use_short_name:
        names = pl.concat([a["name"], b["name"]]).unique()
        short = {n: shorten_name(n) for n in names.to_list()}  # once per distinct name, not per event
        a, b = ((f.with_columns(pl.col("name").replace_strict(short)).group_by("name").agg(pl.all().sum()))
                for f in (a, b))
    j = a.join(b, on="name", how="full", coalesce=True, suffix="_test").rename(
        {"counts": "control_counts", "total_duration_s": "control_total_duration_s",
         "counts_test": "test_counts", "total_duration_s_test": "test_total_duration_s"})
    j = j.with_columns(pl.col("control_counts", "test_counts").fill_null(0),
                       pl.col("control_total_duration_s", "test_total_duration_s").fill_null(0.0))
    j = j.with_columns(diff_counts=pl.col("test_counts") - pl.col("control_counts"),
                       diff_duration_s=pl.col("test_total_duration_s") - pl.col("control_total_duration_s"))
    cc, tc, dc = pl.col("control_counts"), pl.col("test_counts"), pl.col("diff_counts")
    return j.with_columns(
        counts_change_categories=pl.when(dc > 0).then(pl.lit("+")).when(dc < 0).then(pl.lit("-")).otherwise(pl.lit("=")),
        change=pl.when(cc == 0).then(pl.lit("added")).when(tc == 0).then(pl.lit("deleted"))
        .when(dc > 0).then(pl.lit("increased")).when(dc < 0).then(pl.lit("decreased")).otherwise(pl.lit("unchanged")),
        impact_s=pl.col("diff_duration_s").abs(),
    ).sort(["impact_s", "name"], descending=[True, False]).select(
        "name", "control_counts", "test_counts", "control_total_duration_s", "test_total_duration_s", "diff_counts",
        "diff_duration_s", "counts_change_categories", "change", "impact_s")
