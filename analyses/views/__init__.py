"""Characterization views: DuckDB views over the warehouse, one module per view group.

Every module in this package that defines ``GROUP`` (a :class:`~analyses.views.group.ViewGroup`)
is a view group; :func:`view_groups` finds them, ordered by ``GROUP.order``. To add a group,
write ``analyses/views/<name>.py`` with its views, headline SQL and figures, a test, and its
entry in ``docs/views.md``: the catalog, the report and the Dagster assets pick it up.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING

from analyses.views.group import View, ViewGroup
from analyses.views.sql import QUANTILE_DEFINITION

if TYPE_CHECKING:  # the catalog takes the views' SQL only: `polytrace query` loads neither
    import duckdb
    import polars as pl

__all__ = ["QUANTILE_DEFINITION", "View", "ViewGroup", "all_views", "group", "headline_frame", "view", "view_frame",
           "view_groups", "views_reading"]


@cache
def view_groups() -> tuple[ViewGroup, ...]:
    """Every view group of the package, in catalog and report order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        g = getattr(mod, "GROUP", None)
        if isinstance(g, ViewGroup):
            if g.name != info.name:
                raise ValueError(f"view group {g.name!r} must live in analyses/views/{g.name}.py, not {info.name}.py")
            found.append(g)
    groups = tuple(sorted(found, key=lambda g: (g.order, g.name)))
    names = [v.name for g in groups for v in g.views]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"views declared twice: {', '.join(sorted(dup))}")
    return groups


def all_views() -> tuple[View, ...]:
    """Every view, in creation order (a view may read the views before it)."""
    return tuple(v for g in view_groups() for v in g.views)


def views_reading(names: Iterable[str]) -> tuple[View, ...]:
    """The views ``names`` and every view they read, directly or not (named in their SQL), in
    creation order: a connection that needs a few views creates those, not all of them (creating
    every view binds each one against the Parquet files, most of a connection's start-up)."""
    wanted = {view(n).name for n in names}
    views = all_views()
    for v in reversed(views):  # a view reads only views created before it
        if v.name in wanted:
            wanted |= {u.name for u in views if u.name != v.name and re.search(rf"\b{re.escape(u.name)}\b", v.sql)}
    return tuple(v for v in views if v.name in wanted)


def group(name: str) -> ViewGroup:
    for g in view_groups():
        if g.name == name:
            return g
    raise KeyError(f"no view group named {name!r}")


def view(name: str) -> View:
    for v in all_views():
        if v.name == name:
            return v
    raise KeyError(f"no view named {name!r}")


def _where_runs(sql: str, runs: Iterable[str] | None) -> tuple[str, list | None]:
    if runs is None:
        return sql, None
    return sql + " WHERE run_id IN (SELECT unnest($1))", [list(runs)]


def view_frame(con: duckdb.DuckDBPyConnection, name: str, runs: Iterable[str] | None = None) -> pl.DataFrame:
    """The rows of view ``name`` (optionally only ``runs``) as a Polars frame.

    ``con`` is a catalog connection (:func:`analyses.catalog.connect` with :func:`all_views`,
    or :meth:`analyses.api.PolyTrace.connect`); reuse one connection when reading several views.
    """
    v = view(name)
    sql, params = _where_runs(f'SELECT * FROM "{v.name}"', runs)
    return con.sql(sql, params=params).pl()


def headline_frame(con: duckdb.DuckDBPyConnection, group_name: str, runs: Iterable[str] | None = None) -> pl.DataFrame:
    """The headline table of a view group, optionally for ``runs`` only."""
    sql, params = _where_runs(f"SELECT * FROM ({group(group_name).headline_sql}) h", runs)
    return con.sql(sql, params=params).pl()
