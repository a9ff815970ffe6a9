"""Kineto (PyTorch profiler) trace reader: streaming split, truncation rule, per-step breakdown,
and the real HTA sample traces checked against HTA's own temporal breakdown."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.kineto_breakdown import breakdown
from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import FileContext, read_head
from analyses.readers.kineto import KinetoTraceReader, load_rank_events
from analyses.trace.model import build
from analyses.warehouse import scan_table
from tests.conftest import FIXTURES

KDIR = FIXTURES / "kineto"
MAIN = KDIR / "two_steps_overlapping_streams.json"


def _read(path: Path):
    """The reader's chunks as one: the first holds the accounting and the small tables, trace_kernels
    and trace_ops follow in slices."""
    ctx = FileContext(run_id="r", path=path, rel_path=path.name, manifest=RunManifest())
    first, *rest = list(KinetoTraceReader().read(ctx))
    assert all(c.lines == 0 and len(c.tables) == 1 for c in rest)
    for t in ("trace_kernels", "trace_ops"):
        if any(t in c.tables for c in rest):
            first.tables[t] = pl.concat([c.tables[t] for c in rest if t in c.tables])
    return first


def _wide(chunk) -> dict[int, dict[str, float]]:
    rt = chunk.tables["rank_times"]
    return {s: dict(zip(g["phase"], g["seconds"], strict=True)) for (s,), g in rt.group_by("step")}


def test_sniff_accepts_kineto_and_rejects_other_json(tmp_path: Path) -> None:
    r = KinetoTraceReader()
    assert r.sniff(read_head(MAIN), MAIN)
    assert detect(MAIN).name == "kineto_trace"
    assert not r.sniff('{"step": 1, "data": {"traceEvents": 1}}', tmp_path / "x.jsonl")
    assert not r.sniff('[{"ph": "X"}]', tmp_path / "x.json")


def test_two_steps_hand_computed_breakdown() -> None:
    # Hand computation (µs), see the fixture's events:
    # step 1: gemm [1020,1040) + elementwise [1040,1050) + nccl [1030,1060) + memcpy [1070,1075)
    #   + late_kernel [1105,1115) (launched at 1090 inside step 1, runs in step 2's window)
    #   span 1020..1115 = 95, busy 40+5+10 = 55, idle 40, compute 30+10 = 40, comm 30, memcpy 5,
    #   non_compute 95-40-40 = 15, wall 100
    # step 2: gemm [1120,1140) + memset [1150,1154) + Sync kernel [1160,1166) (no launch event:
    #   placed by its own start); span 46, busy 30, idle 16, compute 20, comm 0, memcpy 4,
    #   non_compute 10 (the Sync kernel is HTA's "other")
    c = _read(MAIN)
    w = _wide(c)
    exp = {
        1: {
            "step_wall": 100,
            "gpu_span": 95,
            "gpu_busy": 55,
            "gpu_idle": 40,
            "compute": 40,
            "comm": 30,
            "memcpy": 5,
            "non_compute": 15,
        },
        2: {
            "step_wall": 100,
            "gpu_span": 46,
            "gpu_busy": 30,
            "gpu_idle": 16,
            "compute": 20,
            "comm": 0,
            "memcpy": 4,
            "non_compute": 10,
        },
    }
    for step, phases in exp.items():
        assert w[step] == pytest.approx({k: v * 1e-6 for k, v in phases.items()})
    rt = c.tables["rank_times"]
    assert rt["rank"].unique().to_list() == [3]  # distributedInfo comes after the array
    assert rt["source"].unique().to_list() == ["kineto_trace"]
    # 22 events: the 19 complete ones kept (2 ProfilerSteps, aten::mm, 7 launches and the
    # gpu_user_annotation into trace_ops, 8 GPU events into trace_kernels); the Trace span, the
    # metadata event and the flow skipped
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (22, 19, 0, 3)
    assert (c.tables["trace_ops"].height, c.tables["trace_kernels"].height) == (11, 8)
    assert c.rejects is None


def test_multiline_and_tiny_chunks_give_the_same_events() -> None:
    # a chunk smaller than one event forces the carry-over path on every byte boundary kind
    big = load_rank_events(MAIN)
    small = load_rank_events(MAIN, chunk_bytes=37)
    assert small.n_events == big.n_events == 22
    assert small.gpu.sort("correlation").equals(big.gpu.sort("correlation"))
    assert small.metadata["distributedInfo"]["rank"] == 3


def test_truncated_mid_event_keeps_complete_events() -> None:
    # cut inside event 16 (the nccl kernel): of the 15 complete events, 2 steps + aten::mm + 7
    # launches + 2 kernels kept, the Trace span, a metadata event and a flow skipped; the cut is
    # one rejected line; rank from the file name (metadata lost)
    c = _read(KDIR / "truncated_mid_event_rank-5.json")
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (16, 12, 1, 3)
    assert c.rejects["reason"][0].startswith("truncated_trace")
    assert c.rejects["line_no"][0] == 16
    assert '"ncclKerne' in c.rejects["raw"][0]
    w = _wide(c)
    # step 1 has gemm [1020,1040) + elementwise [1040,1050) only; step 2 has no GPU event left
    assert w[1]["gpu_busy"] == pytest.approx(30e-6) and w[1]["gpu_idle"] == pytest.approx(0.0)
    assert w[2] == {"step_wall": pytest.approx(100e-6)}
    assert c.tables["rank_times"]["rank"].unique().to_list() == [5]


def test_truncated_gzip_is_not_fatal() -> None:
    path = KDIR / "truncated_gzip_rank-6.json.gz"
    with pytest.raises(EOFError):  # the fixture really is a cut gzip stream
        gzip.decompress(path.read_bytes())
    c = _read(path)
    assert c.rows_rejected == 1 and c.rejects["reason"][0].startswith("truncated_trace")
    # what zlib decompresses before the cut is the text of truncated_mid_event_rank-5.json plus
    # 59 characters, still inside event 16: the same 15 complete events (counted independently
    # with json.JSONDecoder.raw_decode over that text), so the same 12 kept / 3 skipped + the cut
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (16, 12, 1, 3)


def test_escaped_strings_and_hta_rounding_of_ns_times() -> None:
    # names hold \" runs, a trailing \\ and brackets; ns-resolution times are rounded as HTA:
    # step [10.5, 110.5) -> [11, 110) = 99; kernel 20.4+10.2 -> [21, 30) = 9;
    # tiny 40.1+0.5 -> [41, 40) = -1 (HTA's quirk); span 21..40 = 19, busy 9-1 = 8, idle 11
    c = _read(KDIR / "escaped_strings_ns_times.json")
    assert (c.lines, c.rows_ok, c.rows_skipped) == (6, 6, 0)  # the oddly named cpu_op is a trace_ops row
    w = _wide(c)[7]
    assert w["step_wall"] == pytest.approx(99e-6)
    assert w["gpu_span"] == pytest.approx(19e-6)
    assert w["gpu_busy"] == pytest.approx(8e-6)
    assert w["gpu_idle"] == pytest.approx(11e-6)
    ev = load_rank_events(KDIR / "escaped_strings_ns_times.json", rounding="none")
    row = breakdown(_kinds(build(ev.gpu, ev.ops).kernels), []).row(0, named=True)
    assert row["gpu_busy"] == pytest.approx(10.7e-6) and row["gpu_span"] == pytest.approx(20.2e-6)


def test_broken_event_is_rejected_alone_in_ingest(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "a_trace.json").write_text(MAIN.read_text())
    (run / "b_trace.json").write_text(
        '{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "ts": "oops", "dur": 1}, {"ph": "X", "ts": 1,, }]}'
    )
    rep = ingest_run(run, tmp_path / "wh")
    by = {f.path: f for f in rep.files}
    assert by["a_trace.json"].status == "ok"
    # the broken event is rejected on its own; the other one (unusable ts) is a skipped event: with
    # no event of it landing, the file is no_data (with its counts), and the run still lands
    b = by["b_trace.json"]
    assert (b.status, b.rows_rejected, b.rows_skipped, b.rows_ok) == ("no_data", 1, 1, 0)
    rt = scan_table(tmp_path / "wh", "rank_times").collect()
    assert rt.filter(pl.col("step") == 1, pl.col("phase") == "gpu_busy")["seconds"].item() == pytest.approx(
        55e-6
    )


# Expected numbers from HolisticTraceAnalysis 0.5.0 ``get_temporal_breakdown()`` on the same
# files, obtained with ``.venv/bin/python benchmarks/bench_kineto_vs_hta.py`` (µs per rank:
# idle, compute, non_compute, kernel_time). HTA's window: GPU work launched before the last step.
HTA_EXPECTED = {
    ("trace_filter/sampled_rank-0.json.gz", 0): (321_378, 106_252, 172_428, 600_058),
    ("trace_filter/sampled_rank-1.json.gz", 1): (328_671, 135_548, 136_455, 600_674),
    ("nccl_parser_config/nccl_data.json.gz", 0): (338_781, 75_169, 21_636, 435_586),
}


def _kinds(kernels: pl.DataFrame) -> pl.DataFrame:
    kind = {"COMPUTATION": "compute", "COMMUNICATION": "comm", "MEMORY": "memcpy", "OTHER": "other"}
    return kernels.select(ts="ts_us", dur="dur_us", kind=pl.col("kernel_type").replace_strict(kind))


@pytest.mark.real_logs
@pytest.mark.parametrize(("rel", "rank"), list(HTA_EXPECTED))
def test_real_traces_agree_with_hta(real_file, rel: str, rank: int) -> None:
    path = real_file(f"kineto_traces_hta/{rel}")
    ev = load_rank_events(path)
    k = build(ev.gpu, ev.ops).kernels
    w = breakdown(_kinds(k.filter("in_hta_window")), []).row(0, named=True)
    ours = tuple(w[k] * 1e6 for k in ("gpu_idle", "compute", "non_compute", "gpu_span"))
    for o, h in zip(ours, HTA_EXPECTED[(rel, rank)], strict=True):
        assert o == pytest.approx(h, rel=0.01)
    c = _read(path)
    assert c.tables["rank_times"]["rank"].unique().to_list() == [rank]


@pytest.mark.real_logs
def test_real_trace_event_counts(real_file) -> None:
    # event counts from PROVENANCE.md (and `json.load` + len(traceEvents)): 4855 / 4720 / 40573;
    # steps from the ProfilerStep#N names: 551-552 and 4-6
    for rel, n, steps in (
        ("trace_filter/sampled_rank-0.json.gz", 4855, [551, 552]),
        ("trace_filter/sampled_rank-1.json.gz", 4720, [551, 552]),
        ("nccl_parser_config/nccl_data.json.gz", 40573, [4, 5, 6]),
    ):
        path = real_file(f"kineto_traces_hta/{rel}")
        c = _read(path)
        assert c.lines == n and c.rows_rejected == 0
        assert c.lines == c.rows_ok + c.rows_skipped
        assert sorted(c.tables["rank_times"]["step"].unique().to_list()) == steps
        assert json.loads(gzip.decompress(path.read_bytes()))["traceEvents"].__len__() == n


def test_gpu_mirror_of_profiler_step_is_not_a_second_window(tmp_path: Path) -> None:
    # newer traces repeat ProfilerStep#N on the GPU timeline (gpu_user_annotation): wall stays 50 µs
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 50},
        {
            "ph": "X",
            "cat": "gpu_user_annotation",
            "name": "ProfilerStep#3",
            "ts": 5,
            "dur": 60,
            "args": {"device": 0},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 1,
            "dur": 1,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "ts": 5,
            "dur": 10,
            "args": {"stream": 7, "correlation": 1},
        },
    ]
    p = tmp_path / "rank_0.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    w = _wide(_read(p))
    assert w[3]["step_wall"] == pytest.approx(50e-6) and w[3]["gpu_busy"] == pytest.approx(10e-6)


def test_corrupt_gzip_keeps_what_decompressed(tmp_path: Path) -> None:
    # 600 copies of the fixture's events, each with random (incompressible) padding so the gzip
    # spans several decompression feeds (~300 KB); garbage is written at 3/4 of it
    rnd = random.Random(0)
    doc = json.loads(MAIN.read_text())
    doc["traceEvents"] = [{**e, "pad": f"{rnd.getrandbits(160):040x}"} for e in doc["traceEvents"] * 600]
    raw = bytearray(gzip.compress(json.dumps(doc).encode(), mtime=0))
    at = len(raw) * 3 // 4
    raw[at : at + 64] = b"\xff" * 64
    p = tmp_path / "corrupt_rank-1.json.gz"
    p.write_bytes(bytes(raw))
    c = _read(p)  # never raises
    assert c.rows_rejected >= 1
    assert 22 * 100 < c.lines < 22 * 600  # the events before the corruption were kept
    assert c.lines == c.rows_ok + c.rows_rejected + c.rows_skipped


def test_truncated_gzip_through_ingest_is_partial_not_an_error(tmp_path: Path) -> None:
    # the sniffing head of a cut gzip is what decompressed before the cut, so the file reaches
    # the reader (which keeps the complete events) instead of failing as unreadable
    run = tmp_path / "run"
    run.mkdir()
    (run / "t_rank-6.json.gz").write_bytes((KDIR / "truncated_gzip_rank-6.json.gz").read_bytes())
    (f,) = ingest_run(run, tmp_path / "wh").files
    assert (f.format, f.status) == ("kineto_trace", "partial")  # was ("unknown", "error")
    assert (f.lines, f.rows_ok, f.rows_rejected) == (16, 12, 1)  # as test_truncated_gzip_is_not_fatal


def test_profiler_step_number_past_int64_is_skipped_not_fatal(tmp_path: Path) -> None:
    # "ProfilerStep#99999999999999999999" used to fail the strict Int64 cast (whole file lost);
    # by hand: 4 complete events, all kept; the unusable step number makes no step window
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#99999999999999999999", "ts": 60, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 10, "args": {"stream": 7, "correlation": 1}},
    ]
    p = tmp_path / "rank_0.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    c = _read(p)
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (4, 4, 0, 0)
    assert sorted(c.tables["rank_times"]["step"].unique().to_list()) == [3]
