"""Compare stage: ``run_comparison``, what changed between two runs (or step ranges), ranked.

By default the latest published run against the one published before it (a new run is usually
the question "what did my change do?"); set ``a`` / ``b`` in the launchpad's config to compare any
two (``run:1-100`` for a step range). The ranked differences and the overlaid curves show inline;
the comparison page, its JSON and PNG open from the links (served beside the UI,
:mod:`pipelines.report_server`).
"""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset at definition time and refuses a string.

import os
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AutomationCondition,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from analyses.compare.render import markdown
from pipelines.assets.characterize import CHARACTERIZE_GROUP, ENV_PNG, figures_markdown
from pipelines.report_server import url_for
from pipelines.resources import WarehouseResource

CATALOG = AssetKey("warehouse_catalog")


class ComparisonConfig(Config):
    a: str = Field(default="", description="run id or step range RUN:FIRST-LAST (default: the run published "
                                           "before the latest)")
    b: str = Field(default="", description="run id or step range compared with A (default: the latest run)")


@asset(
    group_name=CHARACTERIZE_GROUP,
    deps=[CATALOG],
    kinds={"html", "plotly"},
    automation_condition=AutomationCondition.eager(),
    description="What changed between two runs (or two step ranges), and by how much: every quantity both have "
    "(length distributions, stage times and shares, throughput, GPU utilization, imbalance, truncation, filter "
    "waste, training health and alerts, run facts, config), each tested against the step-to-step variation "
    "within each run and ranked biggest credible difference first; the same as `polytrace compare A B`. "
    "Default: the latest run against the one before it; set `a` and `b` in the config for any two.",
)
def run_comparison(context: AssetExecutionContext, config: ComparisonConfig,
                   warehouse: WarehouseResource) -> MaterializeResult:
    pt = warehouse.polytrace
    a, b = config.a, config.b
    if not (a and b):
        pair = pt.latest_pair()
        if pair is None:
            return MaterializeResult(metadata={"note": MetadataValue.text("needs two runs in the warehouse")})
        a, b = a or pair[0], b or pair[1]
    try:
        cmp = pt.compare(a, b)
    except (KeyError, ValueError) as exc:
        raise Failure(description=f"cannot compare {a} with {b}: {exc.args[0] if exc.args else exc}") from exc
    png = os.environ.get(ENV_PNG, "1").strip().lower() not in ("0", "false", "no")
    res = pt.compare_report(cmp, png=png)
    reports = pt.layout.reports
    context.log.info(f"{b} against {a}: {len(cmp.credible)} credible difference(s); {res.path}")
    meta: dict[str, Any] = {
        "a": MetadataValue.text(cmp.a.label),
        "b": MetadataValue.text(cmp.b.label),
        "credible": MetadataValue.int(len(cmp.credible)),
        "differences": MetadataValue.md(markdown(cmp)),
        "comparison": MetadataValue.url(url_for(res.path, reports)),
        "json": MetadataValue.url(url_for(res.path.with_suffix(".json"), reports)),
        "path": MetadataValue.path(str(res.path)),
    }
    if res.pngs:
        meta["curves"] = MetadataValue.md(figures_markdown(res.pngs))
        meta["curves_png"] = MetadataValue.url(url_for(next(iter(res.pngs.values())), reports))
    elif res.png_note:
        meta["png_note"] = MetadataValue.text(res.png_note)
    return MaterializeResult(metadata=meta)
