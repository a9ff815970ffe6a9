"""Bounded memory and spill space for the DuckDB connections that read the warehouse.

- ``memory_limit``: ``$POLYTRACE_MEMORY_LIMIT``, else the lesser of 3 GB and a quarter of the
  memory this process may use (the machine's RAM, or its cgroup's limit when that is lower).
  DuckDB's own default is 80 % of RAM, and an unbounded ``list()`` over the large tables grew
  past 5 GiB. 3 GB, not 4: the bound is for the whole command, and the Python side (frames, the
  report's figures) adds up to ~0.6 GB (the report over 51 M samples peaked at 4.4 GB of RSS
  under a 4 GB limit).
- ``max_temp_directory_size``: ``$POLYTRACE_TEMP_LIMIT``, else four times the memory limit, at
  most half the space free where the spill goes.
- ``temp_directory``: ``<warehouse>/.scratch/<host>-<pid>-<random>`` (for an ``s3://``
  warehouse, in its local mirror), one per connection. DuckDB creates it at its first spill and
  removes it when the connection closes; one that a killed process left behind is removed by the
  next connection on the same host. A warehouse that cannot be written spills to the system
  temporary directory instead. (DuckDB's default for an in-memory database is ``.tmp`` in the
  current directory.)

Sizes are written as DuckDB writes them: ``2GB`` (1000^3), ``512MiB`` (1024^2), a plain number
of bytes, or a percentage of the memory this process may use (``25%``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only in annotations: `polytrace query --help` names this module's settings without DuckDB
    import duckdb

ENV_MEMORY = "POLYTRACE_MEMORY_LIMIT"
ENV_TEMP = "POLYTRACE_TEMP_LIMIT"
SCRATCH = ".scratch"
MEMORY_CAP = 3 * 1000**3  # "3 GB"
TEMP_PER_MEMORY = 4

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*|%)\s*$")


@dataclass(frozen=True)
class ResourceLimits:
    memory_bytes: int
    temp_bytes: int | None = None  # None: TEMP_PER_MEMORY x memory, at most half the free space

    def temp_for(self, spill: Path) -> int:
        if self.temp_bytes is not None:
            return self.temp_bytes
        return min(TEMP_PER_MEMORY * self.memory_bytes, _free_bytes(spill) // 2)


def parse_size(text: str, what: str) -> int:
    """Bytes of a size such as ``2GB``, ``512MiB``, ``1500000`` or ``25%``; ``ValueError`` naming
    ``what`` (the option or variable it came from) otherwise."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or (unit != "%" and unit not in _UNITS):
        raise ValueError(f"{what}: {text!r} is not a size (for example 2GB, 512MiB or 25%)")
    value = float(m.group(1))
    n = int(value * total_memory() / 100) if unit == "%" else int(value * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"{what}: {text!r} must be more than 0 bytes")
    return n


def total_memory() -> int:
    """Bytes of memory this process may use: physical RAM, or its cgroup's limit when lower."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            ram = min(ram, int(text))
    return ram


def default_memory_limit() -> int:
    return min(MEMORY_CAP, total_memory() // 4)


def resource_limits(memory: str | None = None, temp: str | None = None) -> ResourceLimits:
    """The limits from the given values (command-line options), else the environment, else the
    defaults; ``ValueError`` with one line for a value that is not a size."""
    mem, mem_from = (memory, "--memory-limit") if memory is not None else (os.environ.get(ENV_MEMORY), ENV_MEMORY)
    tmp, tmp_from = (temp, "--temp-limit") if temp is not None else (os.environ.get(ENV_TEMP), ENV_TEMP)
    return ResourceLimits(memory_bytes=parse_size(mem, mem_from) if mem else default_memory_limit(),
                          temp_bytes=parse_size(tmp, tmp_from) if tmp else None)


def human_bytes(n: int) -> str:
    """``n`` bytes as DuckDB reports a size (``3.7 GiB``)."""
    for unit, div in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} bytes"


# ----------------------------------------------------------------------------- scratch area


def scratch_root(root: Path) -> Path:
    """``<root>/.scratch``, created; the system temporary directory's ``polytrace-scratch-<uid>``
    when the warehouse cannot be written."""
    for base in (root / SCRATCH, Path(tempfile.gettempdir()) / f"polytrace-scratch-{os.getuid()}"):
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(base, os.W_OK | os.X_OK):
            return base
    raise OSError(f"no writable scratch directory for {root} (nor in {tempfile.gettempdir()})")


def new_scratch_path(root: Path) -> Path:
    """A fresh per-connection spill path under the scratch area (not created); stale ones that
    killed processes on this host left there are removed first."""
    base = scratch_root(root)
    clean_stale_scratch(base)
    return base / f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def clean_stale_scratch(base: Path) -> list[Path]:
    """Remove the spill directories of processes on this host that are no longer alive."""
    host = socket.gethostname()
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for d in entries:
        h, _, rest = d.name.rpartition("-")[0].rpartition("-")
        pid = int(rest) if rest.isdigit() else None
        if h != host or pid is None or _alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal (or a confined process asking): alive as far as we know
        return True
    return True


def _free_bytes(path: Path) -> int:
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return 0


def apply_limits(con: duckdb.DuckDBPyConnection, limits: ResourceLimits, spill: Path) -> None:
    """Bound ``con`` by ``limits``, spilling to ``spill``. By ``SET``: DuckDB 2.0 reports a
    ``max_temp_directory_size`` given in ``duckdb.connect(config=...)`` but does not enforce it
    (a sort spilled 320 MB past a 1 MB limit)."""
    con.execute("SET memory_limit = $1", [f"{limits.memory_bytes}B"])
    con.execute("SET temp_directory = $1", [str(spill)])
    con.execute("SET max_temp_directory_size = $1", [f"{limits.temp_for(spill)}B"])
