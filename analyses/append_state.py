"""What a published run version remembers of each input file so that the next refresh can read only
what was appended (:mod:`analyses.append_ingest`): where the read stopped, a digest of the bytes
just before that point (to tell an append from a rewrite), whether it stopped at the end of a
line, the file's line accounting and the sha256 state to continue from."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from analyses.readers.base import is_gzip

TAIL_BYTES = 64 << 10  # the bytes before the end of the read whose digest must be unchanged


def tail_digest(path: Path, end: int) -> str:
    """sha256 of the up to :data:`TAIL_BYTES` bytes of ``path`` before offset ``end``."""
    start = max(0, end - TAIL_BYTES)
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(end - start)
    if len(data) != end - start:
        raise OSError(f"{path}: shorter than {end} bytes")
    return hashlib.sha256(data).hexdigest()


def ends_with_newline(path: Path, size: int) -> bool:
    if size == 0:
        return True
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1) == b"\n"


def file_state(path: Path, fr: Any, before: os.stat_result, reader: Any, data: bytes | None = None) -> dict | None:
    """The state of a file just read whole by the ingest (``fr``: its FileReport, ``before``: its
    stat before the read, ``reader``: the reader, None when no reader took it; ``data``: its bytes
    when they were read whole at ``before``); None when the file changed while it was read (the
    next refresh reads it whole again)."""
    try:
        after = path.stat()
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            return None
        return read_state(path, fr, before.st_size, reader, data)
    except OSError:
        return None


def partial_line(path: Path, ctx: Any, reader: Any, size: int, n_lines: int) -> dict | None:
    """For a file read whole whose last line has no newline yet: that line's offset, number and
    accounting (read again alone: its reader is resumable), so that the next refresh can drop its
    rows and read it again complete. None when it cannot be told apart (or the file changed)."""
    from analyses.readers import read_file
    from analyses.readers.base import UnreadableFile
    from analyses.readers.lines import LineWindow, line_window

    start = 0
    with open(path, "rb") as fh:
        pos = size
        while pos > 0:  # the last newline before the end
            lo = max(0, pos - (1 << 20))
            fh.seek(lo)
            i = fh.read(pos - lo).rfind(b"\n")
            if i >= 0:
                start = lo + i + 1
                break
            pos = lo
    from analyses import resumable_sha256

    out = {"offset": start, "line_no": n_lines, "lines": 0, "rows_ok": 0, "rows_rejected": 0, "rows_skipped": 0,
           "rows_out": 0, "tables": [], "first_reason": None,
           # the hash state where the next refresh reads on (the full ingest hashed past it)
           "sha_state": resumable_sha256.extend_file(None, path, 0, start) if resumable_sha256.available() else None}
    tables: set[str] = set()
    try:
        with line_window(LineWindow(path, start, size, n_lines, last_line_partial=True)):
            for chunk in read_file(reader, ctx):
                for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped"):
                    out[k] += getattr(chunk, k)
                for t, df in chunk.tables.items():
                    out["rows_out"] += df.height
                    if df.height:
                        tables.add(t)
                if chunk.step_attrs is not None and chunk.step_attrs.height:
                    tables.add("steps")
                if chunk.rejects is not None and chunk.rejects.height:
                    tables.add("rejects")
                    out["first_reason"] = out["first_reason"] or chunk.rejects["reason"][0]
    except (UnreadableFile, OSError):
        return None
    out["tables"] = sorted(tables)
    return out


def read_state(path: Path, fr: Any, end: int, reader: Any, data: bytes | None = None) -> dict:
    """The state of ``path`` read up to byte ``end`` (its status and counts are ``fr``'s; the
    caller adds ``sha256`` and ``sha_state`` once the digest is known; ``data``: its ``end`` bytes,
    when the caller has them, instead of reading the file again)."""
    if data is not None and len(data) == end:
        tail = hashlib.sha256(data[max(0, end - TAIL_BYTES):]).hexdigest()
        newline, gz = end == 0 or data[-1:] == b"\n", data[:2] == b"\x1f\x8b"
    else:
        tail, newline, gz = tail_digest(path, end), ends_with_newline(path, end), end > 0 and is_gzip(path)
    return {
        "size": end,
        "tail": tail,
        "newline_end": newline,
        "gzip": gz,
        "resumable": bool(getattr(reader, "resumable", False)),
        "format": fr.format, "status": fr.status, "error": fr.error, "lines": fr.lines, "rows_ok": fr.rows_ok,
        "rows_rejected": fr.rows_rejected, "rows_skipped": fr.rows_skipped, "rows_out": fr.rows_out,
        "tables": sorted(fr.tables), "first_reason": fr.first_reason,
    }
