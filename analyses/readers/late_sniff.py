"""The second look of format detection: console formats whose signature comes late in a file.

Rule: only when no reader accepted the head (the first 64 KiB), and only for a head that looks
like text (at most :data:`MAX_NUL_SHARE` NUL characters and :data:`MAX_BAD_SHARE` undecodable
ones: a real binary is never scanned), the file is streamed from its start (gzip decompressed) in
blocks of :data:`BLOCK_BYTES`, each cut back to its last newline so no line is split, and each
block is offered to the late-sniffing readers in registry order; the first that accepts a block
reads the file. At most :data:`LATE_SNIFF_MAX_BYTES` are looked at: a console log whose first
step line comes later than that is not recognised (its ``source_files`` row says
``unsupported``). The cost is paid only by files no reader recognised, and it is one streamed
pass with each reader's own sniff, whose patterns are anchored on short literals.
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


def text_blocks(path: Path, block_bytes: int = BLOCK_BYTES, max_bytes: int = LATE_SNIFF_MAX_BYTES) -> Iterator[str]:
    """The file's first ``max_bytes`` (decompressed) as decoded blocks of whole lines."""
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
                yield buf[: cut + 1].decode("utf-8", errors="replace")
    except (OSError, EOFError, zlib.error):  # a cut gzip: what decompressed was looked at
        pass
    if carry:
        yield carry.decode("utf-8", errors="replace")


def late_detect(path: Path, head: str, readers: Sequence[Reader]) -> Reader | None:
    """The first of ``readers`` whose ``sniff`` accepts a block of ``path`` (see the module rule)."""
    if not readers or not looks_like_text(head):
        return None
    for block in text_blocks(path):
        for r in readers:
            if r.sniff(block, path):
                return r
    return None
