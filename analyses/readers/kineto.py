"""PyTorch profiler (Kineto) Chrome traces, one JSON(.gz) per rank -> ``rank_times``.

A trace is one JSON object whose ``traceEvents`` array holds every event; a real one is often
hundreds of MB to GBs. It is streamed, never loaded whole:

1. the (gzip) bytes are decompressed in bounded chunks (``zlib.decompressobj``, so a cut gzip
   still yields every byte before the cut);
2. each chunk is split into whole events with a vectorized structural scan (numpy: unescaped
   quotes -> in-string mask -> bracket depth; the commas at depth 0 of the array separate
   events), the way simdjson's stage 1 does it — no Python loop per event or per byte;
3. the events of the chunk become NDJSON and Polars' ``read_ndjson`` parses only the fields the
   breakdown needs (ph, cat, name, ts, dur, args.stream/correlation/device);
4. only ProfilerStep windows, GPU events (kernel/memcpy/memset: ts, dur, correlation, kind) and
   launch events (ts, correlation) are kept, as Polars columns: memory is bounded by the chunk
   plus those few columns of one rank.

The breakdown itself is :mod:`analyses.kineto_breakdown` (HTA's definitions).

Line accounting (``lines`` = trace events): ProfilerStep, GPU and launch events are ``rows_ok``;
every other event (cpu_op, python_function, flow, metadata, annotations, and a ProfilerStep whose
number does not fit an Int64) is ``rows_skipped`` by the documented rule "not needed for the GPU
time breakdown".

Truncation rule: a file that ends inside ``traceEvents`` (trace cut mid-write, or a truncated
gzip) keeps every complete event before the cut; the cut itself counts as one line, rejected
with reason ``truncated_trace`` (raw = the start of the partial event). The metadata after the
array (often ``distributedInfo``) is then lost: the rank comes from the metadata before the
array or from the file name (``rank-N`` / ``rank_N`` / ``rankN``).
"""

from __future__ import annotations

import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from analyses.kineto_breakdown import assign_steps, has_sub_us, hta_round, kernel_kind, step_rows
from analyses.readers.base import Chunk, FileContext, ReaderBase, UnreadableFile, rejects_frame

READ_BYTES = 4 << 20  # compressed bytes per read
FEED_BYTES = 64 << 10  # compressed bytes per decompress call: corrupt data loses only its slice
CHUNK_BYTES = 16 << 20  # decompressed bytes per structural scan (~4x that in scratch)
MAX_META_BYTES = 64 << 20  # cap on text kept outside traceEvents (head/tail metadata)

_EVENT_SCHEMA = {
    "ph": pl.String,
    "cat": pl.String,
    "name": pl.String,
    "ts": pl.Float64,
    "dur": pl.Float64,
    # strings: some traces write non-numeric streams; HTA treats those as "not a GPU event"
    "args": pl.Struct({"stream": pl.String, "correlation": pl.String, "device": pl.String}),
}
_STEP_RE = r"^ProfilerStep\s*#\s*(\d+)$"
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_TRACE_EVENTS = b'"traceEvents"'
_ARRAY_OPEN = re.compile(rb"\s*:\s*\[")

_Q, _BS, _LB, _RB, _LS, _RS, _COMMA = 34, 92, 123, 125, 91, 93, 44


def _decompressed_chunks(path: Path, size: int = CHUNK_BYTES) -> Iterator[tuple[bytes, bool]]:
    """Yield (bytes, cut) chunks of the file's content, at most ``size`` bytes each; a final
    ``(b"", True)`` says a gzip stream ended before its end marker or turned corrupt (what
    decompressed before that is kept). Concatenated gzip members are read in turn; zero
    padding after the last member is ignored."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
        fh.seek(0)
        if magic != b"\x1f\x8b":
            while block := fh.read(size):
                yield block, False
            return
        gz = _Gunzip(size)
        while raw := fh.read(READ_BYTES):
            for at in range(0, len(raw), FEED_BYTES):
                yield from ((out, False) for out in gz.feed(raw[at : at + FEED_BYTES]))
                if gz.corrupt:
                    yield b"", True
                    return
        if gz.started and not gz.d.eof:
            yield b"", True


class _Gunzip:
    """Incremental gzip decoding with bounded output per call."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.d = zlib.decompressobj(wbits=31)
        self.started = False  # the current member has received input
        self.corrupt = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            while True:
                out = self.d.decompress(data, self.size)
                self.started = True
                if out:
                    yield out
                if self.d.eof:  # member done; what follows is another member or padding
                    data = self.d.unused_data
                    self.d, self.started = zlib.decompressobj(wbits=31), False
                    if not data.strip(b"\x00"):
                        return
                    continue
                data = self.d.unconsumed_tail
                if not data and len(out) < self.size:
                    return
        except zlib.error:
            self.corrupt = True


@dataclass
class _Structure:
    """Structural characters of a buffer that starts outside any string at depth 0."""

    outside: np.ndarray  # bool per byte: not inside a string literal
    brackets: np.ndarray  # positions of {}[] outside strings
    depth: np.ndarray  # bracket depth after each of those

    def depth_before(self, pos: np.ndarray) -> np.ndarray:
        """Bracket depth in effect at each position (after the last bracket before it)."""
        i = np.searchsorted(self.brackets, pos) - 1
        return np.where(i >= 0, self.depth[np.maximum(i, 0)], 0)


def _structure(buf: np.ndarray) -> _Structure:
    """Vectorized stage 1 (as simdjson): unescaped quotes -> in-string mask -> bracket depth.
    Dense work is a few byte-wide passes; depth is kept only at the brackets (sparse)."""
    quote = buf == _Q
    qpos = np.flatnonzero(quote)
    if qpos.size:
        # a quote preceded by an odd run of backslashes is escaped (sparse: only such quotes)
        cand = qpos[qpos > 0]
        cand = cand[buf[cand - 1] == _BS]
        if cand.size:
            bpos = np.flatnonzero(buf == _BS)
            brk = np.flatnonzero(np.diff(bpos) != 1)
            run_start = bpos[np.concatenate(([0], brk + 1))]
            run_end = bpos[np.concatenate((brk, [bpos.size - 1]))]
            i = np.searchsorted(run_end, cand - 1)
            quote[cand[((cand - 1) - run_start[i] + 1) % 2 == 1]] = False
        outside = np.bitwise_xor.accumulate(quote.view(np.uint8)) == 0
        outside &= ~quote
    else:
        outside = np.ones(buf.size, dtype=bool)
    # {=123 [=91 open, }=125 ]=93 close: (b | 0x20) maps [ ] to { } in one pass
    folded = buf | 0x20
    brackets = np.flatnonzero(((folded == _LB) | (folded == _RB)) & outside)
    steps = np.where(folded[brackets] == _LB, 1, -1).astype(np.int32)
    return _Structure(outside, brackets, np.cumsum(steps, dtype=np.int32))


@dataclass
class _Split:
    """Streaming splitter state for one file."""

    head: bytearray = field(default_factory=bytearray)  # text before the "traceEvents" key
    _key_at: int = 0
    tail: bytearray = field(default_factory=bytearray)  # text after the array
    carry: bytes = b""
    phase: str = "head"  # head | events | tail
    n_events: int = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Consume decompressed bytes; return NDJSON blocks of complete events."""
        if self.phase == "tail":
            if len(self.tail) < MAX_META_BYTES:
                self.tail += data
            return []
        if self.phase == "head":
            self.head += data
            pos = self._find_array_start()
            if pos is None:
                if len(self.head) > MAX_META_BYTES:
                    raise UnreadableFile("no traceEvents array in the first 64 MB: not a Kineto trace")
                return []
            rest = bytes(self.head[pos:])
            del self.head[self._key_at :]
            self.phase = "events"
            data = rest
        return self._events(self.carry + data)

    def _find_array_start(self) -> int | None:
        buf = bytes(self.head)
        start = 0
        while (k := buf.find(_TRACE_EVENTS, start)) >= 0:
            st = _structure(np.frombuffer(buf, dtype=np.uint8, count=k))  # only the prefix matters
            # the key's opening quote is itself a quote, so test the byte before it
            if k > 0 and st.depth_before(np.array([k]))[0] == 1 and st.outside[k - 1]:
                m = _ARRAY_OPEN.match(buf, k + len(_TRACE_EVENTS))
                if m is not None:
                    self._key_at = k
                    return m.end()
                if len(buf) - k < 256:  # the ':' and '[' may not have arrived yet
                    return None
            start = k + 1
        return None

    def _events(self, buf: bytes) -> list[bytes]:
        if not buf:
            return []
        arr = np.frombuffer(buf, dtype=np.uint8)
        st = _structure(arr)
        closed = st.brackets[st.depth < 0]
        end_of_array = int(closed[0]) if closed.size else -1
        region = arr if end_of_array < 0 else arr[:end_of_array]
        is_end = (st.depth == 0) & (st.brackets < region.size)  # a close bracket back at depth 0
        ends = st.brackets[is_end]
        if end_of_array >= 0:
            self.phase = "tail"
            self.tail += buf[end_of_array + 1 :][:MAX_META_BYTES]
            self.carry = b""
        else:
            cut = int(ends[-1]) + 1 if ends.size else 0
            self.carry = buf[cut:]
        if not ends.size:
            return []
        self.n_events += int(ends.size)
        block = region[: int(ends[-1]) + 1].copy()
        commas = np.flatnonzero((block == _COMMA) & st.outside[: block.size])
        seps = commas[st.depth_before(commas) == 0]
        # raw newlines cannot occur inside JSON strings, so they are whitespace: flatten them,
        # then the separating commas become the NDJSON line breaks
        block[(block == 10) | (block == 13)] = 32
        block[seps] = 10
        return [block.tobytes()]

    def partial(self) -> bytes:
        """What is left of a cut event (empty when the cut fell between events)."""
        return self.carry.lstrip(b" \t\r\n,")

    def metadata(self) -> dict:
        """The trace's top-level fields except traceEvents (distributedInfo, deviceProperties, ...)."""
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = bytes(self.tail).decode("utf-8", errors="replace").strip()
        for text in (head + '"traceEvents": []' + tail, head + '"traceEvents": []}'):
            try:
                meta = json.loads(text)
            except ValueError:
                continue
            return meta if isinstance(meta, dict) else {}
        return {}


@dataclass
class RankEvents:
    """The events of one rank the breakdown needs, as Polars frames (times in µs)."""

    steps: pl.DataFrame  # step, ts, dur
    gpu: pl.DataFrame  # ts, dur, correlation, stream, device, kind
    launches: pl.DataFrame  # ts, correlation
    metadata: dict
    n_events: int  # complete events in the file
    n_kept: int
    truncated: bool
    partial: bytes
    bad_blocks: list[tuple[int, str, str]] = field(default_factory=list)  # (event_no, reason, raw)


def _parse_block(block: bytes, first_event_no: int) -> tuple[pl.DataFrame, list[tuple[int, str, str]]]:
    """Parse an NDJSON block of events; a syntactically broken event is rejected on its own."""
    try:
        return pl.read_ndjson(io.BytesIO(block), schema=_EVENT_SCHEMA, ignore_errors=True), []
    except pl.exceptions.ComputeError:
        pass
    # rare path (a malformed event inside an otherwise sound trace): find the bad lines
    lines = block.split(b"\n")
    good, bad = [], []
    for i, line in enumerate(lines):
        try:
            json.loads(line)
            good.append(line)
        except ValueError as exc:
            bad.append((first_event_no + i, f"bad_event_json: {exc}", line[:500].decode("utf-8", "replace")))
    df = (
        pl.read_ndjson(io.BytesIO(b"\n".join(good)), schema=_EVENT_SCHEMA, ignore_errors=True)
        if good
        else pl.DataFrame(schema=_EVENT_SCHEMA)
    )
    return df, bad


def _select(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(steps, gpu, launches) of a parsed block, only the needed columns."""
    a = df.lazy().with_columns(
        stream=pl.col("args").struct.field("stream").cast(pl.Int64, strict=False),
        correlation=pl.col("args").struct.field("correlation").cast(pl.Int64, strict=False),
        device=pl.col("args").struct.field("device").cast(pl.Int64, strict=False),
        has_stream=pl.col("args").struct.field("stream").is_not_null(),
    )
    x = a.filter(
        (pl.col("ph") == "X")
        & pl.col("dur").is_not_null()
        & pl.col("ts").is_not_null()
        & pl.col("cat").is_not_null()
    )
    # the CPU-side ProfilerStep; newer traces also mirror it on the GPU timeline
    # (gpu_user_annotation), which must not count as a second window
    steps = x.filter(
        ~pl.col("has_stream") & ~pl.col("cat").str.starts_with("gpu_") & pl.col("name").str.contains(_STEP_RE)
    ).select(step=pl.col("name").str.extract(_STEP_RE, 1).cast(pl.Int64, strict=False), ts="ts", dur="dur")
    steps = steps.filter(pl.col("step").is_not_null())  # a step number past Int64: not a window
    gpu = x.filter((pl.col("stream") >= 0) & (pl.col("correlation") >= 0)).select(
        "ts", "dur", "correlation", "stream", "device", kind=kernel_kind(pl.col("name"))
    )
    launches = x.filter(~pl.col("has_stream") & (pl.col("correlation") >= 0)).select("ts", "correlation")
    s, g, la = pl.collect_all([steps, gpu, launches])
    return s, g, la


def load_rank_events(path: Path, chunk_bytes: int = CHUNK_BYTES, rounding: str = "hta") -> RankEvents:
    """Stream one rank's trace into the frames the breakdown needs.

    ``rounding="hta"`` rounds ns-resolution traces to whole µs as HTA does (see
    :func:`analyses.kineto_breakdown.hta_round`); ``"none"`` keeps the exact times.
    """
    split = _Split()
    steps, gpu, launches, bad = [], [], [], []
    cut = False
    for data, was_cut in _decompressed_chunks(path, chunk_bytes):
        cut = cut or was_cut
        before = split.n_events
        for block in split.feed(data):
            df, b = _parse_block(block, before + 1)
            bad.extend(b)
            s, g, la = _select(df)
            steps.append(s)
            gpu.append(g)
            launches.append(la)
    if split.phase == "head":
        raise UnreadableFile("no traceEvents array found: not a Kineto trace, or cut before its events")
    truncated = cut or split.phase == "events"
    s = (
        pl.concat(steps)
        if steps
        else pl.DataFrame(schema={"step": pl.Int64, "ts": pl.Float64, "dur": pl.Float64})
    )
    g = (
        pl.concat(gpu)
        if gpu
        else pl.DataFrame(
            schema={
                "ts": pl.Float64,
                "dur": pl.Float64,
                "correlation": pl.Int64,
                "stream": pl.Int64,
                "device": pl.Int64,
                "kind": pl.String,
            }
        )
    )
    la = pl.concat(launches) if launches else pl.DataFrame(schema={"ts": pl.Float64, "correlation": pl.Int64})
    if rounding == "hta" and any(has_sub_us(f["ts"]) for f in (s, g, la)):
        s, g, la = hta_round(s), hta_round(g), hta_round(la)
    return RankEvents(
        steps=s,
        gpu=g,
        launches=la,
        metadata=split.metadata(),
        n_events=split.n_events,
        n_kept=s.height + g.height + la.height,
        truncated=truncated,
        partial=split.partial(),
        bad_blocks=bad,
    )


def rank_of(meta: dict, path: Path) -> int | None:
    """Rank from ``distributedInfo.rank``, else from the file name."""
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


class KinetoTraceReader(ReaderBase):
    """PyTorch profiler (Kineto) Chrome trace JSON, plain or gzipped, one file per rank."""

    name = "kineto_trace"

    def sniff(self, head: str, path: Path) -> bool:
        h = head.lstrip()
        return (
            h.startswith("{")
            and re.search(r'"traceEvents"\s*:\s*\[', h) is not None
            and (
                re.search(r'"schemaVersion"\s*:', h) is not None
                or "ProfilerStep#" in h
                or '"cat": "kernel"' in h
            )
        )

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        ev = load_rank_events(ctx.path)
        rank = rank_of(ev.metadata, ctx.path)
        rej_rows = list(ev.bad_blocks)
        if ev.truncated:
            rej_rows.append(
                (
                    ev.n_events + 1,
                    "truncated_trace: file ends inside traceEvents (cut write, truncated or corrupt gzip); complete events before the cut kept",
                    ev.partial[:500].decode("utf-8", "replace"),
                )
            )
        g = (
            assign_steps(ev.gpu, ev.launches, ev.steps)
            if ev.gpu.height
            else ev.gpu.with_columns(launch_ts=pl.lit(None, pl.Float64), step=pl.lit(None, pl.Int64))
        )
        rows = (
            step_rows(g, ev.steps)
            if ev.steps.height
            else pl.DataFrame(schema={"step": pl.Int64, "phase": pl.String, "seconds": pl.Float64})
        )
        rows = rows.with_columns(rank=pl.lit(rank, dtype=pl.Int64), source=pl.lit(self.name))
        lines = ev.n_events + (1 if ev.truncated else 0)
        rejected = len(rej_rows)
        yield Chunk(
            tables={"rank_times": rows} if rows.height else {},
            rejects=rejects_frame(
                [r[0] for r in rej_rows], [r[1] for r in rej_rows], [r[2] for r in rej_rows]
            )
            if rej_rows
            else None,
            lines=lines,
            rows_ok=ev.n_kept,
            rows_rejected=rejected,
            rows_skipped=lines - ev.n_kept - rejected,
        )
