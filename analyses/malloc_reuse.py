"""Keep freed heap memory in a one-shot command instead of handing it back to the kernel.

An ingest reads its input in batches of up to 64 MB (the bytes of a group of step files, their
lines, the decoded columns), one batch after another on two threads. glibc's allocator serves
a block of more than 128 KB to 32 MB with ``mmap`` (or from a thread's heap that it trims and
deletes as soon as its top is free), so every batch's buffers were fresh pages: the kernel
zeroes and maps each on first touch, ~0.5 M page faults per GB of v2 JSONL (1 GB read, 2 GB
of faults), about 1 s of system CPU of the 1 GB ingest's 11 s on the 2-core VM, where a first
touch costs 0.6-12 us. Serving those blocks from the heap and trimming it only past
:data:`TRIM_BYTES` lets the next batch reuse the pages the last one freed (0.18-0.24 M faults,
system CPU 1.1-1.3 s instead of 2.0-2.1 s; peak RSS within the noise).

Freed memory is reused only by the allocator, and the arena, that freed it: glibc gives each new
thread an arena of its own (up to 8 per core) and Polars' jemalloc 4 per core, so the buffers a
read-ahead thread, the staging writer and Polars' and DuckDB's pools freed were fresh pages again
for the next thread. :func:`one_arena_per_cpu` caps both at one arena per CPU the process may run
on (a single arena would serialize a many-core machine's threads). On the 2-core VM an ingest of
315 packed step files took ~31,300 page faults instead of ~33,200 (median of 9, side by side).

Process-wide and for the process's lifetime, so only a command that ends when its work does
(``polytrace ingest``) sets it; a long-lived process (Dagster, a notebook) keeps the defaults.
The glibc part is a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

MMAP_BYTES = 64 << 20  # blocks up to this size come from the heap (glibc's default is dynamic, 128 KB-32 MB)
TRIM_BYTES = 256 << 20  # free memory kept at the top of a heap before it is handed back

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

# read by the jemalloc Polars links when Polars is imported (Polars puts its own settings before it)
POLARS_MALLOC_CONF = "_RJEM_MALLOC_CONF"


@functools.cache
def _mallopt() -> ctypes._CFuncPtr | None:
    # the C library the interpreter runs on is in the process already: its symbols are looked up
    # there (ctypes.util.find_library ran `ldconfig -p` in a subprocess, twice a command: ~3-10 ms)
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_heap() -> bool:
    """Tune glibc's allocator as the module docs say; False when it is not glibc's."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def one_arena_per_cpu() -> tuple[bool, bool]:
    """Cap glibc's arenas and (unless Polars is imported already: its allocator has read its
    settings then) Polars' jemalloc arenas at one per CPU; whether each was set. Before the
    process starts threads: an arena made before stays. A ``_RJEM_MALLOC_CONF`` the user set
    still wins (it comes after)."""
    n = cpus()
    mallopt = _mallopt()
    glibc = mallopt is not None and bool(mallopt(_M_ARENA_MAX, n))
    if "polars" in sys.modules:
        return glibc, False
    user = os.environ.get(POLARS_MALLOC_CONF)
    os.environ[POLARS_MALLOC_CONF] = f"narenas:{n}" + (f",{user}" if user else "")
    return glibc, True
