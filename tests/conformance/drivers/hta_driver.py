"""Runs under HolisticTraceAnalysis's own environment: every HTA analysis PolyTrace mirrors, on a trace set.

    python hta_driver.py JOBS.json   ->  one JSON list of verdicts on the last line of stdout

A job is ``{"check": C, "file": TRACE_DIR, ...}`` with C one of
  ``analyses``  TraceAnalysis(trace_dir=TRACE_DIR) and, on every rank: get_temporal_breakdown,
                get_idle_time_breakdown, get_gpu_kernel_breakdown, get_comm_comp_overlap,
                get_cuda_kernel_launch_stats, get_queue_length_summary, get_time_spent_blocked_on_full_queue
                (for each ``max_queue_length`` of the job, default [1024]), get_memory_bw_summary,
                get_gpu_user_annotation_breakdown (GPU and CPU), get_potential_stragglers, and
                get_frequent_cuda_kernel_sequences for each ``sequences`` entry [operator, rank].
                All with visualize=False and the defaults otherwise.
  ``diff``      TraceDiff.compare_traces(TRACE_DIR, job["test"], control_rank, test_rank,
                control_iteration, test_iteration) with the job's values (None: HTA's default).
Each analysis's rows are returned as lists of records (``{"error": ...}`` when HTA raised), with its
seconds. Imports nothing from the project.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
import warnings
from typing import Any

from verdicts import run_jobs

logging.disable(logging.CRITICAL)
warnings.filterwarnings("ignore")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


def _records(df: Any) -> list[dict[str, Any]]:
    if df is None:
        return []
    import pandas as pd

    if isinstance(df.columns, pd.MultiIndex):  # describe() tables
        df = df.copy()
        df.columns = ["_".join(str(c) for c in col) for col in df.columns]
    if not isinstance(df.index, pd.RangeIndex):
        df = df.reset_index()
    return [{str(k): _clean(v) for k, v in r.items()} for r in df.to_dict("records")]


def _timed(out: dict[str, Any], key: str, fn: Any) -> None:
    t0 = time.perf_counter()
    try:
        out[key] = fn()
    except Exception as exc:  # HTA's own failure is part of the answer
        out[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    out.setdefault("seconds", {})[key] = round(time.perf_counter() - t0, 3)


def analyses(job: dict[str, Any]) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    a = TraceAnalysis(trace_dir=job["file"])
    out["seconds"] = {"parse": round(time.perf_counter() - t0, 3)}
    ranks = sorted(a.t.traces)
    out["ranks"] = ranks
    _timed(out, "temporal", lambda: _records(a.get_temporal_breakdown(visualize=False)))
    _timed(out, "idle", lambda: _records(a.get_idle_time_breakdown(ranks=ranks, visualize=False)[0]))

    def kernels() -> dict[str, Any]:
        types, top = a.get_gpu_kernel_breakdown(visualize=False)
        return {"types": _records(types), "top": _records(top)}

    _timed(out, "kernels", kernels)
    _timed(out, "overlap", lambda: _records(a.get_comm_comp_overlap(visualize=False)))
    _timed(out, "launch", lambda: {str(r): _records(d) for r, d in
                                   a.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False).items()})
    _timed(out, "queue", lambda: _records(a.get_queue_length_summary(ranks=ranks)))

    def blocked() -> dict[str, Any]:
        series = a.get_queue_length_time_series(ranks=ranks)
        return {str(m): _records(a.get_time_spent_blocked_on_full_queue(series, max_queue_length=m))
                for m in job.get("max_queue_length", [1024])}

    _timed(out, "blocked", blocked)
    _timed(out, "memory_bw", lambda: _records(a.get_memory_bw_summary(ranks=ranks)))
    _timed(out, "annotations_gpu", lambda: _records(a.get_gpu_user_annotation_breakdown(visualize=False)))
    _timed(out, "annotations_cpu", lambda: _records(
        a.get_gpu_user_annotation_breakdown(use_gpu_annotation=False, visualize=False)))
    _timed(out, "stragglers", lambda: [int(r) for r in a.get_potential_stragglers()])

    def sequences() -> list[dict[str, Any]]:
        res = []
        with tempfile.TemporaryDirectory() as tmp:
            for op, rank in job.get("sequences", []):
                t1 = time.perf_counter()
                try:
                    rows = _records(a.get_frequent_cuda_kernel_sequences(op, tmp, rank=rank, visualize=False))
                except Exception as exc:
                    rows = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                res.append({"operator": op, "rank": rank, "rows": rows,
                            "seconds": round(time.perf_counter() - t1, 3)})
        return res

    _timed(out, "sequences", sequences)
    out["ok"] = True
    return out


def diff(job: dict[str, Any]) -> dict[str, Any]:
    from hta.trace_diff import TraceDiff

    df = TraceDiff.compare_traces(job["file"], job["test"], control_rank=job.get("control_rank"),
                                  test_rank=job.get("test_rank"), control_iteration=job.get("control_iteration"),
                                  test_iteration=job.get("test_iteration"))
    df.columns = [c.replace("Control_", "control_").replace("Test_", "test_") for c in df.columns]
    df.index.name = "name"
    return {"ok": True, "rows": _records(df)}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(run_jobs("HolisticTraceAnalysis", {"analyses": analyses, "diff": diff}))
