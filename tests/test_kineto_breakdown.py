"""Interval math of the Kineto GPU breakdown, on hand-made frames (answers computed by hand)."""

from __future__ import annotations

import polars as pl
import pytest

from analyses.kineto_breakdown import breakdown, has_sub_us, hta_round, union_length
from analyses.trace.model import kernel_type


def _union(ts: list[float], end: list[float], group: list[int] | None = None) -> dict:
    df = pl.DataFrame({"ts": ts, "end": end, "g": group or [0] * len(ts)})
    out = union_length(df.lazy(), ["g"]).collect().sort("g")
    return dict(zip(out["g"].to_list(), out["union"].to_list(), strict=True))


def test_union_merges_overlapping_touching_and_nested() -> None:
    # [0,10) ∪ [5,12) = [0,12); [12,15) touches -> [0,15); [20,30) ⊃ [22,25) -> 10; total 15 + 10
    assert _union([0, 5, 12, 20, 22], [10, 12, 15, 30, 25]) == {0: 25}


def test_union_unsorted_input_and_groups_are_independent() -> None:
    # group 1: [8,9) and [0,4) -> 5; group 2: [0,4) and [1,2) -> 4 (nested); order of rows irrelevant
    assert _union([8, 0, 1, 0], [9, 4, 2, 4], [1, 2, 2, 1]) == {1: 5, 2: 4}


def test_union_of_long_interval_covering_later_short_ones() -> None:
    # the cumulative max (not just the previous end) decides: [0,100) covers [10,20) and [30,40)
    assert _union([0, 10, 30, 150], [100, 20, 40, 160]) == {0: 110}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "COMMUNICATION"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "COMMUNICATION"),
        ("Memcpy DtoH (Device -> Pageable)", "MEMORY"),
        ("Memset (Device)", "MEMORY"),
        ("void at::native::vectorized_elementwise_kernel<4>", "COMPUTATION"),
        ("void cudaStreamSync_helper()", "OTHER"),  # HTA: names containing "Sync" are not compute
        ("void myMemcpy_kernel()", "OTHER"),  # contains Memcpy but does not start with it
    ],
)
def test_kernel_type_follows_hta(name: str, kind: str) -> None:
    assert pl.select(kernel_type(pl.lit(name))).item() == kind


def test_breakdown_hand_example() -> None:
    # compute [0,10) and [20,30); comm [5,25); memcpy [40,42) -> span 42, busy 30+2 = 32, idle 10,
    # compute 20, comm 20, memcpy 2, non_compute = 42 - 20 - 10 = 12 (µs -> seconds)
    gpu = pl.DataFrame(
        {
            "ts": [0.0, 20.0, 5.0, 40.0],
            "dur": [10.0, 10.0, 20.0, 2.0],
            "kind": ["compute", "compute", "comm", "memcpy"],
        }
    )
    row = breakdown(gpu, []).row(0, named=True)
    assert row["gpu_span"] == pytest.approx(42e-6)
    assert row["gpu_busy"] == pytest.approx(32e-6)
    assert row["gpu_idle"] == pytest.approx(10e-6)
    assert row["compute"] == pytest.approx(20e-6)
    assert row["comm"] == pytest.approx(20e-6)
    assert row["memcpy"] == pytest.approx(2e-6)
    assert row["non_compute"] == pytest.approx(12e-6)
    assert row["n_events"] == 4


def test_hta_round_ceil_start_floor_end() -> None:
    df = pl.DataFrame({"ts": [20.4, 40.1, 7.0], "dur": [10.2, 0.5, 3.0]})
    out = hta_round(df)
    assert out["ts"].to_list() == [21.0, 41.0, 7.0]
    assert out["dur"].to_list() == [9.0, -1.0, 3.0]  # 40.1..40.6 spans no whole µs: HTA gives -1
    assert has_sub_us(df["ts"]) and not has_sub_us(pl.Series([1.0, 2.0]))
