"""Characterization views: DuckDB views over the warehouse, registered in every catalog.

Importing this package registers the views (``analyses.catalog`` imports it lazily). The same
numbers are available from Python with :func:`view_frame`; :data:`VIEW_GROUPS` says which
views belong together (one Dagster asset and one report section per group).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import duckdb
import polars as pl

from analyses.views import filtering, gpu, imbalance, lengths, multiturn, step_times, tools  # noqa: F401 - registers
from analyses.views._common import QUANTILE_DEFINITION

# group -> views, main view first
VIEW_GROUPS: dict[str, tuple[str, ...]] = {
    "lengths": ("length_quantiles", "length_cdf", "length_drift", "sample_lengths"),
    "step_variance": ("step_variance", "step_series"),
    "stage_breakdown": ("stage_breakdown",),
    "rank_imbalance": ("rank_imbalance",),
    "gpu_utilization": ("gpu_utilization", "gpu_timeline"),
    "tool_latency": ("tool_latency", "tool_latency_by_turn", "tool_latency_cdf"),
    "multiturn": ("multiturn", "multiturn_pmf", "multiturn_by_turn", "trajectories"),
    "filter_waste": ("filter_waste", "filter_waste_run"),
}

__all__ = ["QUANTILE_DEFINITION", "VIEW_GROUPS", "open_catalog", "view_doc", "view_frame"]


def open_catalog(root: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection over the warehouse at ``root`` with every view."""
    from analyses.catalog import connect

    return connect(root)


def view_frame(
    source: Path | duckdb.DuckDBPyConnection,
    name: str,
    runs: Iterable[str] | None = None,
) -> pl.DataFrame:
    """The rows of view ``name`` (optionally only ``runs``) as a Polars frame.

    ``source`` is a warehouse root or a connection from :func:`open_catalog` (reuse one
    connection when reading several views).
    """
    from analyses.catalog import registered_views

    if name not in registered_views():
        raise KeyError(f"no view named {name!r}")
    con = open_catalog(source) if isinstance(source, Path) else source
    sql = f'SELECT * FROM "{name}"'
    params: list = []
    if runs is not None:
        wanted = list(runs)
        sql += " WHERE run_id IN (SELECT unnest($1))"
        params = [wanted]
    return con.sql(sql, params=params or None).pl()


def view_doc(name: str) -> str:
    """The documentation string a view was registered with."""
    from analyses.catalog import _VIEW_DOCS, registered_views

    registered_views()
    return _VIEW_DOCS.get(name, "")
