"""The fuzz driver: ``python -m tests.fuzz.run --inputs 100000 --procs 2`` (``make fuzz``).

Generates mutated real inputs (:mod:`tests.fuzz.corpus`) in batches, one batch = one run of
``--batch`` files through the real ingest, in ``--procs`` worker processes
(:mod:`tests.fuzz.worker`), and reports:

* crashes: an exception escaped the ingest, or the worker process died (segfault, abort, OOM);
* hangs: one input took longer than ``--input-seconds``; the worker is killed;
* peak RSS: the largest resident set of a worker while it read one input (its own baseline
  included), and every input over ``--max-rss-mib``;
* accounting violations: ``rows_ok + rows_rejected + rows_skipped != lines``, a negative count,
  a line-based file whose ``lines`` differs from its physical line count, fewer ``rejects`` rows
  than rejected lines;
* reader errors: a file failed with an exception no reader raises on purpose (a reader bug the
  per-file guard caught: the file was lost where a record should have been rejected).

An input that crashed or hung is left out and its batch run again without it. Every finding
names its input as ``MASTER:BATCH:INDEX``; ``--show`` regenerates one into a file to debug it.
Exit status 1 when anything was found.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from analyses.readers.limits import Limits
from tests.fuzz.pool import Pool, Worker

KINDS = ("crash", "hang", "rss", "accounting", "reader_error")
# small limits by default, so that inputs over them stay cheap enough for 100k inputs; the
# RSS bound is checked against the defaults too (--default-limits-every)
FUZZ_LIMITS = {"max_line_bytes": 256 << 10, "max_document_bytes": 4 << 20, "gzip_min_cap_bytes": 16 << 20,
               "gzip_max_ratio": 20}
DEFAULT_LIMITS = dataclasses.asdict(Limits())
DEFAULT_EVERY = 50  # every 50th batch runs with the default limits


@dataclass
class Summary:
    inputs: int = 0
    findings: list[dict] = field(default_factory=list)
    statuses: collections.Counter = field(default_factory=collections.Counter)
    formats: collections.Counter = field(default_factory=collections.Counter)
    peak_rss_kb: int = 0
    peak_rss_input: str = ""
    slowest_s: float = 0.0
    slowest_input: str = ""
    seconds: float = 0.0

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f["kind"] == kind)

    def text(self) -> str:
        lines = [
            f"inputs: {self.inputs} in {self.seconds:.0f} s",
            "crashes: {}  hangs: {}  rss over limit: {}  accounting violations: {}  reader errors: {}".format(
                *(self.count(k) for k in KINDS)
            ),
            f"peak RSS: {self.peak_rss_kb / 1024:.0f} MiB ({self.peak_rss_input})",
            f"slowest input: {self.slowest_s:.2f} s ({self.slowest_input})",
            "statuses: " + ", ".join(f"{k} {v}" for k, v in self.statuses.most_common()),
            "formats: " + ", ".join(f"{k} {v}" for k, v in self.formats.most_common()),
        ]
        for f in self.findings[:50]:
            lines.append(f"  {f['kind']:<12} {f['input']:<16} {' '.join(f.get('how', []))[:60]:<60} {f['detail'][:300]}")
        if len(self.findings) > 50:
            lines.append(f"  ... {len(self.findings) - 50} more")
        return "\n".join(lines)


def fuzz(
    n_inputs: int,
    procs: int = 2,
    master: int = 0,
    batch: int = 50,
    input_seconds: float = 60.0,
    max_rss_mib: int = 1024,
    default_limits_every: int = DEFAULT_EVERY,
    progress: bool = True,
    max_seconds: float | None = None,
) -> Summary:
    """Run ``n_inputs`` inputs; see the module docs."""
    t0 = time.monotonic()
    summary = Summary()
    n_batches = -(-n_inputs // batch)
    queue = collections.deque(
        {"master": master, "batch": b, "n": min(batch, n_inputs - b * batch), "exclude": [],
         "limits": DEFAULT_LIMITS if default_limits_every and b % default_limits_every == default_limits_every - 1
         else FUZZ_LIMITS}
        for b in range(n_batches)
    )
    scratch = Path(tempfile.mkdtemp(prefix="polytrace-fuzz-"))

    def lost(w: Worker, kind: str, detail: str) -> dict | None:
        """Record the input the worker died or hung on; the rest of its batch runs again without it."""
        job = w.job
        name = f"{master}:{job['batch']}:{w.current}"
        summary.findings.append({"kind": kind, "input": name, "detail": detail, "how": []})
        if progress:
            print(f"[fuzz] {kind} {name}: {detail}", flush=True)
        return dict(job, exclude=[*job["exclude"], w.current]) if w.current is not None else None

    def handle(w: Worker, ev: dict) -> None:
        if ev["ev"] != "batch":
            return
        seen = len(summary.findings)
        _record(summary, master, ev, max_rss_mib)
        if progress:
            for f in summary.findings[seen:]:
                print(f"[fuzz] {f['kind']} {f['input']} {' '.join(f['how'])}: {f['detail'][:300]}", flush=True)
        w.batches += 1
        if w.batches % 100 == 0:  # a fresh process now and then: no creeping state
            pool.recycle(w)
        else:
            pool.feed(w)

    def status(elapsed: float) -> str:
        return (f"[fuzz] {summary.inputs}/{n_inputs} inputs, {len(summary.findings)} findings, "
                f"peak RSS {summary.peak_rss_kb / 1024:.0f} MiB, {elapsed:.0f} s")

    pool = Pool(queue, lambda: Worker(scratch), lost, "worker died (exit {code}) on this input", input_seconds,
                max_seconds, t0, status if progress else None)
    try:
        pool.run(procs, handle)
    finally:
        _rmtree(scratch)
    for f in summary.findings:  # the recipe of each finding's input, for the report
        if not f.get("how") and f["input"].split(":")[2] != "None":
            from tests.fuzz.corpus import make_input

            _, b, i = (int(x) for x in f["input"].split(":"))
            f["how"] = make_input(master, b, i, FUZZ_LIMITS["max_line_bytes"]).how
    summary.seconds = time.monotonic() - t0
    return summary


def _record(summary: Summary, master: int, ev: dict, max_rss_mib: int) -> None:
    results = {int(k): v for k, v in ev["results"].items()}
    for i, r in results.items():
        summary.inputs += 1
        name = f"{master}:{ev['batch']}:{i}"
        summary.statuses[r.get("status", "?")] += 1
        summary.formats[r.get("format", "?")] += 1
        rss = r.get("rss_kb", 0)
        if rss > summary.peak_rss_kb:
            summary.peak_rss_kb, summary.peak_rss_input = rss, name
        if rss > max_rss_mib * 1024:
            summary.findings.append({"kind": "rss", "input": name, "how": r["how"],
                                     "detail": f"peak RSS {rss / 1024:.0f} MiB while reading it"})
        if r.get("seconds", 0) > summary.slowest_s:
            summary.slowest_s, summary.slowest_input = r["seconds"], name
    if ev["run_rss_kb"] > max_rss_mib * 1024:
        summary.findings.append({"kind": "rss", "input": f"{master}:{ev['batch']}:None", "how": [],
                                 "detail": f"peak RSS {ev['run_rss_kb'] / 1024:.0f} MiB in the run's commit"})
    for f in ev["findings"]:
        i = f.get("i")
        how = results.get(i, {}).get("how", []) if i is not None else []
        summary.findings.append({"kind": f["kind"], "input": f"{master}:{ev['batch']}:{i}", "how": how,
                                 "detail": f["detail"], **({"trace": f["trace"]} if "trace" in f else {})})


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="master seed")
    ap.add_argument("--batch", type=int, default=50, help="inputs per ingested run")
    ap.add_argument("--input-seconds", type=float, default=60.0, help="time budget of one input (hang above)")
    ap.add_argument("--max-rss-mib", type=int, default=1024)
    ap.add_argument("--max-seconds", type=float, help="stop starting batches after this long (report what ran)")
    ap.add_argument("--json", type=Path, help="write the findings here")
    ap.add_argument("--show", help="MASTER:BATCH:INDEX: write that input to ./fuzz-input-<name> and stop")
    args = ap.parse_args(argv)
    if args.show:
        from tests.fuzz.corpus import make_input

        m, b, i = (int(x) for x in args.show.split(":"))
        limits = DEFAULT_LIMITS if b % DEFAULT_EVERY == DEFAULT_EVERY - 1 else FUZZ_LIMITS
        inp = make_input(m, b, i, limits["max_line_bytes"])
        out = Path(f"fuzz-input-{inp.name}")
        out.write_bytes(inp.data)
        print(f"{out} ({len(inp.data)} bytes): {' '.join(inp.how)}; limits {limits}")
        return 0
    s = fuzz(args.inputs, args.procs, args.seed, args.batch, args.input_seconds, args.max_rss_mib,
             max_seconds=args.max_seconds)
    print(s.text())
    if args.json:
        args.json.write_text(json.dumps(s.findings, indent=1))
    return 1 if s.findings else 0


if __name__ == "__main__":
    sys.exit(main())
