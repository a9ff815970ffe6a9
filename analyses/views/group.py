"""What a view group is: the views that answer one question about a run, declared once.

A group is one module under ``analyses/views/`` that defines ``GROUP = ViewGroup(...)``: its
views (DuckDB SQL over the base tables and earlier groups' views), the question it answers,
what it needs, the SQL of its headline table and the figures the report draws from it. The
catalog's views, the report's sections, the Dagster assets and the docs checks are all derived
from :func:`analyses.views.view_groups`; nothing else lists groups or views by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a figure builder imports plotly and Polars when a report draws: the catalog never does
    import polars as pl

    from analyses.figures import FigureSpec

ReadView = Callable[[str], "pl.DataFrame"]  # view name -> its rows for the selected runs
FigureBuilder = Callable[[ReadView, list[str]], list["FigureSpec"]]


@dataclass(frozen=True)
class View:
    """One DuckDB view: ``CREATE VIEW name AS sql``; ``doc`` says what a row is and each column means."""

    name: str
    sql: str
    doc: str


@dataclass(frozen=True)
class ViewGroup:
    """Views that belong together: one report section and one Dagster asset.

    ``order`` places the group in the catalog (a group's SQL may read views of groups with a
    lower order) and in the report. ``views`` are created in the order given (a view may read
    the ones before it); ``main`` is the one that answers the question. ``headline_sql`` is a small
    table over the views with a ``run_id`` column (filtered to the selected runs by the caller).
    ``figures(read, runs)`` builds the group's figures from view frames; it never computes a
    statistic the views do not give.
    """

    name: str
    order: int
    title: str
    question: str
    needs: str
    main: View
    views: tuple[View, ...]
    headline_sql: str
    figures: FigureBuilder

    def __post_init__(self) -> None:
        if self.main not in self.views:
            raise ValueError(f"view group {self.name!r}: main view {self.main.name!r} is not among its views")

    @property
    def view_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.views)
