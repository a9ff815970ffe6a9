"""The loop both drivers share: each job's check run with the consumer's own code, one verdict each.

Imported by the drivers from their own directory (a driver runs as a script under the consumer's
environment, so its directory is on ``sys.path``); it imports nothing from the project either.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

Check = Callable[[dict[str, Any]], dict[str, Any]]


def run_jobs(consumer: str, checks: dict[str, Check]) -> int:
    """Read the jobs from ``sys.argv[1]``, print the JSON list of verdicts on stdout's last line."""
    from importlib.metadata import version

    with open(sys.argv[1]) as fh:
        jobs = json.load(fh)
    v = version(consumer)
    verdicts = []
    for job in jobs:
        base = {"consumer": consumer, "version": v, "check": job["check"], "file": job["file"], "error": None}
        try:
            base.update(checks[job["check"]](job))
        except Exception as exc:  # the consumer's own refusal is the verdict
            base.update(ok=False, error=f"{type(exc).__name__}: {exc}", where=traceback.format_exc(limit=-2))
        verdicts.append(base)
    print(json.dumps(verdicts))
    return 0
