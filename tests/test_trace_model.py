"""The per-rank trace model: RL stages, call stacks, HTA's window and launches, on hand-made frames
(answers computed by hand in the comments)."""

from __future__ import annotations

import polars as pl
import pytest

from analyses.trace.model import GPU_SCHEMA, OPS_SCHEMA, build, call_stack, hta_window_bounds, link_backward
from analyses.trace.stages import STAGE_NAMES, stage_at, stage_of_name, stage_timeline


def _ops(rows: list[tuple]) -> pl.DataFrame:
    """rows: (ev, cat, name, ts, dur, tid[, correlation][, pid])."""
    out = []
    for r in rows:
        ev, cat, name, ts, dur, tid = r[:6]
        corr = r[6] if len(r) > 6 else None
        pid = r[7] if len(r) > 7 else "1"
        out.append({"ev": ev, "ts": float(ts), "dur": float(dur), "correlation": corr, "cat": cat, "name": name,
                    "pid": pid, "tid": str(tid)})
    return pl.DataFrame(out, schema=OPS_SCHEMA)


def _gpu(rows: list[tuple]) -> pl.DataFrame:
    """rows: (ev, name, ts, dur, stream, correlation)."""
    return pl.DataFrame([{"ev": ev, "ts": float(ts), "dur": float(dur), "correlation": corr, "stream": stream,
                          "device": 0, "cat": "kernel", "name": name, "pid": "0", "tid": str(stream), "bytes": None,
                          "memory_bw_gbps": None} for ev, name, ts, dur, stream, corr in rows], schema=GPU_SCHEMA)


@pytest.mark.parametrize(("name", "stage"), [
    ("generate_sequences", "gen"), ("gen", "gen"), ("compute_log_prob", "old_log_prob"),
    ("compute_ref_log_prob", "ref"), ("compute_values", "values"), ("## update_actor ##", "update_actor"),
    ("Update_Critic", "update_critic"), ("ProfilerStep#3", None), ("step", None), ("aten::mm", None),
])
def test_span_names_map_to_verl_timing_keys(name: str, stage: str | None) -> None:
    assert pl.select(stage_of_name(pl.lit(name))).item() == stage
    assert stage is None or stage in STAGE_NAMES


def test_stage_timeline_innermost_span_wins_and_gaps_have_none() -> None:
    # gen [10, 40) holds ref [20, 30); values [50, 60) after a gap; update_actor [60, 80) touches it
    spans = pl.DataFrame({"ts": [10.0, 20, 50, 60], "end": [40.0, 30, 60, 80],
                          "stage": ["gen", "ref", "values", "update_actor"]})
    tl = stage_timeline(spans)
    assert tl.rows() == [(10.0, "gen"), (20.0, "ref"), (30.0, "gen"), (40.0, None), (50.0, "values"),
                         (60.0, "update_actor"), (80.0, None)]
    at = pl.DataFrame({"t": [5.0, 10, 25, 30, 45, 59.9, 60, 79, 80, None]})
    assert stage_at(at, "t", tl)["stage"].to_list() == [None, "gen", "ref", "gen", None, "values", "update_actor",
                                                        "update_actor", None, None]


def test_stage_timeline_overlapping_spans_of_two_threads() -> None:
    # not nested: ref [0, 20) on one thread, values [10, 30) on another; the later start is innermost
    # while both run, then ref is gone at 20 and values holds to 30
    tl = stage_timeline(pl.DataFrame({"ts": [0.0, 10.0], "end": [20.0, 30.0], "stage": ["ref", "values"]}))
    assert tl.rows() == [(0.0, "ref"), (10.0, "values"), (30.0, None)]


def test_call_stack_depth_subtree_and_zero_length_events() -> None:
    # lane 1: A [0, 100) > B [0, 40) > C [10, 20); D [40, 60) touches B's end: a sibling of B;
    # Z (0 µs at 60) opens where nothing non-zero opens but D closes: HTA puts it before D's close
    # (inside D); lane 2: E [5, 15) alone; the pid-0 lane is a GPU lane for HTA: no stack
    ops = _ops([(1, "cpu_op", "A", 0, 100, 1), (2, "cpu_op", "B", 0, 40, 1), (3, "cpu_op", "C", 10, 10, 1),
                (4, "cpu_op", "D", 40, 20, 1), (5, "cpu_op", "Z", 60, 0, 1), (6, "cpu_op", "E", 5, 10, 2),
                (7, "gpu_user_annotation", "G", 0, 5, 7, None, "0")])
    cs = call_stack(ops).sort("ev")
    assert cs["depth"].to_list() == [0, 1, 2, 1, 2, 0, None]
    pos = dict(zip(cs["name"].to_list(), cs["pos"].to_list(), strict=True))
    sub = dict(zip(cs["name"].to_list(), cs["sub_end"].to_list(), strict=True))
    assert [pos[n] for n in "ABCDZE"] == [0, 1, 2, 3, 4, 5]  # lane-major start order
    # A's subtree: B, C, D, Z (pos 1..4); B's: C; D's: Z; E's: nothing
    assert (sub["A"], sub["B"], sub["C"], sub["D"], sub["Z"], sub["E"]) == (5, 3, 3, 5, 5, 6)


def test_backward_thread_hangs_under_the_backward_annotation() -> None:
    # main lane: ProfilerStep#1 [0, 1000) > "## backward ##" [100, 600); autograd lane: two top-level
    # ops inside it in time, one after it (stays unlinked)
    ops = _ops([(1, "user_annotation", "ProfilerStep#1", 0, 1000, 1), (2, "user_annotation", "## backward ##", 100, 500, 1),
                (3, "cpu_op", "autograd::engine::evaluate_function: MmBackward0", 150, 100, 2),
                (4, "cpu_op", "aten::mm", 160, 50, 2),
                (5, "cpu_op", "autograd::engine::evaluate_function: AddBackward0", 300, 50, 2),
                (6, "cpu_op", "autograd::engine::evaluate_function: ViewBackward0", 700, 50, 2)])
    o = link_backward(call_stack(ops)).sort("ev")
    bwd_pos = o.filter(pl.col("ev") == 2)["pos"].item()
    # "## backward ##" has depth 1: linked ops are one deeper than it, their children two
    assert o["depth"].to_list() == [0, 1, 2, 3, 2, 0]
    assert o["link_pos"].to_list() == [None, None, bwd_pos, bwd_pos, bwd_pos, None]


def test_hta_window_needs_two_step_names() -> None:
    one = _ops([(1, "user_annotation", "ProfilerStep#1", 0, 100, 1)])
    assert hta_window_bounds(one) == (None, None)
    # the GPU-side mirror of the last step counts for HTA (it starts later than the CPU span)
    two = _ops([(1, "user_annotation", "ProfilerStep#1", 0, 100, 1), (2, "user_annotation", "ProfilerStep#2", 100, 100, 1),
                (3, "gpu_user_annotation", "ProfilerStep#2", 130, 100, 7, None, "0")])
    assert hta_window_bounds(two) == (130.0, 230.0)


def test_build_launch_step_stage_window_and_subtree_kernels() -> None:
    # steps #1 [0, 100), #2 [100, 200); "update_actor" [10, 90) holds op "aten::mm" [20, 60) with two
    # launches (corr 1 at 25, corr 2 at 40); corr 3 launched at 120 in step 2 (after the window);
    # kernel 4 has no launch in the trace and runs at 150
    ops = _ops([(1, "user_annotation", "ProfilerStep#1", 0, 100, 1), (2, "user_annotation", "ProfilerStep#2", 100, 100, 1),
                (3, "user_annotation", "update_actor", 10, 80, 1), (4, "cpu_op", "aten::mm", 20, 40, 1),
                (5, "cuda_runtime", "cudaLaunchKernel", 25, 5, 1, 1), (6, "cuda_runtime", "cudaLaunchKernel", 40, 5, 1, 2),
                (7, "cuda_runtime", "cudaLaunchKernel", 120, 5, 1, 3)])
    gpu = _gpu([(8, "gemm", 95, 30, 7, 1), (9, "ncclKernel_AllReduce", 50, 20, 20, 2), (10, "gemm", 130, 10, 7, 3),
                (11, "gemm", 150, 5, 7, 4)])
    rt = build(gpu, ops)
    k = rt.kernels.sort("ev")
    assert k["launch_ev"].to_list() == [5, 6, 7, None]
    assert k["step"].to_list() == [1, 1, 2, 2]  # by launch; the last by its own start
    assert k["step_by_launch"].to_list() == [True, True, True, False]
    # the first kernel runs after update_actor ends (95 > 90) but was launched in it
    assert k["stage"].to_list() == ["update_actor", "update_actor", None, None]
    assert k["in_hta_window"].to_list() == [True, True, False, False]  # HTA: launched before step 2 starts
    assert k["kernel_type"].to_list() == ["COMPUTATION", "COMMUNICATION", "COMPUTATION", "COMPUTATION"]
    o = rt.ops.sort("ev")
    assert o["in_hta_window"].to_list() == [True, False, True, True, True, True, False]
    # subtree kernels (window only): step 1 and update_actor and aten::mm hold both (30 + 20 µs)
    assert o["num_kernels"].to_list() == [2, 0, 2, 2, 1, 1, 0]
    assert o["kernel_dur_sum_us"].to_list() == [50.0, 0.0, 50.0, 50.0, 30.0, 20.0, 0.0]
    assert rt.facts["hta_window_end_us"] == 100.0
    # HTA's trace duration: window events' starts, 0 (step 1) .. 95 (first kernel)
    assert rt.facts["hta_span_us"] == 95.0
