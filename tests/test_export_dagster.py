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
    # the numbers `polytrace fidelity --all` prints, per run and pooled
    for k in ("crps_skill", "coverage90", "baseline_coverage90", "ks_mean", "baseline_ks_mean", "ceiling_accuracy_pct"):
        assert f"{k}/synthrun" in meta
    assert 0 <= meta["coverage90/synthrun"].value <= 1 and meta["origins/synthrun"].value == 4  # 6 steps: fit 2..5
    assert meta["mean_crps_skill"].value == meta["crps_skill/synthrun"].value
    assert set(meta["targets"].value) == {"crps_skill_every_run_ge_0", "crps_skill_mean_ge_0.10",
                                          "pooled_coverage90_in_0.80_0.97", "ks_within_0.01_of_baseline_every_run"}
    assert "synthrun" in meta["fidelity"].value and "CRPS skill" in meta["fidelity"].value
    spec = read_spec(PolyTrace(root).layout.spec_path("synthrun"))
    assert spec["workloads"]["synthrun"]["batch"]["n_steps"] == 6
    (exp_mat,) = [m for m in res.asset_materializations_for_node("workload_exports")]
    assert exp_mat.metadata["runs_exported"].value == 1
    assert "crps_skill/synthrun" in exp_mat.metadata
    fmts = sorted(p.name for p in (root / "exports" / "synthrun").iterdir())
    assert fmts == sorted(["aiperf", "mooncake", "polytrace-params", "polytrace-v1", "polytrace-v2", "vidur"])
    assert len(list((root / "exports" / "synthrun" / "polytrace-v2").glob("packed_lengths_step_*.jsonl"))) == 6
    assert "synthrun" in fidelity_table(PolyTrace(root).fidelity_results())
    saved = json.loads((root / "fits" / "fidelity.json").read_text())
    assert saved[0]["run_id"] == "synthrun" and "rolling_origin" in saved[0]
