"""Export stage (group ``export``): ``workload_exports`` writes each run's spec in every format
other tools read (PolyTrace v2/v1 workload files, PolyTrace's parameter JSON, Vidur, Mooncake,
AIPerf) under ``exports/<run>/<format>/``, with the run's fidelity scores in the metadata."""

from __future__ import annotations

import json
from typing import Any

from dagster import AssetKey, MaterializeResult, MetadataValue, asset

from pipelines.assets.fit import fidelity_markdown, fidelity_path, spec_path
from pipelines.resources import WarehouseResource

EXPORT_GROUP = "export"
EXPORT_DIR = "exports"
EXPORT_SEED = 0


@asset(
    name="workload_exports",
    group_name=EXPORT_GROUP,
    deps=[AssetKey("workload_specs")],
    kinds={"json", "csv"},
    description="Every run's fitted workload in each export format (polytrace-v2, polytrace-v1, polytrace-params, "
    "vidur, mooncake, aiperf) under `exports/<run>/<format>/`, generated with seed 0 (same seed, same bytes).",
)
def workload_exports(context, warehouse: WarehouseResource) -> MaterializeResult:
    from analyses.fit.exporters import FORMATS, export
    from analyses.fit.spec import read_spec

    root = warehouse.root_path
    fid = json.loads(fidelity_path(root).read_text()) if fidelity_path(root).exists() else []
    by_run = {r["run_id"]: r for r in fid if "accuracy_pct" in r}
    rows, n_files, n_bytes = [], 0, 0
    for r in sorted(by_run):
        sp = spec_path(root, r)
        if not sp.exists():
            continue
        spec = read_spec(sp)
        counts = []
        for fmt in FORMATS:
            files = export(spec, fmt, root / EXPORT_DIR / r / fmt, seed=EXPORT_SEED)
            n_files += len(files)
            n_bytes += sum(f.stat().st_size for f in files)
            counts.append(str(len(files)))
        rows.append(f"| {r} | " + " | ".join(counts) + " |")
    meta: dict[str, Any] = {
        "runs_exported": MetadataValue.int(len(rows)),
        "files": MetadataValue.int(n_files),
        "bytes": MetadataValue.int(n_bytes),
        "exports_dir": MetadataValue.path(str(root / EXPORT_DIR)),
        "files_per_format": MetadataValue.md(
            ("| run | " + " | ".join(FORMATS) + " |\n|---|" + "---|" * len(FORMATS) + "\n" + "\n".join(rows)) if rows else "_nothing to export_"
        ),
        "fidelity": MetadataValue.md(fidelity_markdown(list(by_run.values()))),
    }
    for r, res in by_run.items():
        meta[f"accuracy_pct/{r}"] = MetadataValue.float(round(res["accuracy_pct"], 2))
        meta[f"baseline_accuracy_pct/{r}"] = MetadataValue.float(round(res["baseline_accuracy_pct"], 2))
    return MaterializeResult(metadata=meta)
