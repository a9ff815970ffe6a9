"""Characterize stage: one asset per view group, and the HTML report over all of them.

The group assets are derived from :func:`analyses.views.view_groups`: a new view group module
is a new asset with nothing to add here. Each reads its views across every run (unpartitioned:
the views are cross-run) and records what a person wants to see in the UI: the headline numbers
as a markdown table, the views' definitions, the group's key figures and its report section.
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

import base64
import os
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AutomationCondition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from analyses.api import REPORT_NAME
from analyses.markdown import markdown_table
from analyses.report import png_specs, write_pngs
from analyses.views import ViewGroup, view_groups
from pipelines.report_server import url_for
from pipelines.resources import WarehouseResource

CHARACTERIZE_GROUP = "characterize"
CATALOG = AssetKey("warehouse_catalog")
HEADLINE_ROWS = 40
PNG_WIDTH = 900  # px: readable in the UI's dialog, ~50-100 KB each inline
# POLYTRACE_PNG=0 skips the PNGs (kaleido starts a Chromium: seconds per process), e.g. in quick tests
ENV_PNG = "POLYTRACE_PNG"


def figures_markdown(pngs: dict[str, Path]) -> str:
    """Each PNG as an inline data-URI image under its key: what Dagster's markdown view shows."""
    return "\n\n".join(f"**{key}**\n\n![{key}](data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()})"
                         for key, p in pngs.items())


def _views_md(group: ViewGroup) -> str:
    return "\n".join(f"- `{v.name}`: {v.doc}" for v in group.views)


def _group_asset(group: ViewGroup) -> AssetsDefinition:
    @asset(
        name=f"{group.name}_view",
        group_name=CHARACTERIZE_GROUP,
        deps=[CATALOG],
        kinds={"duckdb", "plotly"},
        automation_condition=AutomationCondition.eager(),
        description=f"{group.title}: {group.question} Views: {', '.join(f'`{v.name}`' for v in group.views)} "
        f"(query them by name in the catalog). Needs {group.needs}.",
    )
    def _view(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
        pt = warehouse.polytrace
        section = pt.section(group.name)
        runs = pt.run_ids()
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
        key_figs, _per_run_left_out = png_specs(section.figures, runs)
        if os.environ.get(ENV_PNG, "1").strip().lower() in ("0", "false", "no"):
            pngs, note = {}, f"PNG export disabled (${ENV_PNG}=0)"
        else:
            pngs, note = write_pngs(key_figs, pt.layout.reports / "png", width=PNG_WIDTH, keep_browser=True)
        if pngs:
            # inline, so the UI shows them ([Show Markdown]); browsers block file:// links
            meta["figures"] = MetadataValue.md(figures_markdown(pngs))
            meta["figure_files"] = MetadataValue.md("\n".join(f"- `{p}`" for p in pngs.values()))
        elif note and key_figs:
            meta["figure_note"] = MetadataValue.text(note)
        context.log.info(f"{group.name}: {section.headline.height} headline row(s), {len(section.figures)} figure(s)")
        return MaterializeResult(metadata=meta)

    return _view


# load_assets_from_modules finds assets inside module-level lists too
GROUP_ASSETS: list[AssetsDefinition] = [_group_asset(g) for g in view_groups()]


@asset(
    group_name=CHARACTERIZE_GROUP,
    deps=[a.key for a in GROUP_ASSETS],
    kinds={"html", "plotly"},
    automation_condition=AutomationCondition.eager(),
    description="One self-contained HTML file (plotly.js embedded, opens offline) with a section per view group "
    "and a cross-run comparison; the same as `polytrace report`.",
)
def characterization_report(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    # the group assets wrote the key PNGs already; the report only needs the HTML
    res = warehouse.polytrace.report(png=False)
    empty = [s.title for s in res.sections if s.empty]
    context.log.info(f"report {res.path}: {len(res.sections)} sections, {res.n_figures} figures")
    alerts = warehouse.polytrace.view("health_alerts").select("run_id", "kind", "first_step", "last_step", "detail")
    return MaterializeResult(
        metadata={
            # what a reader looks for first: did any run's training go wrong (health_alerts)
            "health_alerts": MetadataValue.md(markdown_table(alerts, n=HEADLINE_ROWS, max_chars=160)
                                              if alerts.height else "_No health alert in any run._"),
            "path": MetadataValue.path(str(res.path)),
            "url": MetadataValue.url(url_for(res.path, warehouse.polytrace.layout.reports)),
            "comparison_section": MetadataValue.url(url_for(res.path, warehouse.polytrace.layout.reports, "compare")),
            "sections": MetadataValue.int(len(res.sections)),
            "figures": MetadataValue.int(res.n_figures),
            "bytes": MetadataValue.int(res.path.stat().st_size),
            "empty_sections": MetadataValue.text(", ".join(empty) or "(none)"),
        }
    )
