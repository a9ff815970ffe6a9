"""A worker for the pool's own test (:mod:`tests.test_fuzz_pool`): a job ``{"id", "n", "crash_at",
"hang_at", "exclude"}`` runs inputs ``0..n-1`` but the excluded ones, announcing each; it dies at
input ``crash_at`` and sleeps at ``hang_at``, as a reader bug would."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        for i in range(job["n"]):
            if i in job["exclude"]:
                continue
            print(json.dumps({"ev": "start", "i": i}), flush=True)
            if i == job["crash_at"]:
                os._exit(3)
            if i == job["hang_at"]:
                time.sleep(600)
            print(json.dumps({"ev": "done", "i": i}), flush=True)
        print(json.dumps({"ev": "end"}), flush=True)


if __name__ == "__main__":
    main()
