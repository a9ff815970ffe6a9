"""Characterize stage: one asset per view group, and the HTML report over all of them.

The group assets are derived from :func:`analyses.views.view_groups`: a new view group module
is a new asset with nothing to add here. Each reads its views across every run (unpartitioned:
the views are cross-run) and records what a person wants to see in the UI: the headline numbers
as a markdown table, the views' definitions, the group's key figures and its report section.

They and the report are one subsettable multi-asset: the report is built from the groups'
sections, so computing them once (one connection, the shared views materialized once) and
reading each group's metadata off them halves the stage's time against an asset per group each
recomputing its section, then the report recomputing all of them. Materializing one group alone
computes only that group's section.
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    AutomationCondition,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)

from analyses.api import REPORT_NAME, PolyTrace
from analyses.figures import FigureSpec
from analyses.markdown import markdown_table
from analyses.report import PngBatch, ReportResult, Section, png_specs, start_png_browser
from analyses.views import ViewGroup, view_groups
from pipelines.report_server import url_for
from pipelines.resources import WarehouseResource

CHARACTERIZE_GROUP = "characterize"
CATALOG = AssetKey("warehouse_catalog")
HEADLINE_ROWS = 40
PNG_WIDTH = 900  # px: readable in the UI's dialog, ~50-100 KB each inline
# POLYTRACE_PNG=0 skips the PNGs (they start a Chromium: seconds per process), e.g. in quick tests
ENV_PNG = "POLYTRACE_PNG"


def figures_markdown(pngs: dict[str, Path]) -> str:
    """Each PNG as an inline data-URI image under its key: what Dagster's markdown view shows."""
    return "\n\n".join(f"**{key}**\n\n![{key}](data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()})"
                         for key, p in pngs.items())


def _views_md(group: ViewGroup) -> str:
    return "\n".join(f"- `{v.name}`: {v.doc}" for v in group.views)


def _group_spec(group: ViewGroup) -> AssetSpec:
    return AssetSpec(
        key=f"{group.name}_view",
        group_name=CHARACTERIZE_GROUP,
        deps=[CATALOG],
        kinds={"duckdb", "plotly"},
        automation_condition=AutomationCondition.eager(),
        description=f"{group.title}: {group.question} Views: {', '.join(f'`{v.name}`' for v in group.views)} "
        f"(query them by name in the catalog). Needs {group.needs}.",
    )


GROUP_SPECS: dict[str, AssetSpec] = {g.name: _group_spec(g) for g in view_groups()}
REPORT_SPEC = AssetSpec(
    key="characterization_report",
    group_name=CHARACTERIZE_GROUP,
    deps=[s.key for s in GROUP_SPECS.values()],
    kinds={"html", "plotly"},
    automation_condition=AutomationCondition.eager(),
    description="One self-contained HTML file (plotly.js embedded, opens offline) with a section per view group "
    "and a cross-run comparison; the same as `polytrace report`.",
)


def _pngs_enabled() -> bool:
    return os.environ.get(ENV_PNG, "1").strip().lower() not in ("0", "false", "no")


def _key_figure_pngs(pt: PolyTrace, batch: PngBatch | None) -> tuple[dict[str, Path], str | None]:
    """Every selected group's key figures as PNG, from one batch (the browser's tabs share the work
    of all groups, and draw while the next sections are built): (figure key -> PNG, why some are
    missing)."""
    if batch is None:
        return {}, f"PNG export disabled (${ENV_PNG}=0)"
    return batch.write(pt.layout.reports / "png")


def _group_metadata(pt: PolyTrace, group: ViewGroup, section: Section, runs: list[str], key_figs: list[FigureSpec],
                    rendered: dict[str, Path], note: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "runs": MetadataValue.int(len(runs)),
        "headline_rows": MetadataValue.int(section.headline.height),
        "headline": MetadataValue.md(
            markdown_table(section.headline, n=HEADLINE_ROWS, max_chars=80)
            if not section.empty else f"_No data in any run: needs {group.needs}._"
        ),
        "views": MetadataValue.md(_views_md(group)),
        "report_section": MetadataValue.url(url_for(pt.layout.reports / REPORT_NAME, pt.layout.reports, group.name)),
    }
    pngs = {f.key: rendered[f.key] for f in key_figs if f.key in rendered}
    if pngs:
        # inline, so the UI shows them ([Show Markdown]); browsers block file:// links
        meta["figures"] = MetadataValue.md(figures_markdown(pngs))
        meta["figure_files"] = MetadataValue.md("\n".join(f"- `{p}`" for p in pngs.values()))
    elif note and key_figs:
        meta["figure_note"] = MetadataValue.text(note)
    return meta


def _report_metadata(pt: PolyTrace, res: ReportResult) -> dict[str, Any]:
    empty = [s.title for s in res.sections if s.empty]
    alerts = pt.view("health_alerts").select("run_id", "kind", "first_step", "last_step", "detail")
    return {
        # what a reader looks for first: did any run's training go wrong (health_alerts)
        "health_alerts": MetadataValue.md(markdown_table(alerts, n=HEADLINE_ROWS, max_chars=160)
                                          if alerts.height else "_No health alert in any run._"),
        "path": MetadataValue.path(str(res.path)),
        "url": MetadataValue.url(url_for(res.path, pt.layout.reports)),
        "comparison_section": MetadataValue.url(url_for(res.path, pt.layout.reports, "compare")),
        "sections": MetadataValue.int(len(res.sections)),
        "figures": MetadataValue.int(res.n_figures),
        "bytes": MetadataValue.int(res.path.stat().st_size),
        "empty_sections": MetadataValue.text(", ".join(empty) or "(none)"),
    }


@multi_asset(
    specs=[*GROUP_SPECS.values(), REPORT_SPEC],
    name="characterize",
    can_subset=True,
    description="Every view group's headline, figures and report section, and the HTML report built from them.",
)
def characterize(context: AssetExecutionContext, warehouse: WarehouseResource) -> Iterator[MaterializeResult]:
    pt = warehouse.polytrace
    selected = context.selected_asset_keys
    groups = [g for g in view_groups() if GROUP_SPECS[g.name].key in selected]
    batch = PngBatch(PNG_WIDTH) if groups and _pngs_enabled() else None
    if batch is not None:
        start_png_browser()  # Chromium starts while the first sections are computed
    runs = pt.run_ids()
    key_figs: dict[str, list[FigureSpec]] = {}

    def built(section: Section) -> None:
        # a selected group's key figures go to the browser as soon as its section is built
        if section.group in GROUP_SPECS and GROUP_SPECS[section.group].key in selected:
            key_figs[section.group] = png_specs(section.figures, runs)[0]
            if batch is not None:
                batch.submit(key_figs[section.group])

    res = None
    if REPORT_SPEC.key in selected:
        # the group assets' PNGs are written below; the report only needs the HTML
        res = pt.report(png=False, on_section=built)
        sections = {s.group: s for s in res.sections}
        context.log.info(f"report {res.path}: {len(res.sections)} sections, {res.n_figures} figures")
    else:
        sections = pt.sections([g.name for g in groups])
        for g in groups:
            built(sections[g.name])
    rendered, note = _key_figure_pngs(pt, batch)
    for g in groups:
        section = sections[g.name]
        context.log.info(f"{g.name}: {section.headline.height} headline row(s), {len(section.figures)} figure(s)")
        yield MaterializeResult(asset_key=GROUP_SPECS[g.name].key,
                                metadata=_group_metadata(pt, g, section, runs, key_figs[g.name], rendered, note))
    if res is not None:
        yield MaterializeResult(asset_key=REPORT_SPEC.key, metadata=_report_metadata(pt, res))
