"""Our profiler-trace views against HolisticTraceAnalysis 0.5.0 itself, number by number.

HTA runs from its own cached environment (tests/conformance/consumers.py, ``make conformance-env``;
never the project's), through tests/conformance/drivers/hta_driver.py, on every trace set: the
shared real traces (``kineto_traces_hta``: two ranks of a 128-rank job, and an 8-GPU NCCL trace
with ns timestamps) and the ones tests/_kineto_traces.py writes (a verl actor/critic pair with RL
stage spans and a backward thread, the same with ns-resolution timestamps, a gzip with
``displayTimeUnit: ns``, four ranks with a late one, a launch queue past 1024). The same sets are
ingested with ``PolyTrace.ingest`` and every analysis compared (tests/_hta_compare.py says what
"equal" means, and the few stated tolerances). HTA and the ingest run once per test run, shared by
the xdist workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _ci import skip_or_fail
from _hta_compare import Check, compare, compare_diff
from _kineto_traces import TRACE_SETS
from conformance import consumers
from conformance.harness import once

from analyses.api import PolyTrace
from analyses.trace import TraceAnalysis, TraceSelection

# real trace sets: directory under real_logs, the operators of HTA's frequent-sequence call (its
# call graph costs seconds per call on a real rank: one each) and the queue thresholds compared
REAL_SETS = {
    "trace_filter": ("kineto_traces_hta/trace_filter", [["## sdd", 1]], [1024, 3]),
    "nccl_parser_config": ("kineto_traces_hta/nccl_parser_config", [["## forward ##", 0]], [1024, 3]),
}
FIXTURE_SETS = list(TRACE_SETS)
# TraceDiff: (name, trace set, control rank, test rank, control step, test step)
DIFFS = [("two_ranks_real", "trace_filter", 0, 1, None, None),
         ("actor_vs_critic_steps", "verl_stages_backward_thread", 0, 1, 1, 2)]
# one worker runs the module: the other would only wait on the shared run's lock (``once``)
pytestmark = pytest.mark.xdist_group("trace_vs_hta")


@pytest.fixture(scope="session")
def hta_env() -> consumers.Consumer:
    c = consumers.CONSUMERS["hta"]
    try:
        consumers.ensure(c)
    except consumers.ConsumerUnavailable as exc:  # fails under CI=true, skips elsewhere
        skip_or_fail(f"cannot install HolisticTraceAnalysis=={c.version} into {c.env_dir}: {exc}")
    return c


def _real_root() -> Path | None:
    from conftest import REAL_LOGS

    return REAL_LOGS if (REAL_LOGS / "kineto_traces_hta").is_dir() else None


@pytest.fixture(scope="session")
def runs(hta_env: consumers.Consumer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every trace set through HTA and through our ingest (once per test run)."""

    def make(d: Path) -> dict[str, Any]:
        sets: dict[str, tuple[Path, list, list]] = {}
        for name, (write, seqs, queue) in TRACE_SETS.items():
            write(d / "traces" / name)
            sets[name] = (d / "traces" / name, seqs, queue)
        real = _real_root()
        for name, (rel, seqs, queue) in REAL_SETS.items():
            if real is not None:
                sets[name] = (real / rel, seqs, queue)
        jobs = [{"check": "analyses", "file": str(p), "sequences": s, "max_queue_length": q} for p, s, q in sets.values()]
        jobs += [{"check": "diff", "file": str(sets[ts][0]), "test": str(sets[ts][0]), "control_rank": cr,
                  "test_rank": tr, "control_iteration": ci, "test_iteration": ti}
                 for _n, ts, cr, tr, ci, ti in DIFFS if ts in sets]
        verdicts = consumers.run_driver(hta_env, jobs)
        pt = PolyTrace(d / "wh")
        for name, (p, _s, _q) in sets.items():
            pt.ingest(p, run_id=name)
        by_file = {str(p): n for n, (p, _s, _q) in sets.items()}
        diffs = [list(x) for x in DIFFS if x[1] in sets]
        n_an = len(verdicts) - len(diffs)
        return {"analyses": {by_file[v["file"]]: v for v in verdicts[:n_an]},
                "diff": {x[0]: v for x, v in zip(diffs, verdicts[n_an:], strict=True)}, "diff_jobs": diffs}

    d, made = once(tmp_path_factory, "hta_vs_ours", make)
    made["wh"] = str(d / "wh")
    return made


def _report(checks: list[Check]) -> str:
    lines = [f"{c.analysis:32} compared {c.compared:5}  problems {len(c.problems):3}  ours: {c.ours}  HTA: {c.hta}"
             + (f"  [{c.note}]" if c.note else "") for c in checks]
    probs = [f"  {c.analysis}: {p}" for c in checks for p in c.problems[:8]]
    return "\n".join(lines + (["problems:"] + probs if probs else []))


def _sets() -> list[Any]:
    return [*FIXTURE_SETS, *(pytest.param(n, marks=pytest.mark.real_logs) for n in REAL_SETS)]


@pytest.mark.parametrize("trace_set", _sets())
def test_every_analysis_equals_htas(runs: dict[str, Any], trace_set: str) -> None:
    if trace_set not in runs["analyses"]:
        skip_or_fail(f"real trace set {trace_set} not found under real_logs")
    hta = runs["analyses"][trace_set]
    assert hta.get("ok"), hta.get("error")
    con = PolyTrace(runs["wh"]).connect()
    checks = compare(TraceAnalysis(con, trace_set), hta)
    assert not [p for c in checks for p in c.problems], _report(checks)
    # the comparison is not vacuous: every set exercises the core analyses
    n = {c.analysis: c.compared for c in checks}
    assert min(n["temporal_breakdown"], n["kernel_idle_breakdown"], n["kernel_type_breakdown"],
               n["comm_comp_overlap"], n["kernel_launch_stats"], n["queue_length_summary"]) > 0, _report(checks)


@pytest.mark.parametrize("diff", [d[0] for d in DIFFS])
def test_trace_diff_equals_htas(runs: dict[str, Any], diff: str) -> None:
    job = next((j for j in runs["diff_jobs"] if j[0] == diff), None)
    if job is None:
        skip_or_fail(f"trace set of diff {diff} not found under real_logs")
    _n, ts, cr, tr, ci, ti = job
    hta = runs["diff"][diff]
    assert hta.get("ok"), hta.get("error")
    con = PolyTrace(runs["wh"]).connect()
    ours = TraceAnalysis(con, ts).compare_traces(TraceSelection(ts, (cr,), (ci,) if ci is not None else None),
                                                 TraceSelection(ts, (tr,), (ti,) if ti is not None else None))
    c = compare_diff(ours, hta["rows"])
    assert c.compared > 100 and not c.problems, _report([c])


def test_hta_documented_failures_are_ours_to_cover(runs: dict[str, Any]) -> None:
    """Where HTA raises, we answer: frequent kernel sequences on ns-resolution traces (HTA's call
    graph refuses the -1 µs durations its own rounding makes) and stragglers on one rank."""
    con = PolyTrace(runs["wh"]).connect()
    ns = runs["analyses"]["ns_resolution_float_timestamps"]
    seq = ns["sequences"][0]
    assert "Unexpected case" in seq["rows"]["error"]
    ta = TraceAnalysis(con, "ns_resolution_float_timestamps")
    assert ta.get_frequent_cuda_kernel_sequences(seq["operator"], rank=seq["rank"]).height >= 1
    one = runs["analyses"]["queue_over_1024_launches"]
    assert "error" in one["stragglers"]  # HTA: argmax of an empty sequence
    assert TraceAnalysis(con, "queue_over_1024_launches").get_potential_stragglers() == []
