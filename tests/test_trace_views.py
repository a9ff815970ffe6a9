"""The profiler_trace views on traces written for them, answers computed by hand; RL stages beside the
console log; stragglers; the report section; ``polytrace trace-diff``."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from _kineto_traces import (
    ALLREDUCE,
    DTOD,
    GELU,
    GEMM,
    NCCL,
    TraceWriter,
    four_ranks_rank2_starts_late,
    queue_over_1024_launches,
    verl_stages_backward_thread,
)

from analyses.api import PolyTrace
from analyses.cli import main as cli_main
from analyses.cli.trace_diff import parse_selection
from analyses.report import group_section
from analyses.trace import TraceAnalysis
from analyses.views import group, view_frame


def _hand_trace(d: Path) -> Path:
    """One rank, two steps ([0, 1000), [1000, 2000)); stream 7 kernels k1..k5, an all-reduce on
    stream 20 and a device copy on stream 24 (launch ts -> GPU interval, µs):

        k1 GEMM   10 -> [100, 150)   gen          first on its stream: no gap
        AR        20 -> [120, 220)   gen          stream 20
        copy      30 -> [140, 180)   gen          stream 24, 4 MiB
        k2 GEMM  160 -> [170, 200)   gen          gap 20, launched after k1 ended: host_wait
        k3 GELU  165 -> [210, 220)   update_actor gap 10 < 30 µs: kernel_wait
        k4 GEMM  170 -> [300, 340)   update_actor gap 80: other
        k5 GELU  400 -> [410, 412)   (no stage)   gap 70, launched after k4 ended: host_wait; 2 µs < its 4 µs launch: short
        k6 GEMM 1100 -> [1200, 1210) step 2: after HTA's window
    """
    w = TraceWriter(rank=0, world_size=1)
    w.span("ProfilerStep#1", 0, 1000)
    w.span("ProfilerStep#2", 1000, 1000)
    w.span("generate_sequences", 5, 157)  # [5, 162)
    w.span("update_actor", 163, 137)  # [163, 300)
    w.launch(GEMM, 10, 50, start=100)
    w.launch(ALLREDUCE, 20, 100, stream=NCCL, start=120)
    w.launch(DTOD, 30, 40, stream=24, start=140, nbytes=4 << 20)
    w.launch(GEMM, 160, 30, start=170)
    w.launch(GELU, 165, 10, start=210)
    w.launch(GEMM, 170, 40, start=300)
    w.launch(GELU, 400, 2, start=410)
    w.launch(GEMM, 1100, 10, start=1200)
    return w.write(d / "hand" / "rank-0.json").parent


# one worker runs the module: its module fixture (the hand-written and verl traces ingested) is built once, not on each worker
pytestmark = pytest.mark.xdist_group("trace_views")


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> PolyTrace:
    d = tmp_path_factory.mktemp("traces")
    pt = PolyTrace(d / "wh")
    pt.ingest(_hand_trace(d), run_id="hand")
    verl = d / "verl"
    verl_stages_backward_thread(verl)
    # the trainer's JSONL log of the same run: what the console says each stage took
    (verl / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {
        "timing_s/gen": 0.0031, "timing_s/old_log_prob": 0.0015, "timing_s/ref": 0.0013,
        "timing_s/update_actor": 0.0042, "timing_s/step": 0.0101}}) + "\n" for s in (1, 2, 3)))
    pt.ingest(verl, run_id="verl")
    four_ranks_rank2_starts_late(d / "four")
    pt.ingest(d / "four", run_id="four")
    queue_over_1024_launches(d / "queue")
    pt.ingest(d / "queue", run_id="queue")
    return pt


@pytest.fixture(scope="module")
def con(wh: PolyTrace) -> duckdb.DuckDBPyConnection:
    return wh.connect()


def _rows(con: duckdb.DuckDBPyConnection, view: str, run: str) -> list[dict]:
    return view_frame(con, view, [run]).to_dicts()


def test_idle_breakdown_by_cause_and_stage(con: duckdb.DuckDBPyConnection) -> None:
    got = {(r["stream"], r["idle_category"]): round(r["idle_time_s"] * 1e6, 6)
           for r in _rows(con, "kernel_idle_breakdown", "hand")}
    # stream 7: host_wait 20 + 70, kernel_wait 10, other 80 (and k1's missing gap); 20 and 24 one kernel each
    assert got == {(7, "host_wait"): 90.0, (7, "kernel_wait"): 10.0, (7, "other"): 80.0, (20, "other"): 0.0,
                   (24, "other"): 0.0}
    by_stage = {(r["stream"], r["stage"], r["idle_category"]): round(r["idle_time_s"] * 1e6, 6)
                for r in _rows(con, "kernel_idle_by_stage", "hand") if r["stream"] == 7}
    assert by_stage == {(7, "gen", "other"): 0.0, (7, "gen", "host_wait"): 20.0, (7, "update_actor", "kernel_wait"): 10.0,
                        (7, "update_actor", "other"): 80.0, (7, None, "host_wait"): 70.0}


def test_kernel_types_overlap_and_temporal_breakdown(con: duckdb.DuckDBPyConnection) -> None:
    kt = {r["kernel_type"]: round(r["sum_s"] * 1e6, 6) for r in _rows(con, "kernel_type_breakdown", "hand")}
    # sweep: [100,120) COMP, [120,140) COMP+COMM, [140,150) all three, [150,170) COMM+MEM, [170,180)
    # all three, [180,200) COMP+COMM, [200,210) COMM, [210,220) COMP+COMM, [300,340) and [410,412) COMP
    assert kt == {"COMPUTATION": 62.0, "COMPUTATION overlapping COMMUNICATION": 50.0,
                  "COMPUTATION overlapping COMMUNICATION overlapping MEMORY": 20.0,
                  "COMMUNICATION overlapping MEMORY": 20.0, "COMMUNICATION": 10.0}
    shares = {r["kernel_type"]: r["share_pct"] for r in _rows(con, "kernel_type_breakdown", "hand")}
    assert shares["COMPUTATION"] == pytest.approx(100 * 62 / 162)
    # communication runs [120, 220): 100 µs, 50 + 20 of them with compute
    assert _rows(con, "comm_comp_overlap", "hand")[0]["overlap_pct"] == pytest.approx(70.0)
    t = _rows(con, "temporal_breakdown", "hand")[0]
    # span 100..412 = 312; busy [100,220) + [300,340) + [410,412) = 162; compute 50+30+10+40+2 = 132
    assert [round(t[c] * 1e6, 6) for c in ("kernel_time_s", "idle_s", "compute_s", "non_compute_s")] == [312, 150, 132, 30]


def test_launch_stats_queue_and_memory_bandwidth(con: duckdb.DuckDBPyConnection) -> None:
    ls = {r["ev"]: r for r in _rows(con, "kernel_launch_stats", "hand")}
    delays = sorted(r["launch_delay_us"] for r in ls.values())
    # k1 100-14, AR 120-24, copy 140-34, k2 170-164, k3 210-169, k4 300-174, k5 410-404; k6 not in the window
    assert delays == [6, 6, 41, 86, 96, 106, 126]
    s = _rows(con, "kernel_launch_summary", "hand")[0]
    assert (s["launches"], s["short_kernels"], s["runtime_outliers"], s["launch_delay_outliers"]) == (7, 1, 0, 2)
    q = {r["stream"]: r for r in _rows(con, "queue_length_summary", "hand")}
    # stream 7: +1 at 10, 160, 165, 170, 400; -1 at 100, 170, 210, 300, 410 (increments first at 170):
    # 1 0 1 2 3 2 1 0 1 0
    assert (q[7]["count"], q[7]["mean"], q[7]["max"]) == (10, pytest.approx(1.1), 3)
    full = TraceAnalysis(con, "hand").get_time_spent_blocked_on_full_queue(max_queue_length=2).to_dicts()
    # length >= 2 from 165 to 210 (45 µs); HTA's trace duration: window starts 0 .. 410
    assert [(r["stream"], round(r["duration_at_max_queue_length_s"] * 1e6, 6)) for r in full] == [(7, 45.0)]
    assert full[0]["relative_duration_at_max_queue_length"] == pytest.approx(45 / 410)
    bw = _rows(con, "memory_bw_summary", "hand")
    assert [(r["copy_kind"], r["count"]) for r in bw] == [("Memcpy DtoD", 1)]
    assert bw[0]["mean"] == pytest.approx((4 << 20) / 40 / 1e3)  # bytes / µs / 1e3 = GB/s


def test_queue_past_1024_is_time_blocked(con: duckdb.DuckDBPyConnection) -> None:
    full = _rows(con, "queue_full_time", "queue")
    assert len(full) == 1 and full[0]["duration_at_max_queue_length_s"] > 0
    assert max(r["max"] for r in _rows(con, "queue_length_summary", "queue")) > 1024


def test_every_kernel_and_idle_interval_has_its_rl_stage(con: duckdb.DuckDBPyConnection) -> None:
    k = con.sql("SELECT rank, stage, count(*) AS n FROM trace_kernels WHERE run_id = 'verl' GROUP BY ALL").pl()
    stages = {(r["rank"], r["stage"]) for r in k.to_dicts()}
    assert {(0, "gen"), (0, "old_log_prob"), (0, "ref"), (0, "update_actor"), (1, "gen"), (1, "values"),
            (1, "update_critic")} <= stages
    # the backward thread's kernels, launched while update_actor was open, belong to it
    bwd = con.sql("SELECT DISTINCT stage FROM trace_kernels WHERE run_id = 'verl' AND rank = 0 "
                  "AND name = 'ampere_sgemm_64x64_nn'").fetchall()
    assert bwd == [("update_actor",)]
    assert con.sql("SELECT count(*) FROM trace_idle_intervals WHERE run_id = 'verl' AND stage IS NULL "
                   "AND idle_us IS NOT NULL").fetchall()[0][0] <= 6  # the optimizer's kernel after each update


def test_profiler_stage_time_beside_the_console_log(con: duckdb.DuckDBPyConnection) -> None:
    st = {(r["rank"], r["step"], r["stage"]): r for r in _rows(con, "trace_stage_time", "verl")}
    assert st[(0, 2, "update_actor")]["span_s"] == pytest.approx(3800e-6)
    assert st[(0, 2, "update_actor")]["kernels"] > 0 and st[(0, 2, "gen")]["host_wait_s"] > 0
    vs = {r["stage"]: r for r in _rows(con, "trace_stage_vs_log", "verl")}
    # the profiler: 3.8 ms per step in update_actor (rank 0's spans); the log: 4.2 ms
    assert vs["update_actor"]["trace_mean_s"] == pytest.approx(3800e-6)
    assert vs["update_actor"]["log_mean_s"] == pytest.approx(0.0042)
    assert vs["update_actor"]["trace_over_log"] == pytest.approx(3.8 / 4.2)
    assert vs["gen"]["trace_mean_s"] == pytest.approx(2900e-6) and vs["values"]["log_mean_s"] is None


def test_frequent_kernel_sequences_view(con: duckdb.DuckDBPyConnection) -> None:
    seq = [r for r in _rows(con, "frequent_kernel_sequences", "verl") if r["operator"] == "aten::linear" and r["rank"] == 0]
    # rank 0, window (steps 1-2): aten::linear at depth 2 in compute_log_prob (5) and compute_ref_log_prob (4);
    # the 3 under ## forward ## sit deeper and are not roots
    assert [(r["pattern"], r["count"], r["pattern_len"]) for r in seq] == [(f"aten::linear|{GEMM}|{GELU}|{DTOD}", 18, 3)]


def test_straggler_is_the_late_rank(con: duckdb.DuckDBPyConnection) -> None:
    s = {r["rank"]: r for r in _rows(con, "trace_stragglers", "four")}
    # HTA's window holds steps 10 and 11 (the last, 12, is cut): rank 2 is flagged in both
    assert s[2]["steps"] == 2 and s[2]["straggler_count"] == 2 and s[2]["is_potential_straggler"]
    assert max(s, key=lambda r: (s[r]["straggler_count"], -r)) == 2
    m = _rows(con, "straggler_metric", "four")
    assert {r["kernel"] for r in m} == {ALLREDUCE}


def test_report_section_headline_and_figures(con: duckdb.DuckDBPyConnection) -> None:
    sec = group_section(con, group("profiler_trace"), ["verl", "hand"])
    h = sec.headline.to_dicts()
    assert {(r["run_id"], r["rank"]) for r in h} == {("hand", 0), ("verl", 0), ("verl", 1)}
    hand = next(r for r in h if r["run_id"] == "hand")
    assert hand["comm_comp_overlap_pct"] == pytest.approx(70.0)
    assert hand["idle_host_wait"] == pytest.approx(round(90 / 180, 3))
    keys = {f.key for f in sec.figures}
    assert {"profiler_trace__timeline__verl", "profiler_trace__kernel_types", "profiler_trace__top_kernels__verl",
            "profiler_trace__idle_by_stage__verl"} <= keys
    assert all(f.drawn for f in sec.figures)


def test_trace_diff_selection_syntax() -> None:
    assert parse_selection("run") == ("run", None, None, None)
    assert parse_selection("run:0,2:3-5:gen") == ("run", (0, 2), (3, 4, 5), "gen")
    assert parse_selection("run::7") == ("run", None, (7,), None)


def test_trace_diff_cli_actor_against_critic(wh: PolyTrace, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["trace-diff", "--control", "verl:0:1", "--test", "verl:1:1", "--warehouse", str(wh.read_root()),
                   "--format", "json", "--limit", "0"])
    assert rc == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["compute_values"]["change"] == "added" and rows["compute_log_prob"]["change"] == "deleted"
    # the CPU span and its GPU-side mirror, as HTA counts them
    assert rows["update_critic"]["test_counts"] == 2 and rows["update_actor"]["control_counts"] == 2
    # rank 1 (critic) runs 6 aten::linear in compute_values + 3 in its forward, rank 0 5 + 4 + 3
    assert (rows["aten::linear"]["control_counts"], rows["aten::linear"]["test_counts"]) == (12, 9)
    impacts = [r["impact_s"] for r in rows.values()]
    assert impacts == sorted(impacts, reverse=True)
    assert cli_main(["trace-diff", "--control", "nope", "--test", "verl", "--warehouse", str(wh.read_root())]) == 2
    assert cli_main(["trace-diff", "--control", "verl:x", "--test", "verl", "--warehouse", str(wh.read_root())]) == 2
