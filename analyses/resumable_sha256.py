"""SHA-256 of a file that only grows, continued from a saved state instead of re-read.

An append-only refresh must record the same ``source_files.sha256`` as a full ingest of the file
(the whole file's digest), without re-reading hundreds of megabytes for a 1 MB append. ``hashlib``
cannot export its state; OpenSSL's ``SHA256_CTX`` is a plain 112-byte struct that can be saved
(hex, in the run manifest) and continued. Where libcrypto or its (deprecated, still exported)
``SHA256_*`` functions are missing, :func:`available` is False and callers hash the whole file.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

CTX_BYTES = 112  # sizeof(SHA256_CTX): h[8], Nl, Nh, data[16], num, md_len (unsigned ints)
BLOCK = 1 << 20


def _loaded_libcrypto() -> str | None:
    """The libcrypto this process has loaded already (hashlib's OpenSSL, imported above), from
    /proc/self/maps: ctypes.util.find_library ran `ldconfig -p` in a subprocess, ~4 ms of every
    ingest's imports (more once Polars' memory is mapped: the fork copies its page tables)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.rstrip("\n").split(maxsplit=5)
                if len(parts) == 6 and "/libcrypto.so" in parts[5]:
                    return parts[5]
    except OSError:
        pass
    return None


def _lib() -> ctypes.CDLL | None:
    name = _loaded_libcrypto()
    if name is None:  # not Linux, or a Python without OpenSSL's hashlib
        from ctypes.util import find_library

        name = find_library("crypto")
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name)
        for fn in ("SHA256_Init", "SHA256_Update", "SHA256_Final"):
            getattr(lib, fn).restype = ctypes.c_int
        lib.SHA256_Update.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return lib


_LIB = _lib()


def available() -> bool:
    return _LIB is not None


def _check_self() -> bool:
    if _LIB is None:
        return False
    data = b"polytrace" * 1000
    state = extend(None, data[:4000])
    return digest(extend(state, data[4000:])) == hashlib.sha256(data).hexdigest()


def extend(state: str | None, data: bytes) -> str:
    """The state after hashing ``data`` on from ``state`` (None: the empty message), as hex."""
    assert _LIB is not None
    ctx = ctypes.create_string_buffer(CTX_BYTES)
    if state is None:
        _LIB.SHA256_Init(ctx)
    else:
        ctypes.memmove(ctx, bytes.fromhex(state), CTX_BYTES)
    if data:
        _LIB.SHA256_Update(ctx, data, len(data))
    return ctx.raw.hex()


def digest(state: str) -> str:
    """The hex digest of everything hashed into ``state`` (the state itself is left as it was)."""
    assert _LIB is not None
    ctx = ctypes.create_string_buffer(bytes.fromhex(state), CTX_BYTES)
    out = ctypes.create_string_buffer(32)
    _LIB.SHA256_Final(out, ctx)
    return out.raw.hex()


def extend_file(state: str | None, path: Path, start: int, end: int) -> str:
    """``state`` continued over bytes ``[start, end)`` of ``path``."""
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            block = fh.read(min(BLOCK, left))
            if not block:
                raise OSError(f"{path}: shorter than {end} bytes")
            state = extend(state, block)
            left -= len(block)
    return state if state is not None else extend(None, b"")


if _LIB is not None and not _check_self():  # a libcrypto whose struct is not the one above
    _LIB = None
