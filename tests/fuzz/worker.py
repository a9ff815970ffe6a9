"""Fuzz worker: reads batch jobs (JSON lines) on stdin, ingests each batch of generated inputs as
one run through the real ingest (``analyses.ingest.ingest_run`` into a scratch warehouse), and
writes events (JSON lines) on stdout: ``start`` before each input (the parent's hang watchdog
times it), ``batch`` with the per-input results and findings when the run is done.

Per input it measures the peak RSS of this process while the input was read (``VmHWM``, reset
through ``/proc/self/clear_refs`` at the input's start) and checks the line accounting.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

from analyses.ingest import FileReport, ingest_run
from analyses.readers import limits
from analyses.readers.lines import count_lines
from tests.fuzz.corpus import make_input

STATUSES = {"ok", "partial", "no_data", "error", "empty", "unsupported"}
# formats whose accounting unit is a physical line of the file (others count events/records)
LINE_FORMATS = {
    "verl_console", "verl_jsonl", "metrics_jsonl", "metrics_csv", "nvidia_smi_csv", "nvidia_smi_dmon",
    "prometheus_text", "worker_times", "polytrace_packed_lengths", "polytrace_reward_timings",
    "polytrace_multiturn", "polytrace_dapo_filter", "verl_rollout_dump", "kaggle_log",
}
# errors a reader raises on purpose (UnreadableFile and the I/O family); anything else recorded
# as a file error is a reader bug that the per-file guard caught
EXPECTED_ERRORS = ("UnreadableFile", "UnicodeDecodeError", "EOFError", "OSError", "FileNotFoundError")


def _hwm_kb() -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(r"VmHWM:\s+(\d+)", fh.read()).group(1))


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:  # not permitted here: peaks then only grow (still an upper bound)
        pass


_proto = sys.stdout  # the protocol stream; main() moves everything else printed to stderr


def _emit(obj: dict) -> None:
    _proto.write(json.dumps(obj) + "\n")
    _proto.flush()


def _checks(fr: FileReport, path: Path) -> list[str]:
    out = []
    counts = (fr.lines, fr.rows_ok, fr.rows_rejected, fr.rows_skipped)
    if min(counts) < 0:
        out.append(f"negative count {counts}")
    if fr.status == "error":  # the contract: nothing of an error file lands, so it counts no rows
        if fr.rows_ok or fr.rows_rejected or fr.rows_skipped:
            out.append(f"error file with row counts: ok {fr.rows_ok}, rejected {fr.rows_rejected}, skipped {fr.rows_skipped}")
    elif fr.rows_ok + fr.rows_rejected + fr.rows_skipped != fr.lines:
        out.append(f"accounting: ok {fr.rows_ok} + rejected {fr.rows_rejected} + skipped {fr.rows_skipped} != lines {fr.lines}")
    if fr.status not in STATUSES:
        out.append(f"unknown status {fr.status!r}")
    if fr.status == "error" and (not fr.error or fr.rows_out):
        out.append(f"error status without message or with rows_out={fr.rows_out}")
    if fr.status in ("ok", "partial", "no_data") and fr.format in LINE_FORMATS:
        try:
            n = count_lines(path)
        except Exception:  # noqa: BLE001 - a file the line layer refuses has nothing to compare
            n = None
        if n is not None and n != fr.lines:
            out.append(f"lines {fr.lines} != physical lines {n}")
    return out


def run_batch(job: dict, scratch: Path) -> dict:
    master, batch, n = job["master"], job["batch"], job["n"]
    exclude = set(job.get("exclude", []))
    lim = job["limits"]
    results: dict[int, dict] = {}
    findings: list[dict] = []
    with tempfile.TemporaryDirectory(dir=scratch) as td, limits.override(**lim):
        run, wh = Path(td) / "run", Path(td) / "wh"
        paths: dict[str, tuple[int, Path]] = {}
        for i in range(n):
            if i in exclude:
                continue
            inp = make_input(master, batch, i, lim["max_line_bytes"])
            d = run / f"{i:03d}"
            d.mkdir(parents=True)
            (d / inp.name).write_bytes(inp.data)
            paths[f"{i:03d}/{inp.name}"] = (i, d / inp.name)
            results[i] = {"how": inp.how, "bytes": len(inp.data)}
        current: list[int | None] = [None]

        def progress(event: str, data: dict) -> None:
            if event == "file_start":
                i = paths[data["path"]][0]
                current[0] = i
                _reset_hwm()
                results[i]["t0"] = time.perf_counter()
                _emit({"ev": "start", "batch": batch, "i": i})
            elif event == "file_done":
                fr: FileReport = data["report"]
                i, path = paths[fr.path]
                r = results[i]
                r.update(rss_kb=_hwm_kb(), seconds=time.perf_counter() - r.pop("t0"), status=fr.status,
                         format=fr.format, error=fr.error, lines=fr.lines)
                for problem in _checks(fr, path):
                    findings.append({"kind": "accounting", "i": i, "detail": problem})
                if fr.status == "error" and not (fr.error or "").startswith(EXPECTED_ERRORS):
                    findings.append({"kind": "reader_error", "i": i, "detail": fr.error})
                current[0] = None
                _reset_hwm()

        if not paths:
            return {"ev": "batch", "batch": batch, "results": {}, "findings": [], "run_rss_kb": 0}
        try:
            rep = ingest_run(run, wh, progress=progress)
            if rep.table_rows.get("rejects", 0) < rep.rows_rejected:
                findings.append({"kind": "accounting", "i": None,
                                 "detail": f"rejects rows {rep.table_rows.get('rejects')} < rejected lines {rep.rows_rejected}"})
        except Exception as exc:  # noqa: BLE001 - an escaped exception is the finding
            findings.append({"kind": "crash", "i": current[0], "detail": f"{type(exc).__name__}: {exc}"[:300],
                             "trace": traceback.format_exc()[-2000:]})
        except BaseException as exc:  # PanicException and friends
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            findings.append({"kind": "crash", "i": current[0], "detail": f"{type(exc).__name__}: {exc}"[:300],
                             "trace": traceback.format_exc()[-2000:]})
        run_rss = _hwm_kb()
    return {"ev": "batch", "batch": batch, "results": results, "findings": findings, "run_rss_kb": run_rss}


def main() -> None:
    global _proto
    # a library that prints (DuckDB's progress bar) must not corrupt the protocol on stdout
    _proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    scratch = Path(sys.argv[1])
    scratch.mkdir(parents=True, exist_ok=True)
    for line in sys.stdin:
        _emit(run_batch(json.loads(line), scratch))


if __name__ == "__main__":
    main()
