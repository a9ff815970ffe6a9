"""Characterize stage: one asset per view group, and the HTML report over all of them.

Each group asset reads its views across every run (unpartitioned: the views are cross-run), and
records what a person wants to see in the UI: the headline numbers as a markdown table, the
views' definitions, and a link to the group's key figure (PNG) and to its section of the report.
The numbers come from ``analyses.views``; figures from ``analyses.figures``; nothing here computes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster import AssetKey, AssetsDefinition, MaterializeResult, MetadataValue, asset

from analyses.report import DEFAULT_NAME, TITLES, build_report, group_section, write_pngs
from analyses.views import VIEW_GROUPS, view_doc
from analyses.views.headlines import to_markdown
from pipelines.resources import WarehouseResource

CHARACTERIZE_GROUP = "characterize"
CATALOG = AssetKey("warehouse_catalog")
REPORT_DIR = "reports"
# POLYTRACE_PNG=0 skips the PNGs (kaleido starts a Chromium: seconds per process), e.g. in quick tests
ENV_PNG = "POLYTRACE_PNG"


def report_dir(root: Path) -> Path:
    return root / REPORT_DIR


def report_path(root: Path) -> Path:
    return report_dir(root) / DEFAULT_NAME


def _views_md(group: str) -> str:
    return "\n".join(f"- `{v}`: {view_doc(v)}" for v in VIEW_GROUPS[group])


def _group_asset(group: str) -> AssetsDefinition:
    title, question, needs = TITLES[group]

    @asset(
        name=f"{group}_view",
        group_name=CHARACTERIZE_GROUP,
        deps=[CATALOG],
        kinds={"duckdb", "plotly"},
        description=f"{title}: {question} Views: {', '.join(f'`{v}`' for v in VIEW_GROUPS[group])} "
        f"(query them by name in the catalog). Needs {needs}.",
    )
    def _view(context, warehouse: WarehouseResource) -> MaterializeResult:
        root = warehouse.root_path
        con = warehouse.connect()
        try:
            runs = [r[0] for r in con.sql("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
            section = group_section(con, group, runs)
        finally:
            con.close()
        meta: dict[str, Any] = {
            "runs": MetadataValue.int(len(runs)),
            "headline_rows": MetadataValue.int(section.headline.height),
            "headline": MetadataValue.md(
                to_markdown(section.headline) if not section.empty else f"_No data in any run: needs {needs}._"
            ),
            "views": MetadataValue.md(_views_md(group)),
            "report_section": MetadataValue.url(f"{report_path(root).resolve().as_uri()}#{group}"),
        }
        key_figs = [f for f in section.figures if f.key_figure]
        if os.environ.get(ENV_PNG, "1").strip().lower() in ("0", "false", "no"):
            pngs, note = {}, f"PNG export disabled (${ENV_PNG}=0)"
        else:
            pngs, note = write_pngs(key_figs, report_dir(root) / "png", keep_browser=True)
        if pngs:
            first = next(iter(pngs.values()))
            meta["figure"] = MetadataValue.path(str(first))
            if len(pngs) > 1:
                meta["figures"] = MetadataValue.md("\n".join(f"- `{p}`" for p in pngs.values()))
        elif note and key_figs:
            meta["figure_note"] = MetadataValue.text(note)
        context.log.info(f"{group}: {section.headline.height} headline row(s), {len(section.figures)} figure(s)")
        return MaterializeResult(metadata=meta)

    return _view


# load_assets_from_modules finds assets inside module-level lists too
GROUP_ASSETS: list[AssetsDefinition] = [_group_asset(g) for g in VIEW_GROUPS]


@asset(
    group_name=CHARACTERIZE_GROUP,
    deps=[a.key for a in GROUP_ASSETS],
    kinds={"html", "plotly"},
    description="One self-contained HTML file (plotly.js embedded, opens offline) with a section per view group "
    "and a cross-run comparison; the same as `polytrace report`.",
)
def characterization_report(context, warehouse: WarehouseResource) -> MaterializeResult:
    root = warehouse.root_path
    # the group assets wrote the key PNGs already; the report only needs the HTML
    res = build_report(root, report_path(root), png=False)
    empty = [s.title for s in res.sections if s.empty]
    context.log.info(f"report {res.path}: {len(res.sections)} sections, {res.n_figures} figures")
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(res.path)),
            "url": MetadataValue.url(res.path.resolve().as_uri()),
            "sections": MetadataValue.int(len(res.sections)),
            "figures": MetadataValue.int(res.n_figures),
            "bytes": MetadataValue.int(res.path.stat().st_size),
            "empty_sections": MetadataValue.text(", ".join(empty) or "(none)"),
        }
    )
