"""The fit and export assets materialize specs, exports and fidelity scores in their metadata."""

from __future__ import annotations

import json
from pathlib import Path

from _fit_synth import synth_samples
from dagster import materialize

from analyses.api import PolyTrace
from analyses.export.registry import export
from analyses.export.spec import build_spec, read_spec
from analyses.fit.fidelity_table import fidelity_table
from analyses.fit.workload import fit_workload
from analyses.ingest import ingest_run
from pipelines.assets.export import workload_exports
from pipelines.assets.fit import workload_specs
from pipelines.resources import WarehouseResource


def test_fit_and_export_assets(tmp_path: Path) -> None:
    # a PolyTrace v2 run of 6 steps, written by our own exporter from a synthetic spec
    w = fit_workload(synth_samples(steps=6, prompts=16, n=4, cap=1500, seed=3), run_id="src", task="math")
    run_dir = tmp_path / "logs" / "synthrun"
    export(build_spec({"src": w}, ["src"]), "polytrace-v2", run_dir, steps=6, seed=1)
    root = tmp_path / "wh"
    ingest_run(run_dir, root)
    res = materialize([workload_specs, workload_exports],
                      resources={"warehouse": WarehouseResource(root=str(root), logs_root=str(tmp_path / "logs"))})
    assert res.success
    (spec_mat,) = [m for m in res.asset_materializations_for_node("workload_specs")]
    meta = spec_mat.metadata
    assert meta["runs_fitted"].value == 1
    assert 0 < meta["accuracy_pct/synthrun"].value <= 100 and 0 < meta["baseline_accuracy_pct/synthrun"].value <= 100
    assert "synthrun" in meta["fidelity"].value
    spec = read_spec(PolyTrace(root).layout.spec_path("synthrun"))
    assert spec["workloads"]["synthrun"]["batch"]["n_steps"] == 6
    (exp_mat,) = [m for m in res.asset_materializations_for_node("workload_exports")]
    assert exp_mat.metadata["runs_exported"].value == 1
    assert "accuracy_pct/synthrun" in exp_mat.metadata
    fmts = sorted(p.name for p in (root / "exports" / "synthrun").iterdir())
    assert fmts == sorted(["aiperf", "mooncake", "polytrace-params", "polytrace-v1", "polytrace-v2", "vidur"])
    assert len(list((root / "exports" / "synthrun" / "polytrace-v2").glob("packed_lengths_step_*.jsonl"))) == 6
    assert "synthrun" in fidelity_table(PolyTrace(root).fidelity_results())
    saved = json.loads((root / "fits" / "fidelity.json").read_text())
    assert saved[0]["run_id"] == "synthrun" and "real_per_step" not in saved[0]
