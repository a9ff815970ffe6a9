"""The versioned spec: building, schema validation, file round trip, `polytrace fit`."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_multiturn, synth_samples

from analyses.export.spec import SCHEMA_PATH, SpecError, build_spec, read_spec, validate_spec, write_spec
from analyses.fit.workload import fit_workload


@pytest.fixture(scope="module")
def spec() -> dict:
    w = fit_workload(synth_samples(steps=4, prompts=16, n=8, cap=1500, seed=1), run_id="synth", task="math")
    mt = synth_multiturn()
    w2 = fit_workload(mt["samples"], turns=mt["turns"], tool_calls=mt["tool_calls"], run_id="mt", task="search")
    return build_spec({"synth": w, "mt": w2}, ["synth", "mt"], seed=0)


def test_spec_holds_every_documented_field_and_validates(spec):
    assert validate_spec(spec) == []
    w = spec["workloads"]["synth"]
    r = w["variables"]["response_tokens"]
    assert spec["polytrace_spec_version"] == "1.4"
    assert r["kind"] == "empirical_tail" and r["censor_at"] == 1500 and r["n"] == 4 * 16 * 8
    assert {"knots", "tail_prob", "tail", "extremes", "cut_level", "heavy_prob"} <= set(r)
    # PolyTrace's parameter file reads scipy families: a plain one beside, with its GoF and candidates
    fb = r["scipy_fallback"]
    assert {"aic", "ks", "ks_p", "wasserstein", "p99_rel_err", "p999_rel_err"} <= set(fb["gof"])
    assert len(fb["candidates"]) == 3 and all("wasserstein" in c for c in fb["candidates"])
    assert w["batch"]["prompts_per_step"] == 16 and w["batch"]["samples_per_prompt"] == 8
    assert w["drift"]["kind"] in ("none", "linear_log_scale")
    assert {"step_sd", "level_se", "dof", "level_var", "sampling_var", "n_steps"} <= set(w["drift"])
    mt = spec["workloads"]["mt"]["variables"]
    assert mt["n_turns"]["kind"] == "discrete" and "search" in mt["tools"]
    json.dumps(spec, allow_nan=False)  # strict JSON: no NaN/Infinity


def test_schema_rejects_broken_documents(spec):
    bad = copy.deepcopy(spec)
    bad["workloads"]["synth"]["batch"]["samples_per_prompt"] = 0
    del bad["workloads"]["synth"]["variables"]["response_tokens"]["censor_at"]
    bad["workloads"]["synth"]["joint"]["selected"] = "vine"
    errs = validate_spec(bad)
    assert any("samples_per_prompt" in e for e in errs)
    assert any("response_tokens" in e for e in errs)
    assert any("selected" in e for e in errs)
    wrong_major = dict(spec, polytrace_spec_version="2.0")
    (err,) = validate_spec(wrong_major)
    assert err.startswith("$.polytrace_spec_version: major version 2.0 is not 1.4")


# a version-1.0 workload as `polytrace fit` wrote it before the step-level model: a parametric
# response with a cap, a mixture joint, a drift without step effect, an empirical_tail cap mass
SPEC_1_0 = {
    "polytrace_spec_version": "1.0", "generator": "polytrace fit", "seed": 0, "source": {"runs": ["old"]},
    "workloads": {"old": {
        "run_id": "old", "task": "math", "n_samples": 64, "steps_fitted": [0, 1],
        "batch": {"prompts_per_step": 4, "samples_per_prompt": 8, "dp_ranks": [0], "rank_of_dp": [0], "tp_size": 1,
                  "has_ranks": True, "first_step": 0, "last_step": 1, "n_steps": 2, "multi_turn": False},
        "variables": {
            "prompt_tokens": {"kind": "categorical", "values": [100.0, 200.0], "probs": [0.5, 0.5], "n": 8},
            "response_tokens": {"kind": "empirical_tail", "knots": [10.0, 20.0], "tail_prob": 0.0,
                                "tail": {"family": "genpareto", "params": [0.0, 0.0, 1.0]}, "upper": 100.0,
                                "censor_at": 100.0, "p_cap": 0.5, "n": 64, "n_censored": 32},
        },
        "joint": {"selected": "gaussian_copula",
                  "gaussian_copula": {"type": "gaussian_copula", "within_group_corr": 0.3, "prompt_response_corr": 0.0}},
        "drift": {"kind": "none", "intercept": 0.0, "slope_per_step": 0.0, "reference_log_scale": 0.0,
                  "step_min": 0, "step_max": 1},
    }},
}


def test_a_version_1_0_spec_still_reads_and_samples(tmp_path: Path):
    from analyses.fit.sampler import generate

    p = tmp_path / "old.json"
    p.write_text(json.dumps(SPEC_1_0))
    doc = read_spec(p)
    g = generate(doc["workloads"]["old"], [0, 1], seed=0).samples
    r = g["response_tokens"].to_numpy()
    # half the responses at the cap mass, the rest in the body 10..20: as a 1.0 spec always sampled
    assert set(np.unique(r[r < 100])) <= set(range(10, 21)) and 0.3 < float(np.mean(r == 100)) < 0.7
    (tmp_path / "v2.json").write_text(json.dumps(dict(SPEC_1_0, polytrace_spec_version="2.0")))
    with pytest.raises(SpecError, match="major version 2.0 is not 1.4"):
        read_spec(tmp_path / "v2.json")


def test_write_read_round_trip(spec, tmp_path: Path):
    p = write_spec(spec, tmp_path / "spec.json")
    assert read_spec(p) == json.loads(json.dumps(spec))
    (tmp_path / "bad.json").write_text('{"polytrace_spec_version": "1.0"}')
    with pytest.raises(SpecError):
        read_spec(tmp_path / "bad.json")


def test_schema_file_is_valid_json_schema_shape():
    s = json.loads(SCHEMA_PATH.read_text())
    assert s["$schema"].startswith("https://json-schema.org/") and "workload" in s["$defs"]


def test_tool_failure_rate_uses_the_views_definition_of_failure():


    mt = synth_multiturn()
    tc = mt["tool_calls"]
    # statuses cycle success / OK / error / NULL: only 'error' is a failure, NULL is not counted
    status = pl.Series(["success", "OK", "error", None] * (tc.height // 4 + 1)).head(tc.height)
    tc = tc.with_columns(status=status)
    w = fit_workload(mt["samples"], turns=mt["turns"], tool_calls=tc, run_id="mt", task="search")
    known = status.drop_nulls()
    expected = (known == "error").sum() / known.len()  # about 1/3
    assert w["variables"]["tools"]["search"]["failure_rate"] == pytest.approx(expected)


def test_a_partial_step_is_never_fitted():
    # a run stopped mid-rollout: its last step has 8 of 32 samples, all of them short
    s = synth_samples(steps=4, prompts=8, n=4, cap=None, seed=2)
    cut = s.filter((pl.col("step") == 3) & (pl.col("local_index") == 0)).with_columns(step=pl.lit(4, pl.Int64),
                                                                                     response_tokens=pl.lit(3, pl.Int64))
    w = fit_workload(pl.concat([s, cut]), run_id="r", task="math")
    assert w["steps_fitted"] == [0, 1, 2, 3] and w["steps_excluded"] == [4]
    assert w == {**fit_workload(s, run_id="r", task="math"), "steps_excluded": [4]}
    assert validate_spec(build_spec({"r": w}, ["r"])) == []
