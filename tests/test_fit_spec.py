"""The versioned spec: building, schema validation, file round trip, `polytrace fit`."""

from __future__ import annotations

import copy
import json
from pathlib import Path

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
    assert r["kind"] == "continuous" and r["censor_at"] == 1500 and r["n"] == 4 * 16 * 8
    assert {"aic", "ks", "ks_p", "wasserstein", "p99_rel_err", "p999_rel_err"} <= set(r["gof"])
    assert len(r["candidates"]) >= 4 and all("wasserstein" in c for c in r["candidates"])
    assert w["batch"]["prompts_per_step"] == 16 and w["batch"]["samples_per_prompt"] == 8
    assert w["drift"]["kind"] in ("none", "linear_log_scale")
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
    assert validate_spec(wrong_major)


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
    import polars as pl

    mt = synth_multiturn()
    tc = mt["tool_calls"]
    # statuses cycle success / OK / error / NULL: only 'error' is a failure, NULL is not counted
    status = pl.Series(["success", "OK", "error", None] * (tc.height // 4 + 1)).head(tc.height)
    tc = tc.with_columns(status=status)
    w = fit_workload(mt["samples"], turns=mt["turns"], tool_calls=tc, run_id="mt", task="search")
    known = status.drop_nulls()
    expected = (known == "error").sum() / known.len()  # about 1/3
    assert w["variables"]["tools"]["search"]["failure_rate"] == pytest.approx(expected)
