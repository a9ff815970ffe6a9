"""Statement fuzz worker: reads batch jobs (JSON lines) on stdin and runs each batch of generated
SQL inputs (:mod:`tests.fuzz.statements`) through ``polytrace query``'s own code, in a child
process forked for the batch:

- the child opens the query connection exactly as the command does
  (:func:`analyses.cli.query_run.sandbox_connection`: its own scratch directory, a reader lease,
  Landlock where the job says so -- the other batches test the sandbox without the kernel's
  help -- and ``catalog.connect(..., sandbox=True)`` with the fuzz's memory limit) and gives each
  input to the command's :func:`analyses.cli.query_run.execute`, whose refusals and failures become
  the one line the command prints (exit 2);
- after each input it compares every file under the fuzz root with the snapshot before it
  (writes), looks for the canary tokens in what the command printed (reads), and records any
  exception that escaped (a traceback), an error message of more than one line, and a write
  the kernel refused (a statement that got past the statement check and DuckDB's path check).

The child's events (``start`` before an input, ``done`` after) go to stdout through this
process, which forks a fresh child after one that died (recording the input as a crash) and
says ``end`` when the batch is done. This process never opens DuckDB or runs Polars itself:
a child forked from it starts clean.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

FUZZ_MEMORY = "256MB"
FUZZ_TIMEOUT_S = 1.0
SCRATCH = ".scratch"


def outcome(code: int | None, err: str) -> str:
    if code is None:
        return "traceback"
    if code == 0:
        return "ok"
    for key, name in (("read-only:", "refused"), ("Parser Error", "parse_error"), ("ran longer than", "timeout"),
                      ("more memory than", "memory_limit"), ("of spill space", "spill_limit"),
                      ("Permission Error", "duckdb_permission"), ("Permission denied", "kernel_denied"),
                      ("cannot be shown", "unshowable")):
        if key in err:
            return name
    return "error"


def _child(job: dict, env_path: Path, out: int) -> None:
    from analyses.cli.common import UsageError
    from analyses.cli.query import ENV_LANDLOCK
    from analyses.cli.query_run import execute, sandbox_connection
    from analyses.duckdb_limits import resource_limits
    from tests.fuzz.statements import Env, changes, leaks, make_input, snapshot

    env = Env.load(env_path)
    wh, root = Path(env.wh), Path(env.root)
    os.chdir(wh)  # relative paths in statements resolve against the warehouse

    def emit(obj: dict) -> None:
        os.write(out, (json.dumps(obj) + "\n").encode())

    os.environ[ENV_LANDLOCK] = "auto" if job["landlock"] else "off"
    if job.get("disarm"):  # the fuzzer's self-test: no statement check, so that its detectors must fire
        import analyses.sandbox

        analyses.sandbox._refusal = lambda con, stmt: None
    limits = resource_limits(FUZZ_MEMORY, None)
    with sandbox_connection(wh, limits, landlocked=True) as (con, spill, abi):
        emit({"ev": "abi", "abi": abi})
        before = snapshot(root, skip=wh / SCRATCH)
        for i in range(job["start"], job["start"] + job["n"]):
            emit({"ev": "start", "i": i})
            inp = make_input(job["master"], i, env)
            printed, err, code, trace = io.StringIO(), "", None, ""
            t0 = time.perf_counter()
            try:
                code = execute(con, inp.sql, job["format"], job.get("timeout_s", FUZZ_TIMEOUT_S), limits, spill, printed)
            except UsageError as exc:
                code, err = 2, f"polytrace query: error: {exc}"
            except BaseException as exc:  # noqa: BLE001 - what escapes is the finding (a Rust panic included)
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                trace = traceback.format_exc()[-3000:]
            seconds = time.perf_counter() - t0
            text = printed.getvalue() + err
            findings = []
            if trace:
                findings.append({"kind": "traceback", "detail": trace.strip().splitlines()[-1], "trace": trace})
            if "\n" in err.strip():
                findings.append({"kind": "multiline", "detail": err[:500]})
            found = leaks(text, env)
            if found:
                findings.append({"kind": "read", "detail": f"tokens {found} in the output: {text[:300]!r}"})
            after = snapshot(root, skip=wh / SCRATCH)
            diff = changes(before, after)
            if diff:
                findings.append({"kind": "write", "detail": "; ".join(diff[:10])})
                before = after  # judge the next input on its own
            kind = outcome(code if not trace else None, err)
            if kind == "kernel_denied":
                findings.append({"kind": "kernel_stop", "detail": err[:300]})
            emit({"ev": "done", "i": i, "outcome": kind, "kinds": inp.kinds, "seconds": round(seconds, 4),
                  "findings": findings})


def run_job(job: dict, env_path: Path) -> None:
    """The batch in forked children: a fresh child after one that died."""
    start, end = job["start"], job["start"] + job["n"]
    while start < end:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(r)
            code = 0
            try:
                sys.stdout = sys.stderr  # anything a library prints must not reach the protocol
                _child(dict(job, start=start, n=end - start), env_path, w)
            except BaseException:  # noqa: BLE001 - the child's last word, whatever it is
                traceback.print_exc()
                code = 70
            finally:
                os._exit(code)
        os.close(w)
        current, buf = None, b""
        with os.fdopen(r, "rb") as fh:
            for line in fh:
                buf = line
                ev = json.loads(buf)
                if ev["ev"] == "start":
                    current = ev["i"]
                elif ev["ev"] == "done":
                    current = None
                    start = ev["i"] + 1
                _emit(ev)
        _, status = os.waitpid(pid, 0)
        if current is not None:  # died within an input: record it, go on after it
            _emit({"ev": "done", "i": current, "outcome": "crash", "kinds": [], "seconds": 0,
                   "findings": [{"kind": "crash", "detail": f"the child died (wait status {status}) on this input"}]})
            start = current + 1
        elif status != 0 and start < end:
            _emit({"ev": "done", "i": start, "outcome": "crash", "kinds": [], "seconds": 0,
                   "findings": [{"kind": "crash", "detail": f"the child died (wait status {status}) between inputs"}]})
            start += 1
    _emit({"ev": "end", "batch": job["batch"]})


_proto = sys.stdout


def _emit(obj: dict) -> None:
    _proto.write(json.dumps(obj) + "\n")
    _proto.flush()


def main() -> None:
    global _proto
    _proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a library that prints must not corrupt the protocol on stdout
    env_path = Path(sys.argv[1])
    import analyses.cli.query_run  # noqa: F401 - imported once here, before the children fork
    import tests.fuzz.statements  # noqa: F401

    for line in sys.stdin:
        run_job(json.loads(line), env_path)


if __name__ == "__main__":
    main()
