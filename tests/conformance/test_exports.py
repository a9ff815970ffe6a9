"""Exports of the real PolyTrace runs, each handed to the consumer it is for.

The build (``conftest.build``): ``polytrace ingest`` of every real run, ``polytrace fit``, ``polytrace export``
of every format with default options. Then:

* upstream PolyTrace (the model in ``upstream_polytrace.py``): the v2 directory validates under the run's
  upstream config with only ``workload_path`` changed; its steps read as the source batch; multi-turn records
  replay (upstream's bookkeeping) to within 2% of their own prompt tokens and of the real run's per-step prefill;
  the v1 file reads as the batch; the parameter file uses upstream's task keys and scipy marginals.
* aiperf: ``DistributionParser.parse`` of each sequence distribution; the mooncake trace through aiperf's
  ``MooncakeTraceDatasetLoader``, integer-ms non-decreasing timestamps, and the prefill aiperf's multi-turn mode
  would send within 2% of the real run's.
* vidur: its trace-replay, request-length and request-interval generators.

Cases that fail today are listed in ``defects.py`` (xfail strict, reason = the consumer's complaint).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import scipy.stats

from . import upstream_polytrace as up
from .defects import cases
from .harness import EXPORT_FORMATS, Build, Verdicts, measure
from .realruns import ALL_RUN_IDS, REAL_RUNS, STEP_ONLY_RUNS, RealRun, upstream_config

pytestmark = [pytest.mark.xdist_group("conformance"), pytest.mark.real_logs]

RUN_IDS = [r.run_id for r in REAL_RUNS]
MULTI_TURN = [r.run_id for r in REAL_RUNS if r.multi_turn]
STEP_ONLY = {r.run_id: r for r in STEP_ONLY_RUNS}  # fitted from per-step summaries: every consumer check too
TOLERANCE = 0.02  # replayed prefill vs the records' own prompt tokens and vs the real run (issue 10)
SUCCESS = {"success", "ok", "succeeded"}  # tool-call statuses that are not failures (as the spec's failure_rate)
UPSTREAM_PARAMS = "polytrace/dataset/workloads/enhanced_task_distribution_parameters.json"


def _step_of(p: Path) -> int:
    m = re.search(r"_step_(\d+)\.jsonl$", p.name)
    assert m, p
    return int(m.group(1))


def _multiturn_files(d: Path) -> list[Path]:
    return sorted(d.glob("multiturn_workload_step_*.jsonl"), key=_step_of)


def _real_full_steps(run: RealRun, real_logs: Path) -> dict[int, list[dict[str, Any]]]:
    """The real run's multi-turn steps, without cut-off steps (fewer than half the median step's records,
    the fidelity protocol's rule): for Search-R1, step 0 (2,048) and not step 5 (47)."""
    steps = {_step_of(p): up.read_jsonl(p) for p in _multiturn_files(real_logs / run.rel_path)}
    med = statistics.median(len(v) for v in steps.values())
    return {k: v for k, v in steps.items() if len(v) >= med / 2}


def _ratio_msg(what: str, got: float, want: float) -> str:
    return f"{what}: {got:,.0f} vs {want:,.0f} = {got / want:.1%} (allowed {1 - TOLERANCE:.0%}..{1 + TOLERANCE:.0%})"


# ----------------------------------------------------------------------------- the build


def test_every_cli_format_is_covered(cli_formats: list[str]) -> None:
    assert sorted(cli_formats) == sorted(EXPORT_FORMATS)


@pytest.mark.parametrize("fmt", list(EXPORT_FORMATS))
def test_export_writes_files_for_every_run(fmt: str, build: Build) -> None:
    for rid in ALL_RUN_IDS:
        assert any(p.is_file() for p in build.export_dir(fmt, rid).iterdir()), (fmt, rid)


@pytest.mark.parametrize("run_id", cases("step_only_fitted", list(STEP_ONLY)))
def test_step_only_runs_are_fitted_from_their_summaries(run_id: str, build: Build) -> None:
    w = build.workload(run_id)
    assert w["source"]["kind"] == "summaries" and w["variables"]["response_tokens"]["fitted_from"] == "summaries"
    assert w["batch"]["multi_turn"] == STEP_ONLY[run_id].multi_turn
    measure(check="step_only_fitted", run=run_id, n_source=w["source"]["n_source"], assumed=w["source"]["assumed"],
            batch=f"{w['batch']['prompts_per_step']}x{w['batch']['samples_per_prompt']}")


@pytest.mark.parametrize("run_id", cases("step_only_v2", list(STEP_ONLY)))
def test_step_only_v2_validates_and_replays(run_id: str, build: Build, real_logs: Path) -> None:
    """The v2 directory of a run fitted from summaries, under an upstream config of its kind with only
    ``workload_path`` and the records per step (the fitted batch) changed; its multi-turn records replay to
    their own prompt tokens."""
    run, w = STEP_ONLY[run_id], build.workload(run_id)
    cfg = upstream_config(run.config, real_logs)
    wl = dict(cfg.get("workload") or {})
    if "expected_records_per_step" in wl:
        wl["expected_records_per_step"] = w["batch"]["prompts_per_step"] * w["batch"]["samples_per_prompt"]
    d = build.export_dir("polytrace-v2", run_id)
    res = up.validate({**cfg, "workload": wl}, d)
    errors = [e["error"] for e in res["steps"] if "error" in e]
    measure(check="step_only_v2", run=run_id, config=run.config, ok=res["ok"], errors=errors)
    assert res["ok"], errors
    if run.multi_turn:
        steps = [up.replay_step(p, w["batch"]["samples_per_prompt"]) for p in _multiturn_files(d)]
        got, want = sum(s.prefill_tokens for s in steps), sum(s.recorded_prompt_tokens for s in steps)
        assert abs(got / want - 1) <= TOLERANCE, _ratio_msg("replayed prefill vs the records' prompt_tokens", got, want)


# ----------------------------------------------------------------------------- upstream PolyTrace: v2


@pytest.mark.parametrize("run_id", cases("v2_validates", RUN_IDS))
def test_v2_validates_under_the_upstream_config(run_id: str, build: Build, real_logs: Path) -> None:
    run = REAL_RUNS.by_id(run_id)
    res = up.validate(upstream_config(run.config, real_logs), build.export_dir("polytrace-v2", run_id))
    errors = [e["error"].replace(res["workload_path"] + "/", "") for e in res["steps"] if "error" in e]
    if "error" in res.get("filter_indices", {}):
        errors.append(res["filter_indices"]["error"].replace(res["workload_path"] + "/", ""))
    measure(check="v2_validates", run=run_id, config=run.config, ok=res["ok"], errors=errors)
    assert res["ok"], f"suite.py --validate {run.config}.yaml: " + "; ".join(errors)
    if "reward_timings" in res:  # upstream only counts them; the config names them, so they must exist
        assert res["reward_timings"]["files"] > 0, f"no {res['reward_timings']['glob']}"


@pytest.mark.parametrize("run_id", cases("v2_batch", RUN_IDS))
def test_v2_steps_hold_the_source_batch(run_id: str, build: Build) -> None:
    run = REAL_RUNS.by_id(run_id)
    d = build.export_dir("polytrace-v2", run_id)
    want = run.prompts_per_step * run.samples_per_prompt
    if run.multi_turn:
        files = _multiturn_files(d)
        assert [_step_of(p) for p in files] == list(range(len(files))), "multi-turn steps are not numbered 0..N-1"
        for p in files:
            recs = up.read_jsonl(p)
            assert len(recs) == want, f"{p.name}: {len(recs)} records, the source batch is {want}"
            raw = up.group_multiturn(recs, samples_per_prompt=0)  # no padding: the groups as written
            assert len(raw) == run.prompts_per_step and {len(g) for g in raw} == {run.samples_per_prompt}, p.name
    else:
        files = sorted(d.glob("packed_lengths_step_*.jsonl"))
        assert files
        for p in files:
            inputs, outputs = up.read_packed_v2(p)
            assert len(inputs) == run.prompts_per_step, f"{p.name}: {len(inputs)} prompts"
            assert {len(o) for o in outputs} == {run.samples_per_prompt}, p.name


def _replayed(build: Build, run: RealRun) -> list[up.ReplayedStep]:
    files = _multiturn_files(build.export_dir("polytrace-v2", run.run_id))
    assert files, "no multi-turn step files"
    return [up.replay_step(p, run.samples_per_prompt) for p in files]


@pytest.mark.parametrize("run_id", cases("v2_replay_vs_records", MULTI_TURN))
def test_v2_replay_matches_the_records_own_prompt_tokens(run_id: str, build: Build) -> None:
    steps = _replayed(build, REAL_RUNS.by_id(run_id))
    got, want = sum(s.prefill_tokens for s in steps), sum(s.recorded_prompt_tokens for s in steps)
    measure(check="v2_replay_vs_records", run=run_id, replayed=got, recorded=want, ratio=got / want)
    assert abs(got / want - 1) <= TOLERANCE, _ratio_msg("replayed prefill vs the records' prompt_tokens", got, want)


@pytest.mark.parametrize("run_id", cases("v2_replay_vs_real", MULTI_TURN))
def test_v2_replay_matches_the_real_runs_per_step_prefill(run_id: str, build: Build, real_logs: Path) -> None:
    run = REAL_RUNS.by_id(run_id)
    steps = _replayed(build, run)
    got = statistics.fmean(s.prefill_tokens for s in steps)
    real = _real_full_steps(run, real_logs)
    want = statistics.fmean(up.replay_records(v).prefill_tokens for v in real.values())
    measure(check="v2_replay_vs_real", run=run_id, replayed_per_step=got, real_per_step=want, ratio=got / want,
            export_steps=len(steps), real_steps=sorted(real))
    assert abs(got / want - 1) <= TOLERANCE, _ratio_msg("mean replayed prefill per step vs the real run's", got, want)


@pytest.mark.parametrize("run_id", cases("v2_tool_failures", MULTI_TURN))
def test_v2_tool_failures_at_the_fitted_rate(run_id: str, build: Build) -> None:
    tools = build.workload(run_id)["variables"]["tools"]
    rate = sum(t["share"] * t["failure_rate"] for t in tools.values())
    statuses = [str(c.get("status", "")).lower() for p in _multiturn_files(build.export_dir("polytrace-v2", run_id))
                for r in up.read_jsonl(p) for c in r.get("tool_calls") or []]
    n, failed = len(statuses), sum(s not in SUCCESS for s in statuses)
    expected, sd = n * rate, math.sqrt(n * rate * (1 - rate))
    measure(check="v2_tool_failures", run=run_id, calls=n, failed=failed, fitted_rate=rate)
    assert abs(failed - expected) <= 4 * sd + 1, f"{failed} of {n} tool calls failed; the fitted rate {rate:.4f} expects {expected:.0f}"


# ----------------------------------------------------------------------------- upstream PolyTrace: v1, params


@pytest.mark.parametrize("run_id", cases("v1_batch", RUN_IDS))
def test_v1_reads_as_the_source_batch(run_id: str, build: Build) -> None:
    run = REAL_RUNS.by_id(run_id)
    files = sorted(build.export_dir("polytrace-v1", run_id).glob("*.json"))
    assert len(files) == 1, files
    steps = up.v1_steps(files[0])
    assert steps
    for s in steps:
        inputs, groups = up.read_v1(files[0], s)
        assert len(inputs) == run.prompts_per_step, f"step {s}: {len(inputs)} prompts"
        assert {len(g) for g in groups} == {run.samples_per_prompt}, f"step {s}"


def _params(build: Build, run_id: str) -> dict[str, Any]:
    files = sorted(build.export_dir("polytrace-params", run_id).glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


@pytest.fixture(scope="module")
def upstream_task_keys(real_logs: Path) -> set[str]:
    """The task keys of upstream's own parameter file (math_task, tool_calling_task)."""
    return {k for k in json.loads((real_logs / UPSTREAM_PARAMS).read_text()) if k.endswith("_task")}


@pytest.mark.parametrize("run_id", cases("params_task_keys", RUN_IDS))
def test_params_use_upstreams_task_keys(run_id: str, build: Build, upstream_task_keys: set[str]) -> None:
    keys = {k for k in _params(build, run_id) if k.endswith("_task")}
    measure(check="params_task_keys", run=run_id, keys=sorted(keys))
    assert keys and keys <= upstream_task_keys, f"task keys {sorted(keys)}; upstream's are {sorted(upstream_task_keys)}"
    if REAL_RUNS.by_id(run_id).multi_turn:
        assert "tool_calling_task" in keys


@pytest.mark.parametrize("run_id", cases("params_scipy", RUN_IDS))
def test_params_marginals_are_scipy_distributions(run_id: str, build: Build) -> None:
    doc = _params(build, run_id)
    seen = 0
    for task, body in doc.items():
        if not task.endswith("_task"):
            continue
        for name in ("input_distribution", "output_distribution"):
            if name in body:
                d = body[name]
                median = getattr(scipy.stats, d["type"])(*d["parameters"]).median()
                assert math.isfinite(median) and median > 0, (task, name, d["type"], d["parameters"])
                seen += 1
    assert seen >= 2


# ----------------------------------------------------------------------------- aiperf


def _why(error: str) -> str:
    """aiperf repeats the whole distribution string in its message; keep the reason."""
    m = re.search(r"(Probabilit.*?got \d+(?:\.\d+)?)", error)
    return m.group(1) if m else error[-200:]


@pytest.mark.parametrize("run_id", cases("aiperf_parse", ALL_RUN_IDS))
def test_aiperf_parses_the_sequence_distributions(run_id: str, aiperf_files: dict[str, list[Path]],
                                                  aiperf_verdicts: Verdicts) -> None:
    files = aiperf_files[run_id]
    assert files
    verdicts = {p.name: aiperf_verdicts[("sequence_distribution", str(p))] for p in files}
    bad = {n: _why(v["error"]) for n, v in verdicts.items() if not v["ok"]}
    measure(check="aiperf_parse", run=run_id, files=sorted(verdicts), errors=bad)
    assert not bad, bad


# ----------------------------------------------------------------------------- mooncake (aiperf's loader)


def _mooncake(run_id: str, files: dict[str, list[Path]], verdicts: Verdicts) -> list[dict[str, Any]]:
    assert files[run_id], "no mooncake trace"
    return [verdicts[("mooncake", str(p))] for p in files[run_id]]


@pytest.mark.parametrize("run_id", cases("mooncake_load", ALL_RUN_IDS))
def test_mooncake_loads_with_aiperfs_loader(run_id: str, mooncake_files: dict[str, list[Path]],
                                            aiperf_verdicts: Verdicts) -> None:
    vs = _mooncake(run_id, mooncake_files, aiperf_verdicts)
    measure(check="mooncake_load", run=run_id, ok=[v["ok"] for v in vs], errors=[v["error"] for v in vs if v["error"]])
    assert all(v["ok"] for v in vs), [v["error"] for v in vs]


@pytest.mark.parametrize("run_id", cases("mooncake_timestamps", ALL_RUN_IDS))
def test_mooncake_timestamps_are_integer_ms_non_decreasing(run_id: str, mooncake_files: dict[str, list[Path]],
                                                           aiperf_verdicts: Verdicts) -> None:
    for v in _mooncake(run_id, mooncake_files, aiperf_verdicts):
        assert "timestamps_integer_ms" in v, f"aiperf did not load {v['file']}: {v['error']}"
        assert v["timestamps"] == v["traces"], "requests without a timestamp"
        assert v["timestamps_integer_ms"], "fractional-millisecond timestamps"
        assert v["timestamps_non_decreasing"], "timestamps go backwards"


@pytest.mark.parametrize("run_id", cases("mooncake_prefill", MULTI_TURN))
def test_mooncake_multiturn_prefill_matches_the_real_run(run_id: str, mooncake_files: dict[str, list[Path]],
                                                         aiperf_verdicts: Verdicts, real_logs: Path) -> None:
    """aiperf keeps a session's history and threads each response into it, so what one trajectory prefills
    there must match what it prefilled in the real run (per trajectory: the step count is free)."""
    vs = _mooncake(run_id, mooncake_files, aiperf_verdicts)
    assert all("multiturn_prefill_tokens" in v for v in vs), [v["error"] for v in vs]
    got = sum(v["multiturn_prefill_tokens"] for v in vs) / sum(v["sessions"] for v in vs)
    real = [r for recs in _real_full_steps(REAL_RUNS.by_id(run_id), real_logs).values() for r in recs]
    want = statistics.fmean(up.recorded_prompt_tokens(r) for r in real)
    measure(check="mooncake_prefill", run=run_id, aiperf_per_session=got, real_per_trajectory=want, ratio=got / want)
    assert abs(got / want - 1) <= TOLERANCE, _ratio_msg("aiperf multi-turn prefill per session vs real per trajectory",
                                                        got, want)


# ----------------------------------------------------------------------------- vidur


def _header(p: Path) -> list[str]:
    with open(p, newline="") as fh:
        return next(csv.reader(fh), [])


def _vidur(run_id: str, check: str, files: dict[str, list[Path]], verdicts: Verdicts) -> dict[str, dict[str, Any]]:
    assert files[run_id], "no vidur trace"
    return {p.name: verdicts[(check, str(p))] for p in files[run_id]}


@pytest.mark.parametrize("run_id", cases("vidur_trace_replay", ALL_RUN_IDS))
def test_vidur_trace_replay_generator_reads_a_file(run_id: str, vidur_files: dict[str, list[Path]],
                                                   vidur_verdicts: Verdicts) -> None:
    vs = _vidur(run_id, "trace_replay", vidur_files, vidur_verdicts)
    measure(check="vidur_trace_replay", run=run_id, verdicts={n: v["error"] or "ok" for n, v in vs.items()})
    assert any(v["ok"] for v in vs.values()), {n: v["error"] for n, v in vs.items()}


@pytest.mark.parametrize("run_id", cases("vidur_request_length", ALL_RUN_IDS))
def test_vidur_request_length_generator_reads_a_file(run_id: str, vidur_files: dict[str, list[Path]],
                                                     vidur_verdicts: Verdicts) -> None:
    vs = _vidur(run_id, "request_length", vidur_files, vidur_verdicts)
    measure(check="vidur_request_length", run=run_id, verdicts={n: v["error"] or "ok" for n, v in vs.items()})
    assert any(v["ok"] for v in vs.values()), {n: v["error"] for n, v in vs.items()}


@pytest.mark.parametrize("run_id", cases("vidur_request_interval", ALL_RUN_IDS))
def test_vidur_request_interval_generator_reads_the_files_meant_for_it(
        run_id: str, vidur_files: dict[str, list[Path]], vidur_verdicts: Verdicts) -> None:
    """Only a file with vidur's ``arrival_time`` column is meant for this generator; the issue does not ask for one."""
    vs = _vidur(run_id, "request_interval", vidur_files, vidur_verdicts)
    meant = {p.name for p in vidur_files[run_id] if "arrival_time" in _header(p)}
    measure(check="vidur_request_interval", run=run_id, meant_for_it=sorted(meant),
            verdicts={n: v["error"] or "ok" for n, v in vs.items()})
    assert all(vs[n]["ok"] for n in meant), {n: vs[n]["error"] for n in meant}


# ----------------------------------------------------------------------------- our structural checks


@pytest.mark.parametrize("fmt", list(EXPORT_FORMATS))
def test_our_structural_check_passes_every_real_export(fmt: str, build: Build) -> None:
    """What ``make demo`` reports (``ExportFormat.check``) holds on the exports the consumers accept."""
    from analyses.export.registry import export_format

    problems = {rid: export_format(fmt).check(build.export_dir(fmt, rid)) for rid in ALL_RUN_IDS}
    measure(check="structural", run=fmt, problems={k: v for k, v in problems.items() if v})
    assert not any(problems.values()), problems


# ----------------------------------------------------------------------------- the defect registry


def test_every_known_defect_names_a_case() -> None:
    """A stale line in defects.py (a renamed check or run) would silently stop marking anything."""
    from . import defects

    checks = {m.group(1) for m in re.finditer(r'cases\("(\w+)"', Path(__file__).read_text())}
    for check, run_id in defects.KNOWN_DEFECTS:
        assert check in checks and run_id in RUN_IDS, (check, run_id)
