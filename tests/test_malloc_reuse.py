"""malloc_reuse: a batch's freed buffers are reused by the next batch instead of faulted in afresh."""

from __future__ import annotations

import os
import platform
import re
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


# `polytrace ingest` in its own process, then the number of glibc arenas its threads made
_INGEST_ARENAS = """
import ctypes, os, sys, tempfile
from analyses.cli import main
code = main(sys.argv[1:])
libc = ctypes.CDLL("libc.so.6")
libc.fdopen.restype = ctypes.c_void_p
libc.fdopen.argtypes = (ctypes.c_int, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fflush.argtypes = (ctypes.c_void_p,)
with tempfile.TemporaryFile() as f:
    fp = libc.fdopen(os.dup(f.fileno()), b"w")
    libc.malloc_info(0, fp)
    libc.fflush(fp)
    f.seek(0)
    print(code, f.read().decode().count("<heap nr="))
"""


def _ingest(tmp_path: Path, code: str | None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    args = ["ingest", str(REPO / "sample_logs" / "polytrace-math-dapo"), "--warehouse", str(tmp_path / "wh"), "-q"]
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "analyses.cli", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, **(env or {})})


def test_ingest_caps_polars_arenas_at_one_per_cpu_and_the_users_setting_wins(tmp_path: Path) -> None:
    from analyses.malloc_reuse import cpus

    # jemalloc says which settings it applied, in order, when asked to (confirm_conf)
    run = _ingest(tmp_path, None, {"_RJEM_MALLOC_CONF": "confirm_conf:true"})
    applied = re.findall(r"Set conf value: (\w+:\S+)", run.stderr)
    assert f"narenas:{cpus()}" in applied
    run = _ingest(tmp_path, None, {"_RJEM_MALLOC_CONF": "confirm_conf:true,narenas:3"})
    applied = [s for s in re.findall(r"Set conf value: (\w+:\S+)", run.stderr) if s.startswith("narenas:")]
    assert applied == [f"narenas:{cpus()}", "narenas:3"]  # the last one is jemalloc's


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's allocator only")
def test_ingest_caps_glibc_arenas_at_one_per_cpu(tmp_path: Path) -> None:
    from analyses.malloc_reuse import cpus

    code, heaps = _ingest(tmp_path, _INGEST_ARENAS).stdout.split()
    assert code == "0"
    # the ingest's threads (read-ahead, staging writer, DuckDB's and Polars' pools) share them;
    # glibc's default gave each thread its own, up to 8 per core
    assert 1 <= int(heaps) <= cpus()


def test_tuning_starts_no_process() -> None:
    """mallopt is looked up in the process itself: ctypes.util.find_library ran `ldconfig -p` in a
    subprocess, twice a command (~3-10 ms of an ingest's start)."""
    code = ("import sys\nfrom analyses.malloc_reuse import keep_freed_heap, one_arena_per_cpu\n"
            "keep_freed_heap(); one_arena_per_cpu()\nprint(sorted(m for m in ('subprocess', 'ctypes.util') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
