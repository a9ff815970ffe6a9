"""The statement fuzz driver: ``python -m tests.fuzz.sql_run --inputs 10000 --procs 2`` (part of
``make fuzz``).

Builds a warehouse from ``sample_logs`` with canary files inside and beside it
(:func:`tests.fuzz.statements.build_env`), runs generated SQL inputs through ``polytrace
query``'s code in ``--procs`` worker processes (:mod:`tests.fuzz.sql_worker`), every other
batch under Landlock as the command runs and the others without it (the statement check and
DuckDB's own sandbox alone), and reports:

* writes: a file or directory under the fuzz root created, removed or changed (size, mtime,
  inode after each input; sha256 of every file at the end), the scratch area excepted, which
  must be empty at the end;
* reads: a canary token (file contents outside the published files, names no statement writes,
  the worker's environment, a manifest's or /etc/passwd's text) in anything the command printed;
* tracebacks: an exception that escaped the command's handling; error messages of more than
  one line; crashes (the process died) and hangs (no result after ``--input-seconds``);
* kernel stops: a write that Landlock refused, i.e. one that got past both the statement
  check and DuckDB's path check.

Every finding names its input as ``MASTER:INDEX``; ``--show`` prints it. (A write shows in the
next snapshot of every worker: with several, the input that wrote is one of those named.) Exit
status 1 when anything was found.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz.pool import Pool, Worker
from tests.fuzz.sql_worker import FUZZ_TIMEOUT_S
from tests.fuzz.statements import (
    ENV_CANARY,
    SAMPLE_LOGS,
    Env,
    build_env,
    changes,
    digests,
    kind_family,
    make_input,
)

KINDS = ("write", "read", "traceback", "multiline", "crash", "hang", "kernel_stop", "scratch_leftover")


@dataclass
class SqlSummary:
    inputs: int = 0
    statements: int = 0
    findings: list[dict] = field(default_factory=list)
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    kinds: collections.Counter = field(default_factory=collections.Counter)
    landlocked: int = 0  # inputs run under Landlock
    abi: int = 0
    slowest_s: float = 0.0
    slowest_input: str = ""
    seconds: float = 0.0

    def families(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
        for k, n in self.kinds.items():
            fam, depth = kind_family(k)
            out[fam][depth] += n
        return out

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f["kind"] == kind)

    def text(self) -> str:
        lines = [
            f"statement inputs: {self.inputs} ({self.statements} statements) in {self.seconds:.0f} s; "
            f"{self.landlocked} under Landlock (ABI {self.abi}), {self.inputs - self.landlocked} without",
            "writes outside a scratch directory: {}  reads outside the published files: {}  tracebacks: {}  "
            "multi-line errors: {}  crashes: {}  hangs: {}  kernel stops: {}  scratch leftovers: {}".format(
                *(self.count(k) for k in KINDS)),
            f"slowest input: {self.slowest_s:.2f} s ({self.slowest_input})",
            "outcomes: " + ", ".join(f"{k} {v}" for k, v in self.outcomes.most_common()),
            "statements by kind (plain/under EXPLAIN/under EXPLAIN ANALYZE): " + ", ".join(
                f"{k} {'/'.join(str(v) for v in c)}" for k, c in sorted(self.families().items())),
        ]
        for f in self.findings[:50]:
            lines.append(f"  {f['kind']:<12} {f['input']:<12} {f['detail'][:300]}")
        if len(self.findings) > 50:
            lines.append(f"  ... {len(self.findings) - 50} more")
        return "\n".join(lines)


def fuzz_statements(
    n_inputs: int,
    procs: int = 2,
    master: int = 0,
    batch: int = 200,
    runs: list[Path] | None = None,
    input_seconds: float = 60.0,
    progress: bool = True,
    max_seconds: float | None = None,
    timeout_s: float = FUZZ_TIMEOUT_S,
    disarm: bool = False,
    env: Env | None = None,
) -> SqlSummary:
    """Run ``n_inputs`` inputs; see the module docs. ``env``: an environment already built (by
    :func:`tests.fuzz.statements.build_env`; kept), else one of ``runs`` (default: every
    sample_logs run) in a temporary directory. ``disarm`` turns the statement check off (the
    fuzzer's self-test: it must then find writes, and Landlock must stop them)."""
    t0 = time.monotonic()
    s = SqlSummary()
    own = env is None
    root = Path(tempfile.mkdtemp(prefix="polytrace-sqlfuzz-")) if env is None else Path(env.root)
    try:
        if env is None:
            env = build_env(root, runs or sorted(p for p in SAMPLE_LOGS.iterdir() if p.is_dir()))
        env_path = root / "env.json"
        env.save(env_path)
        scratch = Path(env.wh) / ".scratch"
        sums = digests(root, skip=scratch)
        jobs = [{"master": master, "batch": b, "start": b * batch, "n": min(batch, n_inputs - b * batch),
                 "landlock": b % 2 == 0, "format": ("csv", "table", "json")[b % 3], "timeout_s": timeout_s,
                 "disarm": disarm}
                for b in range(-(-n_inputs // batch))]
        _drive(s, env, env_path, jobs, n_inputs, master, procs, input_seconds, progress, max_seconds, t0)
        diff = changes(sums, digests(root, skip=scratch))
        if diff:
            s.findings.append({"kind": "write", "input": "(all)", "detail": "sha256: " + "; ".join(diff[:10])})
        left = sorted(str(p) for p in scratch.rglob("*"))
        if left:
            s.findings.append({"kind": "scratch_leftover", "input": "(all)", "detail": "; ".join(left[:10])})
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    s.seconds = time.monotonic() - t0
    return s


def _drive(s: SqlSummary, env: Env, env_path: Path, jobs: list[dict], n_inputs: int, master: int, procs: int,
           input_seconds: float, progress: bool, max_seconds: float | None, t0: float) -> None:
    """Feed ``jobs`` to ``procs`` workers, recording their events in ``s``; a worker that hangs
    on an input is killed and the rest of its batch goes to a new one."""
    def lost(w: Worker, kind: str, detail: str) -> dict | None:
        """Record the input the worker died or hung on; the rest of its batch runs again."""
        job = w.job
        if w.current is None:
            return job
        s.findings.append({"kind": kind, "input": f"{master}:{w.current}", "detail": detail})
        if progress:
            print(f"[sqlfuzz] {kind} {master}:{w.current}: {detail}", flush=True)
        rest = job["start"] + job["n"] - (w.current + 1)
        return dict(job, start=w.current + 1, n=rest) if rest > 0 else None

    def handle(w: Worker, ev: dict) -> None:
        if ev["ev"] == "abi":
            s.abi = max(s.abi, ev["abi"])
        elif ev["ev"] == "done":
            w.current = None
            _record(s, master, ev, w.job)
            if progress:
                for f in ev["findings"]:
                    print(f"[sqlfuzz] {f['kind']} {master}:{ev['i']}: {f['detail'][:300]}", flush=True)
        elif ev["ev"] == "end":
            pool.feed(w)

    def status(elapsed: float) -> str:
        return f"[sqlfuzz] {s.inputs}/{n_inputs} inputs, {len(s.findings)} findings, {elapsed:.0f} s"

    pool = Pool(collections.deque(jobs), lambda: Worker(env_path, "tests.fuzz.sql_worker", {ENV_CANARY: env.env_token}),
                lost, "the worker died (exit {code})", input_seconds, max_seconds, t0, status if progress else None)
    pool.run(procs, handle)


def _record(s: SqlSummary, master: int, ev: dict, job: dict | None) -> None:
    s.inputs += 1
    s.statements += len(ev["kinds"])
    if job is not None and job["landlock"]:
        s.landlocked += 1
    s.outcomes[ev["outcome"]] += 1
    s.kinds.update(ev["kinds"])
    if ev["seconds"] > s.slowest_s:
        s.slowest_s, s.slowest_input = ev["seconds"], f"{master}:{ev['i']}"
    for f in ev["findings"]:
        s.findings.append(dict(f, input=f"{master}:{ev['i']}"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=10_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="master seed")
    ap.add_argument("--batch", type=int, default=200, help="inputs per forked child (one query connection)")
    ap.add_argument("--input-seconds", type=float, default=60.0, help="time budget of one input (hang above)")
    ap.add_argument("--max-seconds", type=float, help="stop starting batches after this long (report what ran)")
    ap.add_argument("--timeout", type=float, default=FUZZ_TIMEOUT_S, help="polytrace query --timeout of each input")
    ap.add_argument("--json", type=Path, help="write the findings here")
    ap.add_argument("--show", help="MASTER:INDEX: print that input (for a fresh environment) and stop")
    args = ap.parse_args(argv)
    if args.show:
        m, i = (int(x) for x in args.show.split(":"))
        with tempfile.TemporaryDirectory() as td:
            env = build_env(Path(td), sorted(p for p in SAMPLE_LOGS.iterdir() if p.is_dir()))
            inp = make_input(m, i, env)
        print(f"-- {', '.join(inp.kinds)} (paths are those of a fresh fuzz environment)\n{inp.sql}")
        return 0
    s = fuzz_statements(args.inputs, args.procs, args.seed, args.batch, input_seconds=args.input_seconds,
                        max_seconds=args.max_seconds, timeout_s=args.timeout)
    print(s.text())
    if args.json:
        args.json.write_text(json.dumps(s.findings, indent=1))
    return 1 if s.findings else 0


if __name__ == "__main__":
    sys.exit(main())
