"""Kineto (PyTorch profiler) traces the tests write, each named after the quirk it covers.

The events are laid out as PyTorch writes them: CPU ops and ``record_function`` ranges
(``user_annotation``) on threads, their GPU mirrors (``gpu_user_annotation``) on the device's lanes,
``cudaLaunchKernel`` / ``cudaMemcpyAsync`` runtime calls linked to their GPU events by
``correlation`` (plus the ``ac2g`` flow events), ``ProfilerStep#N`` spans, metadata events, and
``distributedInfo`` after the event array. Timestamps are whole microseconds unless a writer says
otherwise; a kernel starts when its stream is free and its launch has ended, so the traces are
physically consistent (HTA's analyses run on them unchanged).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

PID = 4242
MAIN, BWD = 4242, 4301  # threads: the training loop and the autograd engine
COMPUTE, NCCL, COPY = 7, 20, 24  # CUDA streams

GEMM = "ampere_sgemm_128x64_tn"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, float*)"
FLASH = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, true>(Flash_fwd_params)"
BWD_GEMM = "ampere_sgemm_64x64_nn"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
DTOD = "Memcpy DtoD (Device -> Device)"
HTOD = "Memcpy HtoD (Pinned -> Device)"


@dataclass
class TraceWriter:
    """Builds one rank's trace."""

    rank: int
    world_size: int
    device: int = 0
    display_time_unit: str = "ms"
    events: list[dict] = field(default_factory=list)
    _corr: int = 1000
    _free: dict[int, float] = field(default_factory=dict)

    def span(self, name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "user_annotation",
             gpu_mirror: bool = False, gpu_delay: float = 3.0) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
                            "args": {"External id": len(self.events)}})
        if gpu_mirror:
            self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": self.device,
                                "tid": COMPUTE, "ts": ts + gpu_delay, "dur": dur, "args": {"device": self.device}})

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.span(name, ts, dur, tid, cat="cpu_op")

    def launch(self, kernel: str, ts: float, dur: float, stream: int = COMPUTE, tid: int = MAIN,
               launch_dur: float = 4.0, delay: float = 2.0, nbytes: int | None = None, correlation: int | None = None,
               launch_name: str | None = None, start: float | None = None) -> float:
        """A runtime call at ``ts`` and the GPU event it enqueues (``dur`` µs on ``stream``, from
        ``start`` when given, else as soon as the launch has ended and the stream is free);
        returns the GPU event's end."""
        self._corr += 1
        corr = correlation if correlation is not None else self._corr
        memory = kernel.startswith(("Memcpy", "Memset"))
        name = launch_name or ("cudaMemcpyAsync" if kernel.startswith("Memcpy") else
                               "cudaMemsetAsync" if kernel.startswith("Memset") else "cudaLaunchKernel")
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
                            "dur": launch_dur, "args": {"cbid": 211, "correlation": corr}})
        if start is None:
            start = max(ts + launch_dur + delay, self._free.get(stream, 0.0))
        args: dict = {"queued": 0, "device": self.device, "context": 1, "stream": stream, "correlation": corr}
        cat = "kernel"
        if memory:
            cat = "gpu_memcpy" if kernel.startswith("Memcpy") else "gpu_memset"
            nbytes = nbytes or 1 << 20
            args.update({"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / dur / 1e3})
        else:
            args.update({"registers per thread": 128, "shared memory": 0, "grid": [108, 1, 1], "block": [128, 1, 1]})
        self.events.append({"ph": "X", "cat": cat, "name": kernel, "pid": self.device, "tid": stream, "ts": start,
                            "dur": dur, "args": args})
        self.events.append({"ph": "s", "id": corr, "pid": PID, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream, "ts": start, "cat": "ac2g",
                            "name": "ac2g", "bp": "e"})
        self._free[stream] = start + dur
        return start + dur

    def linear(self, ts: float, tid: int = MAIN, reps: int = 1) -> float:
        """``aten::linear`` ops (gemm + gelu + a device copy, one launch each); returns the CPU time after."""
        t = ts
        for _ in range(reps):
            self.op("aten::linear", t, 40, tid)
            self.launch(GEMM, t + 5, 25, tid=tid)
            self.launch(GELU, t + 15, 8, tid=tid)
            self.launch(DTOD, t + 25, 3, tid=tid, nbytes=4 << 20)
            t += 45
        return t

    def write(self, path: Path, gz: bool = False, ns_offset: float | None = None) -> Path:
        meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "python"}},
                {"name": "process_name", "ph": "M", "ts": 0, "pid": self.device, "tid": 0,
                 "args": {"name": f"GPU {self.device}"}}]
        events = sorted(self.events, key=lambda e: (e["pid"] != PID, e["ts"]))  # CPU side first, as Kineto writes
        if ns_offset is not None:  # ns-resolution traces: float µs with fractions (PyTorch >= 2.3)
            events = [{**e, "ts": e["ts"] + ns_offset} for e in events]
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": self.device, "name": "NVIDIA H100 80GB HBM3"}],
               "traceEvents": meta + events + [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                                                "tid": "PyTorch Profiler", "ts": events[0]["ts"] - 10, "dur": 1e6}],
               "displayTimeUnit": self.display_time_unit, "traceName": f"rank-{self.rank}",
               "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world_size}}
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(doc, indent=1).encode()
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        return path


def _verl_step(w: TraceWriter, step: int, base: float, critic: bool, sub_us: bool = False) -> None:
    """One verl PPO step as a worker's profiler sees it: generation, old/ref log-probs (values on
    the critic), the update with a forward, a backward on the autograd thread, an all-reduce that
    overlaps the backward's compute and a host-to-device copy overlapping both."""
    w.span(f"ProfilerStep#{step}", base, 10_000, cat="user_annotation")
    if sub_us:  # a sub-µs op (rounded as HTA does: -1 µs) starting where a 0 µs op does
        w.op("aten::empty", base + 60, 0.5)
        w.op("aten::detach", base + 60.625, 0.0)
    w.span("generate_sequences", base + 100, 2_900, gpu_mirror=True)
    for i in range(40):  # decode steps: the CPU launches slower than the GPU runs (host wait)
        w.launch(FLASH, base + 150 + 60 * i, 30)
    if critic:
        w.span("compute_values", base + 3_000, 1_400, gpu_mirror=True)
        w.linear(base + 3_050, reps=6)
    else:
        w.span("compute_log_prob", base + 3_000, 1_400, gpu_mirror=True)
        w.linear(base + 3_050, reps=5)
        w.span("compute_ref_log_prob", base + 4_500, 1_300, gpu_mirror=True)
        w.linear(base + 4_550, reps=4)
    upd = "update_critic" if critic else "update_actor"
    w.span(upd, base + 6_000, 3_800, gpu_mirror=True)
    w.span("## forward ##", base + 6_050, 900)
    w.linear(base + 6_100, reps=3)
    w.span("## backward ##", base + 7_000, 2_000)
    for i in range(4):  # the autograd thread's ops, launched in a burst (kernel wait between them)
        t = base + 7_100 + 200 * i
        w.op("autograd::engine::evaluate_function: AddmmBackward0", t, 150, tid=BWD)
        w.op("aten::mm", t + 10, 60, tid=BWD)
        w.launch(BWD_GEMM, t + 15, 120, tid=BWD)
        w.launch(BWD_GEMM, t + 25, 110, tid=BWD)
        w.launch(GELU, t + 35, 6, tid=BWD)
    w.launch(ALLREDUCE, base + 7_500, 900 if not critic else 700, stream=NCCL)
    w.launch(HTOD, base + 7_520, 300, stream=COPY, nbytes=64 << 20)
    w.op("Optimizer.step#AdamW.step", base + 9_100, 600)
    w.launch(GELU, base + 9_150, 20)


def verl_stages_backward_thread(d: Path, gz: bool = False, ns_offset: float | None = None) -> list[Path]:
    """Two ranks of a verl PPO job, 3 ProfilerSteps each: rank 0 an actor (generate_sequences,
    compute_log_prob, compute_ref_log_prob, update_actor), rank 1 a critic (compute_values,
    update_critic); a backward thread whose ops hang under ``## backward ##``, overlapping kernels on
    three streams, GPU mirrors of the stage spans."""
    out = []
    for rank, critic in ((0, False), (1, True)):
        w = TraceWriter(rank=rank, world_size=2)
        for s in range(3):
            _verl_step(w, s + 1, 1_000_000 + s * 10_000 + rank * 7, critic, sub_us=ns_offset is not None)
        out.append(w.write(d / f"verl_rank-{rank}.json{'.gz' if gz else ''}", gz=gz, ns_offset=ns_offset))
    return out


def ns_resolution_float_timestamps(d: Path) -> list[Path]:
    """The verl trace set with ns-resolution timestamps (float µs, PyTorch >= 2.3), displayTimeUnit ms,
    and per step a sub-µs op whose rounded duration is -1 µs next to a 0 µs one (which HTA's call
    graph refuses: ``ValueError: Unexpected case``)."""
    return verl_stages_backward_thread(d, ns_offset=0.375)


def integer_us_display_ns_gzip(d: Path) -> list[Path]:
    """A critic rank's trace with whole-µs timestamps in a gzip, with ``displayTimeUnit: "ns"``,
    which labels the viewer's axis and does not change the unit of ``ts``."""
    w = TraceWriter(rank=0, world_size=1, display_time_unit="ns")
    for s in range(2):
        _verl_step(w, s + 1, 5_000_000 + s * 10_000, critic=True)
    return [w.write(d / "trace_rank-0.json.gz", gz=True)]


def four_ranks_rank2_starts_late(d: Path) -> list[Path]:
    """Four ranks, three steps; in each step every rank all-reduces, rank 2 reaching the
    collective 600-900 µs after the others (a straggler), the others waiting on it."""
    out = []
    for rank in range(4):
        w = TraceWriter(rank=rank, world_size=4)
        for s in range(3):
            base = 2_000_000 + s * 5_000
            w.span(f"ProfilerStep#{s + 10}", base, 5_000)
            late = 600 + 150 * s if rank == 2 else 10 * rank
            w.linear(base + 50, reps=3 + (rank == 2))
            # a collective ends when the last rank joins: the others' kernels run long
            start = base + 1_000 + late
            w.launch(ALLREDUCE, start, (2_200 if rank != 2 else 1_000) - late // 3, stream=NCCL)
            w.launch(GEMM, base + 1_100, 300)
        out.append(w.write(d / f"rank{rank}.json"))
    return out


def queue_over_1024_launches(d: Path) -> list[Path]:
    """A rank whose CPU enqueues 1,200 launches every 2 µs while the GPU needs 40 µs for each: the
    stream's launch queue passes CUDA's 1024 limit (time blocked on a full queue)."""
    w = TraceWriter(rank=0, world_size=1)
    for s in range(2):
        base = 3_000_000 + s * 60_000
        w.span(f"ProfilerStep#{s}", base, 60_000)
        for i in range(1_200):
            w.launch(GELU, base + 10 + 2 * i, 40, launch_dur=1.0, delay=1.0)
    return [w.write(d / "rank-0.json")]


# every trace set the HTA comparison runs, by name: the writer, the operators whose frequent
# kernel sequences are compared ([operator, rank]) and the queue thresholds
TRACE_SETS: dict[str, tuple] = {
    "verl_stages_backward_thread": (verl_stages_backward_thread, [["aten::linear", 0], ["## backward ##", 0]], [1024, 8]),
    "ns_resolution_float_timestamps": (ns_resolution_float_timestamps, [["aten::linear", 1]], [1024, 8]),
    "integer_us_display_ns_gzip": (integer_us_display_ns_gzip, [["## forward ##", 0]], [1024]),
    "four_ranks_rank2_starts_late": (four_ranks_rank2_starts_late, [["aten::linear", 2]], [1024, 2]),
    "queue_over_1024_launches": (queue_over_1024_launches, [], [1024]),
}
