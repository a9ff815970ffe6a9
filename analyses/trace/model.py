"""One rank's trace as the warehouse stores it: every GPU event and every CPU-side event, each with
its ProfilerStep, RL stage, place in HolisticTraceAnalysis's analysis window and call stack.

The reader (:mod:`analyses.readers.kineto`) streams a trace into two frames, ``gpu`` (events with a
``stream`` and a ``correlation``: kernels, memcpy, memset, CUDA syncs) and ``ops`` (every other
complete event: cpu_op, user_annotation, cuda_runtime, python_function, gpu_user_annotation, ...),
and :func:`build` computes, with HTA 0.5.0's rules (``hta/common/trace.py``,
``hta/common/trace_call_stack.py``, ``hta/common/trace_call_graph.py``):

* **launch** of a GPU event: the CPU-side event with the same ``correlation`` (the last in file
  order when several share it, as HTA's ``transform_correlation_to_index``);
* **step**: an op's ProfilerStep is the CPU ``ProfilerStep#N`` window holding its start; a GPU
  event's is its launch's (``step_by_launch``), else the window holding its own start (HTA leaves
  such events without an iteration; ``rank_times`` has counted them in their window since it exists);
* **HTA's window** (``in_hta_window``, ``_filter_irrelevant_gpu_kernels``): when the trace holds two or
  more distinct ProfilerStep names, CPU-side events that start before the last one starts, and the
  GPU events those launched; otherwise everything. HTA's analyses run on that window, so the views
  that mirror them do too;
* **stage** (:mod:`analyses.trace.stages`): of an op, at its start; of a GPU event, at its launch
  (else its own start): a kernel launched during ``update_actor`` belongs to it even when it runs
  later;
* **call stack** (per pid/tid lane, HTA's ``CallStackGraph``): ``depth`` (0 = top level), ``pos``
  (the op's place in its lane's start order, unique within the rank) and ``sub_end`` (its
  descendants are the ops at ``pos < p < sub_end``). As HTA's ``CallGraph``, the backward
  (autograd) thread's top-level ops hang under the main thread's ``## backward ##`` annotation
  holding them (else its ProfilerStep); ``num_kernels``/``kernel_dur_sum_us`` count the window's
  kernels launched in the subtree, which is what HTA's frequent kernel sequences start from.

Timestamps are the trace's microseconds (HTA's rounding already applied by the reader).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from analyses.trace.stages import stage_at, stage_of_name, stage_timeline

if TYPE_CHECKING:  # numpy is imported where it is used: detection never needs it
    import numpy as np

STEP_RE = r"^ProfilerStep\s*#\s*(\d+)$"
# HTA's KernelType names, by HTA's get_kernel_type rules (hta/utils/utils.py)
COMM_RE = r"^nccl.*Kernel"
MEMORY_RE = r"^(Memcpy|Memset|dma)"
NOT_COMPUTE_RE = r"^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)"
KERNEL_TYPES = ("COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER")

GPU_SCHEMA = {"ev": pl.Int64, "ts": pl.Float64, "dur": pl.Float64, "correlation": pl.Int64, "stream": pl.Int64,
              "device": pl.Int64, "cat": pl.String, "name": pl.String, "pid": pl.String, "tid": pl.String,
              "bytes": pl.Int64, "memory_bw_gbps": pl.Float64}
OPS_SCHEMA = {"ev": pl.Int64, "ts": pl.Float64, "dur": pl.Float64, "correlation": pl.Int64, "cat": pl.String,
              "name": pl.String, "pid": pl.String, "tid": pl.String}


def kernel_type(name: pl.Expr) -> pl.Expr:
    """HTA's kernel type of a GPU event name (``get_kernel_type``)."""
    name = name.cast(pl.String)
    return (
        pl.when(name.str.contains(COMM_RE)).then(pl.lit("COMMUNICATION"))
        .when(name.str.contains(MEMORY_RE)).then(pl.lit("MEMORY"))
        .when(~name.str.contains(NOT_COMPUTE_RE)).then(pl.lit("COMPUTATION"))
        .otherwise(pl.lit("OTHER"))
    )


def _s(col: str) -> pl.Expr:
    """A text column as String: the reader keeps them Categorical (a few thousand names over millions
    of events), the tests as String."""
    return pl.col(col).cast(pl.String)


@dataclass
class RankTrace:
    """What one rank's trace becomes: rows of ``trace_kernels`` and ``trace_ops`` and the facts of
    its ``trace_ranks`` row."""

    kernels: pl.DataFrame
    ops: pl.DataFrame
    facts: dict


def profiler_steps(ops: pl.DataFrame) -> pl.DataFrame:
    """The CPU-side ``ProfilerStep#N`` windows (step, ts, dur); newer traces mirror them on the GPU
    timeline (gpu_user_annotation), which is not a second window."""
    return (
        ops.filter(~_s("cat").str.starts_with("gpu_") & _s("name").str.contains(STEP_RE))
        .select(step=_s("name").str.extract(STEP_RE, 1).cast(pl.Int64, strict=False), ts="ts", dur="dur")
        .filter(pl.col("step").is_not_null())
    )


def step_at(frame: pl.DataFrame, at: str, steps: pl.DataFrame, out: str = "step") -> pl.DataFrame:
    """``frame`` with column ``out``: the step whose window ``[ts, ts + dur)`` holds column ``at``
    (the latest-starting such window). Vectorized, without reordering ``frame``."""
    import numpy as np

    if steps.height == 0 or frame.height == 0:
        return frame.with_columns(pl.lit(None, pl.Int32).alias(out))
    win = steps.sort("ts")
    t = frame[at].cast(pl.Float64).fill_null(np.nan).to_numpy()
    idx = np.searchsorted(win["ts"].to_numpy(), t, side="right") - 1
    ends = (win["ts"] + win["dur"]).to_numpy()
    ok = (idx >= 0) & (t < ends[np.maximum(idx, 0)])  # NaN compares False
    picked = win["step"].cast(pl.Int32, strict=False).gather(pl.Series(np.where(ok, idx, 0)))
    return frame.with_columns(pl.when(pl.Series(ok)).then(picked).otherwise(None).alias(out))


def hta_window_bounds(ops: pl.DataFrame) -> tuple[float | None, float | None]:
    """(start, end) of the last ProfilerStep as HTA finds it: over every CPU-side event whose name
    contains ``ProfilerStep`` (a GPU-side mirror included), when there are two or more such names;
    else (None, None): HTA does not filter."""
    ps = ops.filter(_s("name").str.contains("ProfilerStep", literal=True))
    if ps["name"].n_unique() < 2:
        return None, None
    return float(ps["ts"].max()), float((ps["ts"] + ps["dur"]).max())


def _launches(gpu: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """``gpu`` with its launch (``launch_*``; null when the trace has no CPU-side event of its
    correlation)."""
    la = (
        ops.filter(pl.col("correlation") >= 0)
        .sort("ev")
        .group_by("correlation", maintain_order=True)
        .last()
        .select("correlation", launch_ev="ev", launch_name="name", launch_ts_us="ts", launch_dur_us="dur")
    )
    return gpu.join(la, on="correlation", how="left")


def _boundary_order(lane: np.ndarray, ts: np.ndarray, dur: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order of the 2n open/close boundaries of n intervals, per lane, as HTA's ``sort_events``
    orders them: by time; at one time, closes before opens (touching intervals are siblings),
    opens longest first, closes shortest first; a zero-length event sits inside whatever opens at
    its time, else before what closes then (HTA's comparator is not transitive when both happen
    at once; then it goes after). Returns (interval of each boundary, +1 open / -1 close)."""
    import numpy as np

    n = ts.size
    zero = dur == 0
    # where a zero-length event sits depends on whether a non-zero interval opens at its time on
    # its lane: looked up per lane (threads: few), for the zero-length events only
    after_opens = np.zeros(n, dtype=bool)
    for ln in np.unique(lane[zero]):
        on = lane == ln
        opens_t = np.unique(ts[on & ~zero])
        z = np.flatnonzero(on & zero)
        after_opens[z] = np.isin(ts[z], opens_t)
    # class at one (lane, time): zero-length events before non-zero closes (0 open, 1 close), the
    # closes (2), the opens (3), zero-length events after non-zero opens (4 open, 5 close)
    cls = np.concatenate([np.where(zero, np.where(after_opens, 4, 0), 3),
                          np.where(zero, np.where(after_opens, 5, 1), 2)]).astype(np.int8)
    del after_opens
    # within a class: opens longest first then by index; closes shortest first then by index descending
    k1 = np.concatenate([-dur, dur])
    k2 = np.concatenate([idx, -idx])
    order = np.lexsort((k2, k1, cls, np.concatenate([ts, ts + dur]), np.concatenate([lane, lane])))
    del k1, k2, cls
    return (order % n).astype(np.int32), np.where(order < n, 1, -1).astype(np.int8)


def call_stack(ops: pl.DataFrame) -> pl.DataFrame:
    """``ops`` (one rank) with ``depth``, ``pos``, ``sub_end`` and ``top_pos`` (the pos of its
    top-level ancestor) per pid/tid lane; lanes HTA takes for GPU lanes (pid or tid 0) get nulls.

    Vectorized per lane (threads: a few): the boundaries are sorted once (:func:`_boundary_order`);
    the depth at an open is the running count of open intervals (HTA's stack pops whatever is on
    top, so this is its depth even for intervals that overlap without nesting), and an interval's
    descendants are the opens between its own open and close. ``pos`` is unique within the rank
    (lanes one after the other). Works on numpy columns and adds four: a trace holds millions of
    ops, so the frame is neither filtered, joined nor reordered, and the scratch is one lane's."""
    import numpy as np

    gpu_lane = ((ops["pid"] == "0") | (ops["tid"] == "0")).fill_null(False).to_numpy()
    rows = np.flatnonzero(~gpu_lane)
    if rows.size == 0:
        null = pl.lit(None, pl.Int32)
        return ops.with_columns(depth=null, pos=null, sub_end=null, top_pos=null)
    lane = ops.select(pl.struct("pid", "tid").rank("dense").cast(pl.Int32))[:, 0].to_numpy()[rows]
    rows = rows[np.argsort(lane, kind="stable")]  # lane-major
    lane.sort()
    bounds = np.flatnonzero(np.diff(lane)) + 1
    del lane
    ts, dur, ev = ops["ts"].to_numpy(), ops["dur"].to_numpy(), ops["ev"].to_numpy()
    # int32: a rank's trace holds far fewer than 2**31 events, and these columns are per event
    cols = {c: np.full(ops.height, -1, dtype=np.int32) for c in ("depth", "pos", "sub_end", "top_pos")}
    offset = 0
    for r in np.split(rows, bounds):
        n = r.size
        iv, delta = _boundary_order(np.zeros(n, dtype=np.int8), ts[r], dur[r], ev[r])
        opens = delta == 1
        running = np.cumsum(delta, dtype=np.int32)
        pos = np.empty(n, dtype=np.int32)
        depth = np.empty(n, dtype=np.int32)
        pos[iv[opens]] = np.arange(n, dtype=np.int32)  # place of each open among the lane's opens
        depth[iv[opens]] = running[opens] - 1  # open intervals before it
        sub_end = np.empty(n, dtype=np.int32)
        sub_end[iv[~opens]] = np.cumsum(opens, dtype=np.int32)[~opens]  # descendants: opens before its close
        del iv, delta, opens, running
        # top-level ancestor: the last depth-0 open at or before each open
        d_by_pos = np.empty(n, dtype=np.int32)
        d_by_pos[pos] = depth
        top = np.maximum.accumulate(np.where(d_by_pos == 0, np.arange(n, dtype=np.int32), 0))[pos]
        for c, a in (("depth", depth), ("pos", pos + offset), ("sub_end", sub_end + offset), ("top_pos", top + offset)):
            cols[c][r] = a
        offset += n
    if rows.size == ops.height:
        return ops.with_columns(**{k: pl.Series(v) for k, v in cols.items()})
    mask = pl.Series(~gpu_lane)
    return ops.with_columns(**{k: pl.when(mask).then(pl.Series(v)) for k, v in cols.items()})


def link_backward(ops: pl.DataFrame) -> pl.DataFrame:
    """HTA's ``_link_main_and_bwd_stacks``: when exactly one lane holds ``ProfilerStep#`` (main) and
    one other holds ``autograd::`` ops (backward), each backward top-level op hangs under the first
    (file order) main-lane ``## backward ##`` annotation holding it in time (else ProfilerStep):
    adds ``link_pos`` (that annotation's pos, on every op of the linked subtree) and deepens them."""
    import numpy as np

    o = ops.with_columns(link_pos=pl.lit(None, pl.Int32))
    lanes = (
        o.filter(pl.col("pos").is_not_null())
        .group_by("pid", "tid")
        .agg(main=_s("name").str.starts_with("ProfilerStep#").any(),
             bwd=_s("name").str.contains("autograd::", literal=True).any())
        .with_columns(label=pl.when("main").then(pl.lit("main")).when("bwd").then(pl.lit("bwd")))
    )
    mains, bwds = lanes.filter(pl.col("label") == "main"), lanes.filter(pl.col("label") == "bwd")
    if mains.height != 1 or bwds.height != 1:
        return o
    mp, mt = mains["pid"][0], mains["tid"][0]
    bp, bt = bwds["pid"][0], bwds["tid"][0]
    main = o.filter((pl.col("pid") == mp) & (pl.col("tid") == mt))
    parents = main.filter(_s("name").str.starts_with("## backward ##"))
    if parents.height == 0:
        parents = main.filter(_s("name").str.starts_with("ProfilerStep#"))
    parents = parents.sort("ev")
    is_bwd = (pl.col("pid") == bp) & (pl.col("tid") == bt)
    tops = o.filter(is_bwd & (pl.col("depth") == 0)).select("pos", "ts", end=pl.col("ts") + pl.col("dur"))
    if tops.height == 0:
        return o
    link = np.full(tops.height, -1, dtype=np.int32)
    link_depth = np.zeros(tops.height, dtype=np.int32)
    t_ts, t_end = tops["ts"].to_numpy(), tops["end"].to_numpy()
    for p in parents.iter_rows(named=True):  # one per step: few
        hit = (link < 0) & (t_ts >= p["ts"]) & (t_end <= p["ts"] + p["dur"])
        link[hit] = p["pos"]
        link_depth[hit] = p["depth"]
    # each op of the backward lane takes its top-level op's link (tops are in pos order)
    tp = tops["pos"].to_numpy()
    top = o["top_pos"].fill_null(-1).to_numpy()
    i = np.clip(np.searchsorted(tp, top), 0, tp.size - 1)
    bwd = o.select(is_bwd)[:, 0].fill_null(False).to_numpy()
    hit = bwd & (tp[i] == top) & (link[i] >= 0)
    h = pl.Series(hit)
    return o.with_columns(link_pos=pl.when(h).then(pl.Series(link[i])),
                          depth=pl.col("depth") + pl.when(h).then(pl.Series(link_depth[i] + 1)).otherwise(0))


def _subtree_sums(ops: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """``num_kernels`` and ``kernel_dur_sum_us`` of each op: the window's GPU kernels (stream > 0,
    as HTA's get_cpu_gpu_correlation) whose launch sits in the op's subtree, directly or through
    the backward link."""
    import numpy as np

    k = kernels.filter(pl.col("in_hta_window") & (pl.col("stream") > 0) & pl.col("launch_pos").is_not_null())
    counts = np.zeros(ops.height, dtype=np.int32)
    durs = np.zeros(ops.height, dtype=np.float64)
    lo = ops["pos"].fill_null(-1).to_numpy()
    hi = ops["sub_end"].fill_null(-1).to_numpy()
    for col in ("launch_pos", "link_pos"):
        a = k.filter(pl.col(col).is_not_null()).sort(col)
        if a.height == 0:
            continue
        p = a[col].to_numpy()
        cd = np.concatenate([[0.0], np.cumsum(a["dur_us"].to_numpy())])
        i0, i1 = np.searchsorted(p, lo, "left"), np.searchsorted(p, hi, "left")
        counts += i1 - i0
        durs += cd[i1] - cd[i0]
    has = ops["pos"].is_not_null().to_numpy()
    return ops.with_columns(num_kernels=pl.Series(np.where(has, counts, 0)),
                            kernel_dur_sum_us=pl.Series(np.where(has, durs, 0.0)))


def build(gpu: pl.DataFrame, ops: pl.DataFrame, include_last_step: bool = False) -> RankTrace:
    """Everything one rank's trace contributes (see the module docstring)."""
    steps = profiler_steps(ops)
    last_start, last_end = hta_window_bounds(ops)
    if last_start is None:
        op_win = pl.lit(True)
    else:
        op_win = pl.col("ts") <= last_end if include_last_step else pl.col("ts") < last_start

    # --- stages and steps of the CPU side
    spans = ops.filter(pl.col("cat") == "user_annotation").with_columns(stage=stage_of_name(pl.col("name")))
    timeline = stage_timeline(spans.filter(pl.col("stage").is_not_null())
                              .select("ts", end=pl.col("ts") + pl.col("dur"), stage="stage"))
    o = ops.with_columns(in_hta_window=op_win)
    o = step_at(o, "ts", steps)
    o = stage_at(o, "ts", timeline)
    o = link_backward(call_stack(o)).drop("top_pos")

    # --- GPU side: launch, window, step, stage
    window_corr = o.filter(pl.col("in_hta_window") & (pl.col("correlation") >= 0))["correlation"].unique()
    k = _launches(gpu, o).with_columns(
        kernel_type=kernel_type(pl.col("name")),
        in_hta_window=pl.col("correlation").is_in(window_corr.implode()) if last_start is not None else pl.lit(True),
    )
    k = k.join(o.select(launch_ev="ev", launch_pid="pid", launch_tid="tid", launch_pos="pos",
                        link_pos="link_pos", _launch_step="step"), on="launch_ev", how="left")
    k = step_at(k, "ts", steps, out="_own_step")
    k = k.with_columns(step_by_launch=pl.col("_launch_step").is_not_null(),
                       step=pl.coalesce("_launch_step", "_own_step")).drop("_launch_step", "_own_step")
    k = k.with_columns(_at=pl.coalesce("launch_ts_us", "ts"))
    k = stage_at(k, "_at", timeline).drop("_at")
    k = k.rename({"ts": "ts_us", "dur": "dur_us"})
    o = _subtree_sums(o, k).rename({"ts": "ts_us", "dur": "dur_us"})

    win_ts = pl.concat([o.filter("in_hta_window")["ts_us"], k.filter("in_hta_window")["ts_us"]])
    facts = {
        "n_gpu_events": k.height,
        "n_ops": o.height,
        "n_steps": steps.height,
        "first_ts_us": _min(pl.concat([o["ts_us"], k["ts_us"]])),
        "last_end_us": _max(pl.concat([o["ts_us"] + o["dur_us"], k["ts_us"] + k["dur_us"]])),
        "hta_window_end_us": last_start,
        "hta_span_us": (_max(win_ts) - _min(win_ts)) if win_ts.len() else None,
        "stage_spans": spans.filter(pl.col("stage").is_not_null()).height,
    }
    return RankTrace(kernels=k, ops=o, facts=facts)


def _min(s: pl.Series) -> float | None:
    v = s.min()
    return None if v is None else float(v)


def _max(s: pl.Series) -> float | None:
    v = s.max()
    return None if v is None else float(v)
