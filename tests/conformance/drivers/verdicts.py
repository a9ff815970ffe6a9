"""The loop every driver shares: each job's check run with the consumer's own code, one verdict each.

Imported by the drivers from their own directory (a driver runs as a script under the consumer's
environment, so its directory is on ``sys.path``); it imports nothing from the project either.

    python <tool>_driver.py JOBS.json   ->  one JSON list of verdicts on stdout's last line
    python <tool>_driver.py --serve     ->  per line of stdin (a JSON list of jobs), one line of verdicts
                                            on the file descriptor that was stdout, until stdin closes

``--serve`` is what the suite uses (``consumers.run_driver``): one process per consumer per test run
judges every batch of files, so the interpreter, the consumer's imports and its set-up (aiperf's
tokenizer and corpus) are paid once. While it serves, whatever the consumer prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

Check = Callable[[dict[str, Any]], dict[str, Any]]


def judge(consumer: str, version: str, checks: dict[str, Check], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    verdicts = []
    for job in jobs:
        base = {"consumer": consumer, "version": version, "check": job["check"], "file": job["file"], "error": None}
        try:
            base.update(checks[job["check"]](job))
        except Exception as exc:  # the consumer's own refusal is the verdict
            base.update(ok=False, error=f"{type(exc).__name__}: {exc}", where=traceback.format_exc(limit=-2))
        verdicts.append(base)
    return verdicts


def run_jobs(consumer: str, checks: dict[str, Check]) -> int:
    """Judge the jobs of ``sys.argv[1]`` (a file), or serve batches of jobs from stdin (``--serve``)."""
    from importlib.metadata import version

    v = version(consumer)
    if sys.argv[1] != "--serve":
        with open(sys.argv[1]) as fh:
            jobs = json.load(fh)
        print(json.dumps(judge(consumer, v, checks, jobs)))
        return 0
    # the verdicts keep the real stdout to themselves; a print of the consumer's (or of a process it
    # forks) lands on stderr instead of in the middle of a verdict line
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if line.strip():
            out.write(json.dumps(judge(consumer, v, checks, json.loads(line))) + "\n")
            out.flush()
    return 0
