"""The second look of format detection: console formats whose signature comes late in a file.

Rule: only when no reader accepted the head (the first 64 KiB), and only for a head that looks
like text (at most :data:`MAX_NUL_SHARE` NUL characters and :data:`MAX_BAD_SHARE` undecodable
ones: a real binary is never scanned), the file is streamed from its start (gzip decompressed) in
blocks of :data:`BLOCK_BYTES`, each cut back to its last newline so no line is split. A
late-sniffing reader names the literals its signature lines hold (``late_sniff = ("step:",
...)``); of each block, the lines holding one of them are offered to that reader's own ``sniff``,
readers in registry order; the first that accepts reads the file. At most
:data:`LATE_SNIFF_MAX_BYTES` are looked at: a console log whose first step line comes later than
that is not recognised (its ``source_files`` row says ``unsupported``). The cost is paid only by
files no reader recognised: one streamed pass of substring searches (the readers' regexes only
see the few lines that hold their literals).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from analyses.readers.base import Reader, is_gzip

BLOCK_BYTES = 4 << 20
LATE_SNIFF_MAX_BYTES = 256 << 20
MAX_NUL_SHARE = 0.001
MAX_BAD_SHARE = 0.10


def looks_like_text(head: str) -> bool:
    """A decoded head that is text: nearly no NUL and few undecodable characters."""
    if not head:
        return False
    n = len(head)
    return head.count("\x00") <= MAX_NUL_SHARE * n and head.count("\ufffd") <= MAX_BAD_SHARE * n


def line_blocks(path: Path, block_bytes: int | None = None, max_bytes: int | None = None) -> Iterator[bytes]:
    """The file's first ``max_bytes`` (default :data:`LATE_SNIFF_MAX_BYTES`, decompressed) as
    blocks of whole lines, about ``block_bytes`` (default :data:`BLOCK_BYTES`) each."""
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    max_bytes = LATE_SNIFF_MAX_BYTES if max_bytes is None else max_bytes
    opener = gzip.open if is_gzip(path) else open
    seen = 0
    carry = b""
    try:
        with opener(path, "rb") as fh:
            while seen < max_bytes:
                data = fh.read(min(block_bytes, max_bytes - seen))
                if not data:
                    break
                seen += len(data)
                buf = carry + data
                cut = buf.rfind(b"\n")
                if cut < 0 and len(buf) < block_bytes:  # no line end yet: keep reading
                    carry = buf
                    continue
                cut = len(buf) - 1 if cut < 0 else cut  # one line longer than a block: look at it anyway
                carry = buf[cut + 1 :]
                yield buf[: cut + 1]
    except (OSError, EOFError, zlib.error):  # a cut gzip: what decompressed was looked at
        pass
    if carry:
        yield carry


def lines_holding(block: bytes, literals: Sequence[str]) -> str:
    """The lines of ``block`` that hold one of ``literals``, in order, each once, decoded (only
    they are: undecodable bytes replaced)."""
    starts: dict[int, bytes] = {}
    for lit in literals:
        needle = lit.encode("utf-8")
        i = block.find(needle)
        while i >= 0:
            s = block.rfind(b"\n", 0, i) + 1
            e = block.find(b"\n", i)
            e = len(block) if e < 0 else e + 1
            starts.setdefault(s, block[s:e])
            i = block.find(needle, e)
    return b"".join(starts[k] for k in sorted(starts)).decode("utf-8", errors="replace")


def late_detect(path: Path, head: str, readers: Sequence[Reader]) -> Reader | None:
    """The first of ``readers`` (each with its ``late_sniff`` literals) whose ``sniff`` accepts
    the lines of a block of ``path`` that hold its literals (see the module rule)."""
    if not readers or not looks_like_text(head):
        return None
    for block in line_blocks(path):
        for r in readers:
            lines = lines_holding(block, r.late_sniff)
            if lines and r.sniff(lines, path):
                return r
    return None
