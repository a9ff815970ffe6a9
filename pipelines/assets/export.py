"""Export stage (group ``export``): ``workload_exports`` writes each fitted run's spec in every
format of :func:`analyses.export.registry.export_formats` under ``exports/<run>/<format>/``,
with the run's fidelity scores in the metadata."""

# No `from __future__ import annotations` here: Dagster checks the `context` annotation of an
# asset, check or sensor at definition time and refuses a string.

from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AutomationCondition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from analyses.export.registry import export_formats, format_names
from pipelines.assets.fit import fidelity_markdown, fidelity_metadata
from pipelines.resources import WarehouseResource

EXPORT_GROUP = "export"
EXPORT_SEED = 0


@asset(
    name="workload_exports",
    group_name=EXPORT_GROUP,
    deps=[AssetKey("workload_specs")],
    kinds={"json", "csv"},
    automation_condition=AutomationCondition.eager(),
    description="Every run's fitted workload (from its samples or from its per-step summaries) in each export format "
    "its logs hold the variables for, under `exports/<run>/<format>/`, generated with "
    f"seed {EXPORT_SEED} (same seed, same bytes):\n\n"
    + "\n".join(f"- `{f.name}` ({f.files}): read by {f.consumer}" for f in export_formats()),
)
def workload_exports(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    pt = warehouse.polytrace
    out = pt.export_all(seed=EXPORT_SEED)
    names = format_names()
    rows = [f"| {r} | " + " | ".join(str(len(per.get(f, []))) for f in names) + " |" for r, per in out.files.items()]
    fid = [r for r in pt.fidelity_results() if r["run_id"] in out.files and "rolling_origin" in r]
    meta: dict[str, Any] = {
        "runs_exported": MetadataValue.int(len(out.files)),
        "files": MetadataValue.int(out.n_files),
        "bytes": MetadataValue.int(out.n_bytes),
        "exports_dir": MetadataValue.path(str(pt.layout.exports)),
        "files_per_format": MetadataValue.md(
            ("| run | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n" + "\n".join(rows))
            if rows else "_nothing to export_"
        ),
        "fidelity": MetadataValue.md(fidelity_markdown(fid)),
    }
    if out.missing:  # a step-only run's logs lack a variable a format needs: said, not fatal
        meta["not_exported"] = MetadataValue.md("\n".join(f"- `{r}` {fmt}: {why}" for r, per in sorted(out.missing.items())
                                                          for fmt, why in per.items()))
    meta.update(fidelity_metadata(fid))
    context.log.info(f"exported {len(out.files)} run(s): {out.n_files} file(s)")
    return MaterializeResult(metadata=meta)
