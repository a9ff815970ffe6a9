"""Runs under vidur's own environment: load trace files with vidur's request generators.

    python vidur_driver.py JOBS.json   ->  one JSON list of verdicts on the last line of stdout

A job is ``{"check": C, "file": PATH, ...}`` with C one of
  ``trace_replay``      TraceReplayRequestGenerator(TraceRequestGeneratorConfig(trace_file=PATH[, date=...]))
                        .generate(): reads Date, Time, PromptTokenCount, CompletionTokenCount, keeps the rows of
                        the config's date (default 2023-08-21).
  ``request_length``    TraceRequestLengthGenerator(TraceRequestLengthGeneratorConfig(trace_file=PATH)), drained
                        with get_next_num_tokens(): reads num_prefill_tokens, num_decode_tokens.
  ``request_interval``  TraceRequestIntervalGenerator(TraceRequestIntervalGeneratorConfig(trace_file=PATH[,
                        start_time, end_time])), drained with get_next_inter_request_time(): reads arrival_time
                        (datetimes), keeps those strictly inside the config's window.
Every other setting is the config's default. A verdict is ``{"ok": bool, "error": "Type: message" | None, ...}``.
"""

from __future__ import annotations

import csv
import logging
import sys
from typing import Any

from verdicts import run_jobs

logging.disable(logging.CRITICAL)


def _rows(path: str) -> int:
    with open(path, newline="") as fh:
        return max(0, sum(1 for _ in csv.reader(fh)) - 1)


def trace_replay(job: dict[str, Any]) -> dict[str, Any]:
    from vidur.config import TraceRequestGeneratorConfig
    from vidur.request_generator.trace_replay_request_generator import TraceReplayRequestGenerator

    kw = {"date": job["date"]} if job.get("date") else {}
    cfg = TraceRequestGeneratorConfig(trace_file=job["file"], **kw)
    reqs = TraceReplayRequestGenerator(cfg).generate()
    rows = _rows(job["file"])
    out = {"date": cfg.date, "rows": rows, "requests": len(reqs),
           "nonpositive_prefill": sum(1 for r in reqs if r.num_prefill_tokens <= 0),
           "prefill_tokens": int(sum(r.num_prefill_tokens for r in reqs)),
           "decode_tokens": int(sum(r.num_decode_tokens for r in reqs))}
    out["ok"] = rows > 0 and len(reqs) == rows
    if not out["ok"]:
        out["error"] = f"the config's date {cfg.date} kept {len(reqs)} of {rows} rows"
    return out


def request_length(job: dict[str, Any]) -> dict[str, Any]:
    from vidur.config import TraceRequestLengthGeneratorConfig
    from vidur.request_generator.trace_request_length_generator import TraceRequestLengthGenerator

    gen = TraceRequestLengthGenerator(TraceRequestLengthGeneratorConfig(trace_file=job["file"]))
    n = prefill = decode = 0
    while True:
        p, d = gen.get_next_num_tokens()
        if p is None:
            break
        n, prefill, decode = n + 1, prefill + int(p), decode + int(d)
    rows = _rows(job["file"])
    out = {"rows": rows, "requests": n, "prefill_tokens": prefill, "decode_tokens": decode, "ok": rows > 0 and n == rows}
    if not out["ok"]:
        out["error"] = f"{n} requests from {rows} rows"
    return out


def request_interval(job: dict[str, Any]) -> dict[str, Any]:
    from vidur.config import TraceRequestIntervalGeneratorConfig
    from vidur.request_generator.trace_request_interval_generator import TraceRequestIntervalGenerator

    kw = {k: job[k] for k in ("start_time", "end_time") if job.get(k)}
    cfg = TraceRequestIntervalGeneratorConfig(trace_file=job["file"], **kw)
    gen = TraceRequestIntervalGenerator(cfg)
    intervals = []
    while True:
        x = gen.get_next_inter_request_time()
        if x is None:
            break
        intervals.append(float(x))
    rows = _rows(job["file"])
    kept = len(gen.trace_df)
    out = {"rows": rows, "kept": kept, "intervals": len(intervals), "window": [cfg.start_time, cfg.end_time],
           "span_s": float(sum(intervals)), "ok": kept > 1 and len(intervals) == kept - 1}
    if not out["ok"]:
        out["error"] = f"the window {cfg.start_time} .. {cfg.end_time} kept {kept} of {rows} rows"
    return out


CHECKS = {"trace_replay": trace_replay, "request_length": request_length, "request_interval": request_interval}


def main() -> int:
    return run_jobs("vidur", CHECKS)


if __name__ == "__main__":
    sys.exit(main())
