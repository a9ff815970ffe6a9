"""Linux Landlock for a process that must not write files: it may write beneath one scratch
directory and nowhere else, for the rest of its life (and so may every thread it starts after).

``polytrace query`` confines its own process with this before it opens DuckDB, so that a
statement DuckDB would run against the sandbox's intent (a ``COPY ... TO`` a published file,
an ``EXPORT``, a new database file) is refused by the kernel even if it got past the statement
check: DuckDB's ``allowed_paths`` cannot be made read-only, and ``read_only`` connections still
``COPY`` to files. The domain denies, outside ``writable``:

- writing, truncating, creating, renaming, linking and removing any file or directory
  (Landlock ABI 1-3 rights);
- executing any program;
- on ABI 4 and later, binding or connecting a TCP socket; on ABI 6 and later, signalling
  processes or reaching abstract Unix sockets outside the domain.

Reads are not restricted here (the interpreter and its libraries load lazily from all over the
file system): what SQL can read is decided by DuckDB's ``allowed_paths``.

Landlock restricts the calling thread and the threads and processes it creates afterwards, so
call :func:`confine` before DuckDB starts its threads. A kernel without Landlock (before 5.13, or
booted without it) returns 0 and leaves the process as it was: the caller says what that means.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

# how `polytrace query` confines itself: auto (default) where the kernel has Landlock; require:
# refuse to run without it; off
ENV_LANDLOCK = "POLYTRACE_LANDLOCK"

# syscall numbers: the same on every architecture that has them (x86_64, aarch64, riscv64, ...)
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# filesystem rights (include/uapi/linux/landlock.h) and the ABI that introduced them
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2: link or rename across directories
FS_TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

_WRITE_ABI1 = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG
               | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class LandlockError(OSError):
    """The kernel has Landlock but refused the domain (not a missing Landlock: that is ABI 0)."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or it is disabled)."""
    try:
        v = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):  # no libc syscall() (not Linux)
        return 0
    return max(int(v), 0)


def write_rights(version: int) -> int:
    """Every right that changes the file system, as far as ABI ``version`` knows them."""
    rights = _WRITE_ABI1
    if version >= 2:
        rights |= FS_REFER
    if version >= 3:
        rights |= FS_TRUNCATE
    return rights


def confine(writable: Path) -> int:
    """Deny this process every file-system write outside ``writable`` (an existing directory),
    program execution, and where the kernel can, TCP and signals out of the process. Returns the
    Landlock ABI enforced, 0 when the kernel has none (nothing changed)."""
    version = abi()
    if version < 1:
        return 0
    libc = _libc()
    writes = write_rights(version)
    attr = _RulesetAttr(handled_access_fs=writes | FS_EXECUTE)
    size = 8
    if version >= 4:
        attr.handled_access_net, size = NET_BIND_TCP | NET_CONNECT_TCP, 16
    if version >= 6:
        attr.scoped, size = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise LandlockError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        # the scratch directory: everything but execution; its parent: only removing it once empty
        _allow(libc, ruleset, writable, writes)
        _allow(libc, ruleset, writable.parent, FS_REMOVE_DIR)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return version


def _allow(libc: ctypes.CDLL, ruleset: int, path: Path, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                        ctypes.c_uint32(0)) != 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
