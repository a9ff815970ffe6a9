"""Fuzz inputs: real files (the test fixtures and ../shared/real_logs) mutated the ways real logs
break, each input a pure function of ``(master seed, batch, index)`` so any finding can be
regenerated from its coordinates alone (``python -m tests.fuzz.run --show SEED:BATCH:INDEX``).

Mutations: truncation, byte flips, NUL bytes, invalid UTF-8, CRLF, huge lines (just under and
over the line limit), deep nesting (around DuckDB's 128 levels and far past Python's recursion
limit), non-finite and absurd numbers, duplicated / reordered / repeated lines, splices of two
files, gzip (whole, cut, corrupt), gzip bombs (one endless line, endless lines, a Kineto event
that never closes), empty and binary files.
"""

from __future__ import annotations

import gzip
import os
import random
import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
REAL_LOGS = Path(os.environ.get("POLYTRACE_REAL_LOGS", REPO.parent / "shared" / "real_logs"))
_NOT_INPUTS = {"run.toml", "tokenizer.json", "README.md", "make_fixtures.py", "PROVENANCE.md"}
WINDOW_MAX = 64 * 1024  # most inputs are a window of a large seed: many inputs per minute
REPEAT_MAX_BYTES = 4 << 20  # a repeated line adds at most this much (more only makes inputs slow)

NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b"-inf", b"1e300", b"-1e300", b"1e309",
              b"99999999999999999999999", b"-0", b"1e-320", b"0x1F", b"1_000"]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Seed:
    name: str  # file name (sniffers and readers look at it: packed_lengths_step_3.jsonl, 5.jsonl)
    data: bytes  # content, decompressed when the file was gzip
    gz: bool  # the real file was gzip


@dataclass
class Input:
    name: str
    data: bytes
    how: list[str] = field(default_factory=list)  # the seed and the mutations, for the report


@lru_cache(maxsize=1)
def seeds() -> tuple[Seed, ...]:
    """Every fixture, and every real log when ../shared/real_logs is there."""
    out = []
    roots = [FIXTURES] + ([REAL_LOGS] if REAL_LOGS.is_dir() else [])
    for root in roots:
        for p in sorted(root.rglob("*")):
            if not p.is_file() or p.name in _NOT_INPUTS:
                continue
            raw = p.read_bytes()
            gz = raw[:2] == b"\x1f\x8b" and not p.name.endswith((".tar.gz", ".tgz"))
            if gz:
                try:
                    raw = gzip.decompress(raw)
                except (OSError, EOFError, zlib.error):  # a fixture that is a cut gzip on purpose
                    gz = False
            out.append(Seed(p.name, raw, gz))
    return tuple(out)


@lru_cache(maxsize=1)
def seed_kinds() -> tuple[tuple[Seed, ...], ...]:
    """The seeds grouped by their name without digits (``packed_lengths_step_N.jsonl``)."""
    groups: dict[str, list[Seed]] = {}
    for s in seeds():
        groups.setdefault(re.sub(r"\d+", "N", s.name), []).append(s)
    return tuple(tuple(g) for _, g in sorted(groups.items()))


# ------------------------------------------------------------------------------- mutations


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _truncate(r: random.Random, d: bytes, _: int) -> bytes:
    return d[: r.randint(0, len(d))]


def _flip(r: random.Random, d: bytes, _: int) -> bytes:
    if not d:
        return d
    b = bytearray(d)
    for _i in range(r.randint(1, 8)):
        b[r.randrange(len(b))] = r.randrange(256)
    return bytes(b)


def _insert(d: bytes, at: int, piece: bytes) -> bytes:
    return d[:at] + piece + d[at:]


def _nul(r: random.Random, d: bytes, _: int) -> bytes:
    for _i in range(r.randint(1, 3)):
        d = _insert(d, r.randint(0, len(d)), b"\x00" * r.randint(1, 2))
    return d


def _bad_utf8(r: random.Random, d: bytes, _: int) -> bytes:
    for _i in range(r.randint(1, 4)):
        d = _insert(d, r.randint(0, len(d)), bytes(r.randrange(0x80, 0x100) for _ in range(r.randint(1, 3))))
    return d


def _crlf(r: random.Random, d: bytes, _: int) -> bytes:
    return d.replace(b"\n", b"\r\n")


def _huge_line(r: random.Random, d: bytes, limit: int) -> bytes:
    """A line (or JSON value) near or past the line limit, made of the file's own text."""
    size = r.choice([limit - 64, limit + 1, 2 * limit, 3 * limit + 7])
    lines = [ln for ln in _lines(d) if ln.strip()] or [b"x"]
    unit = r.choice(lines)[: r.randint(1, 200)] or b"x"
    kind = r.random()
    if kind < 0.3:  # a long JSON array element run inside a line
        body = b"[" + b"1," * (size // 2) + b"1]"
    elif kind < 0.6:  # a console step line with endless pairs
        body = b"step:1 - " + b"a/b:1.5 - " * (size // 10) + b"c:2"
    else:
        body = (unit * (size // len(unit) + 1))[:size].replace(b"\n", b" ")
    at = r.randint(0, len(d))
    if r.random() < 0.3:  # no newline after it: the file ends inside the long line
        return d[:at] + body
    return _insert(d, at, body + b"\n")


def _deep(r: random.Random, d: bytes, _: int) -> bytes:
    depth = r.choice([126, 127, 128, 129, 1000, 5000, 100_000])
    if r.random() < 0.5:
        piece = b'{"a":' * depth + b"1" + b"}" * depth
    else:
        piece = b"[" * depth + b"]" * depth
    lines = _lines(d)
    i = r.randrange(len(lines))
    line = lines[i]
    if r.random() < 0.5 and b":" in line:  # as the value of a key of a real record
        j = line.find(b":") + 1
        k = line.find(b",", j)
        k = len(line) if k < 0 else k
        lines[i] = line[:j] + piece + line[k:]
    else:  # as a line of its own, or wrapped like a record of the file
        lines.insert(i, piece if r.random() < 0.5 else b'{"step": 1, "data": {"x": ' + piece + b"}}")
    return b"\n".join(lines)


def _non_finite(r: random.Random, d: bytes, _: int) -> bytes:
    matches = list(_NUMBER.finditer(d[:WINDOW_MAX]))
    if not matches:
        return d + b"\nstep:1 - timing_s/step:inf - timing_s/gen:1e300\n"
    out = bytearray(d)
    for m in sorted(r.sample(matches, min(len(matches), r.randint(1, 6))), key=lambda m: -m.start()):
        out[m.start() : m.end()] = r.choice(NON_FINITE)
    return bytes(out)


def _shuffle_lines(r: random.Random, d: bytes, _: int) -> bytes:
    lines = _lines(d)
    if len(lines) < 2:
        return d
    kind = r.random()
    if kind < 0.4:  # duplicated lines (a resumed run re-logging steps)
        for _i in range(r.randint(1, 5)):
            i = r.randrange(len(lines))
            lines.insert(r.randrange(len(lines)), lines[i])
    elif kind < 0.8:  # out of order
        for _i in range(r.randint(1, 5)):
            i, j = r.randrange(len(lines)), r.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
    else:  # a block reversed
        i = r.randrange(len(lines))
        j = min(len(lines), i + r.randint(2, 50))
        lines[i:j] = lines[i:j][::-1]
    return b"\n".join(lines)


def _repeat_line(r: random.Random, d: bytes, _: int) -> bytes:
    lines = _lines(d)
    i = r.randrange(len(lines))
    times = min(r.randint(2, 2000), max(2, REPEAT_MAX_BYTES // (len(lines[i]) + 1)))
    lines[i : i + 1] = [lines[i]] * times
    return b"\n".join(lines)


def _delete(r: random.Random, d: bytes, _: int) -> bytes:
    if not d:
        return d
    i = r.randrange(len(d))
    return d[:i] + d[i + r.randint(1, 4096) :]


def _splice(r: random.Random, d: bytes, _: int) -> bytes:
    other = r.choice(seeds()).data
    a = r.randint(0, len(other))
    return _insert(d, r.randint(0, len(d)), other[a : a + r.randint(1, 8192)])


MUTATIONS = {
    "truncate": _truncate, "flip": _flip, "nul": _nul, "bad_utf8": _bad_utf8, "crlf": _crlf,
    "huge_line": _huge_line, "deep": _deep, "non_finite": _non_finite, "reorder": _shuffle_lines,
    "repeat_line": _repeat_line, "delete": _delete, "splice": _splice,
}


# ------------------------------------------------------------------------------- whole files


def _gzip_bomb(r: random.Random) -> tuple[str, bytes]:
    """A small gzip inflating to far more than any cap: one endless line, endless step lines,
    or a Kineto trace whose event never closes."""
    kind = r.choice(["one_line", "many_lines", "kineto_open_event"])
    return _bomb(kind, r.choice([8, 40, 300]))


@lru_cache(maxsize=16)
def _bomb(kind: str, mib: int) -> tuple[str, bytes]:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    if kind == "one_line":
        head, unit, name = b"step:1 - a:", b"1111111111" * 100, "bomb.log.gz"
    elif kind == "many_lines":
        head, unit, name = b"", b"step:1 - timing_s/step:1.5 - a:2\n" * 30, "bomb_lines.log.gz"
    else:
        head = b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "'
        unit, name = b"k" * 1000, "bomb_rank-0.json.gz"
    out = [z.compress(head)]
    block = unit * max(1, (1 << 20) // len(unit))
    for _i in range((mib << 20) // len(block)):
        out.append(z.compress(block))
    out.append(z.flush())
    return name, b"".join(out)


def _binary(r: random.Random) -> bytes:
    kind = r.random()
    n = r.randint(1, 65536)
    if kind < 0.4:
        return r.randbytes(n)
    if kind < 0.6:
        return b"\x00" * n
    if kind < 0.8:
        return b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + r.randbytes(n)
    return b"PAR1" + r.randbytes(n)


def _window(r: random.Random, s: Seed) -> bytes:
    if len(s.data) <= WINDOW_MAX or r.random() < 0.03:
        return s.data
    return s.data[: r.randint(1024, WINDOW_MAX)]


def make_input(master: int, batch: int, index: int, limit: int) -> Input:
    """Input ``index`` of ``batch``: deterministic in its coordinates and the line ``limit``."""
    r = random.Random(f"{master}:{batch}:{index}")
    kind = r.random()
    if kind < 0.01:
        return Input("empty.log", b"", ["empty"])
    if kind < 0.03:
        return Input(r.choice(["data.bin", "trace.json", "x.log"]), _binary(r), ["binary"])
    if kind < 0.035:
        name, data = _gzip_bomb(r)
        return Input(name, data, ["gzip_bomb", name])
    s = r.choice(r.choice(seed_kinds()))  # a kind first: 40 step files of one format weigh as one
    data = _window(r, s)
    how = [s.name]
    for _i in range(r.choice([0, 1, 1, 1, 2, 2, 3])):
        op = r.choice(list(MUTATIONS))
        data = MUTATIONS[op](r, data, limit)
        how.append(op)
    gz = s.gz if r.random() < 0.9 else not s.gz
    if gz:
        data = gzip.compress(data, compresslevel=1)
        how.append("gzip")
        if r.random() < 0.15:
            data = _flip(r, data, limit) if r.random() < 0.5 else data[: r.randint(0, len(data))]
            how.append("corrupt_gzip")
    return Input(s.name if gz == s.gz else (s.name + ".gz" if gz else s.name.removesuffix(".gz")), data, how)
