"""malloc_reuse: a batch's freed buffers are reused by the next batch instead of faulted in afresh."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# a read-ahead thread's batches: 8 buffers of 4 MB (a group of step files' bytes), freed after
# each batch; prints the page faults of 10 batches after the first
_PROBE = """
import resource, sys
from concurrent.futures import ThreadPoolExecutor
from analyses.malloc_reuse import keep_freed_heap
if sys.argv[1] == "on":
    assert keep_freed_heap()
def batch():
    bufs = [b"x" * (4 << 20) for _ in range(8)]
    del bufs
pool = ThreadPoolExecutor(1)
pool.submit(batch).result()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    pool.submit(batch).result()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], cwd=REPO, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's allocator only")
def test_batches_reuse_freed_pages_on_a_worker_thread() -> None:
    default, kept = _faults("off"), _faults("on")
    # glibc's default: each batch's 32 MB are fresh pages (~8,000 faults a batch)
    assert default > 10 * 4_000
    assert kept < default / 20
