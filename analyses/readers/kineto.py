"""PyTorch profiler (Kineto) Chrome traces, one JSON(.gz) per rank -> ``rank_times`` and the
``trace_*`` tables (every GPU and CPU-side event, with its step, RL stage and call stack).

A trace is one JSON object whose ``traceEvents`` array holds every event; a real one is often
hundreds of MB to GBs. It is streamed, never loaded whole:

1. the (gzip) bytes are decompressed in bounded chunks (``zlib.decompressobj``, so a cut gzip
   still yields every byte before the cut);
2. each chunk is split into whole events with a vectorized structural scan (numpy: unescaped
   quotes -> in-string mask -> bracket depth; the commas at depth 0 of the array separate
   events), the way simdjson's stage 1 does it — no Python loop per event or per byte;
3. the events of the chunk become NDJSON and Polars' ``read_ndjson`` parses only the fields the
   analyses need (ph, cat, name, ts, dur, pid, tid, args.stream/correlation/device/bytes/bandwidth);
4. complete events (``ph: X`` with ts, dur and cat) are kept as a few Polars columns: GPU events
   (a ``stream`` and a ``correlation``) and CPU-side ones ("ops": cpu_op, user_annotation,
   cuda_runtime, python_function, gpu_user_annotation, ...). Memory is bounded by the chunk plus
   those columns of one rank (about 100 bytes an event; HTA's pandas frames hold ~1 KB an event).

The per-rank model (steps, RL stages, HTA's window, call stacks) is :mod:`analyses.trace.model`;
the per-step breakdown in ``rank_times`` is :mod:`analyses.kineto_breakdown` (HTA's definitions).

Line accounting (``lines`` = trace events): complete events are ``rows_ok`` (each is a row of
``trace_kernels`` or ``trace_ops``); every other event (metadata ``M``, flows ``s``/``f``, instant
and counter events, the ``Trace`` span, an event without ts/dur/cat) is ``rows_skipped`` by the
documented rule "not a complete event: no duration to analyse" (HTA drops the same events).

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
from typing import TYPE_CHECKING

import polars as pl

from analyses.kineto_breakdown import has_sub_us, hta_round, step_rows
from analyses.readers import limits
from analyses.readers.base import Chunk, FileContext, ReaderBase, UnreadableFile, rejects_frame
from analyses.readers.json_scan import ScanState, Structure, structure
from analyses.trace.model import GPU_SCHEMA, OPS_SCHEMA, RankTrace, build, profiler_steps

if TYPE_CHECKING:  # numpy is imported where it is used: detection never needs it
    import numpy as np

READ_BYTES = 4 << 20  # compressed bytes per read
FEED_BYTES = 64 << 10  # compressed bytes per decompress call: corrupt data loses only its slice
CHUNK_BYTES = 16 << 20  # decompressed bytes per structural scan (~4x that in scratch)
SLICE_ROWS = 65_536  # trace_kernels / trace_ops rows per staged batch
MAX_META_BYTES = 8 << 20  # cap on text kept outside traceEvents (head/tail metadata: a few KB in real traces)

_EVENT_SCHEMA = {
    "ph": pl.String,
    "cat": pl.String,
    "name": pl.String,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "pid": pl.String,  # ints in most traces, strings in some ("Spans"): kept as written
    "tid": pl.String,
    # strings: some traces write non-numeric streams; HTA treats those as "not a GPU event"
    "args": pl.Struct({"stream": pl.String, "correlation": pl.String, "device": pl.String, "bytes": pl.String,
                       "memory bandwidth (GB/s)": pl.String}),
}
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_TRACE_EVENTS = b'"traceEvents"'
_ARRAY_OPEN = re.compile(rb"\s*:\s*\[")

_COMMA = 44


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
        cap, total = limits.current().gzip_cap(path.stat().st_size), 0
        while raw := fh.read(READ_BYTES):
            for at in range(0, len(raw), FEED_BYTES):
                for out in gz.feed(raw[at : at + FEED_BYTES]):
                    total += len(out)
                    if total > cap:
                        raise UnreadableFile(
                            f"gzip inflates beyond {cap} bytes ({limits.current().gzip_max_ratio}x its compressed "
                            "size): refused as a possible gzip bomb"
                        )
                    yield out, False
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


def _ndjson(seg: np.ndarray, st: Structure, offset: int, start_depth: int) -> np.ndarray:
    """``seg`` (bytes ``offset..`` of the scanned buffer) as NDJSON: the commas between events
    (depth 0, outside strings) become line breaks; raw newlines, which cannot occur inside JSON
    strings, are whitespace and become spaces."""
    import numpy as np

    seg = seg.copy()
    commas = np.flatnonzero((seg == _COMMA) & st.outside[offset : offset + seg.size])
    seps = commas[st.depth_before(commas + offset, start_depth) == 0]
    seg[(seg == 10) | (seg == 13)] = 32
    seg[seps] = 10
    return seg


def _count_records(block: np.ndarray) -> int:
    """Non-blank lines of an NDJSON block."""
    import numpy as np

    if block.size == 0:
        return 0
    nonblank = ~((block == 32) | (block == 9) | (block == 10) | (block == 13))
    starts = np.concatenate(([0], np.flatnonzero(block == 10) + 1))
    starts = starts[starts < block.size]
    return int(np.count_nonzero(np.logical_or.reduceat(nonblank, starts)))


@dataclass
class _Split:
    """Streaming splitter state for one file: the bytes of the trace go in chunk by chunk, each
    byte is scanned once (the scan state is carried over), and NDJSON blocks of complete events
    come out. An event longer than the line limit is passed without being held and rejected."""

    max_event: int = field(default_factory=lambda: limits.current().max_line_bytes)
    head: bytearray = field(default_factory=bytearray)  # text before the "traceEvents" key
    _key_at: int = 0
    tail: bytearray = field(default_factory=bytearray)  # text after the array
    carry: bytearray = field(default_factory=bytearray)  # NDJSON bytes of the event in progress
    state: ScanState = field(default_factory=ScanState)  # depth 0: between events of the array
    phase: str = "head"  # head | events | tail
    n_events: int = 0
    oversized: list | None = None  # [event_no, bytes so far, head] of an event being passed
    refused: list[tuple[int, str, str]] = field(default_factory=list)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Consume decompressed bytes; return (number of its first event, NDJSON block) pairs."""
        if self.phase == "tail":
            if len(self.tail) < MAX_META_BYTES:
                self.tail += data[: MAX_META_BYTES - len(self.tail)]
            return []
        if self.phase == "head":
            self.head += data
            pos = self._find_array_start()
            if pos is None:
                if len(self.head) > MAX_META_BYTES:
                    raise UnreadableFile(
                        f"no traceEvents array in the first {MAX_META_BYTES >> 20} MiB: not a Kineto trace"
                    )
                return []
            data = bytes(self.head[pos:])
            del self.head[self._key_at :]
            self.phase = "events"
        return self._events(data)

    def _find_array_start(self) -> int | None:
        import numpy as np
        buf = bytes(self.head)
        keys = [m.start() for m in re.finditer(re.escape(_TRACE_EVENTS), buf)]
        if not keys:
            return None
        st = structure(np.frombuffer(buf, dtype=np.uint8, count=keys[-1] + 1))  # one scan for every candidate
        depth = st.depth_before(np.array(keys))
        for k, d in zip(keys, depth, strict=True):
            # the key's opening quote is itself a quote, so test the byte before it
            if k > 0 and d == 1 and st.outside[k - 1]:
                m = _ARRAY_OPEN.match(buf, k + len(_TRACE_EVENTS))
                if m is not None:
                    self._key_at = k
                    return m.end()
                if len(buf) - k < 256:  # the ':' and '[' may not have arrived yet
                    return None
        return None

    def _events(self, data: bytes) -> list[tuple[int, bytes]]:
        import numpy as np
        if not data:
            return []
        arr = np.frombuffer(data, dtype=np.uint8)
        start_depth = self.state.depth
        st = structure(arr, self.state)
        self.state = st.end
        closed = st.brackets[st.depth < 0]
        end_of_array = int(closed[0]) if closed.size else -1
        region = arr.size if end_of_array < 0 else end_of_array
        ends = st.brackets[(st.depth == 0) & (st.brackets < region)]  # a close bracket back at depth 0
        begin = 0
        if self.oversized is not None:
            if not ends.size:  # still inside the over-long event
                self.oversized[1] += region
                return self._after(end_of_array, data)
            self.oversized[1] += int(ends[0]) + 1
            self._refuse_oversized()
            begin, ends = int(ends[0]) + 1, ends[1:]
        out: list[tuple[int, bytes]] = []
        if ends.size:
            stop = int(ends[-1]) + 1
            block = np.concatenate((np.frombuffer(bytes(self.carry), dtype=np.uint8),
                                    _ndjson(arr[begin:stop], st, begin, start_depth)))
            self.carry = bytearray()
            n = _count_records(block)
            out.append((self.n_events + 1, self._drop_long(block, self.n_events + 1)))
            self.n_events += n
            begin = stop
        if end_of_array < 0:
            self.carry += _ndjson(arr[begin:region], st, begin, start_depth).tobytes()
            if len(self.carry) > self.max_event:
                self.oversized = [self.n_events + 1, len(self.carry), bytes(self.carry[:2000])]
                self.carry = bytearray()
        return out + self._after(end_of_array, data)

    def _drop_long(self, block: np.ndarray, first_no: int) -> bytes:
        """``block`` without its events longer than the limit (rejected; rare path)."""
        import numpy as np

        nl = np.flatnonzero(block == 10)
        lens = np.diff(np.concatenate(([-1], nl, [block.size]))) - 1
        if not (lens > self.max_event).any():
            return block.tobytes()
        kept, no = [], first_no
        for line in block.tobytes().split(b"\n"):
            if not line.strip():
                continue
            if len(line) > self.max_event:
                self.refused.append((no, f"line_too_long: event of {len(line)} bytes, over the {self.max_event}-byte "
                                     "limit; not read", line[:500].decode("utf-8", "replace")))
                kept.append(b"{}")  # keeps the events after it at their numbers; selects nothing
            else:
                kept.append(line)
            no += 1
        return b"\n".join(kept)

    def _after(self, end_of_array: int, data: bytes) -> list[tuple[int, bytes]]:
        if end_of_array >= 0:
            self.phase = "tail"
            self.tail += data[end_of_array + 1 :][:MAX_META_BYTES]
            self.carry = bytearray()
        return []

    def _refuse_oversized(self) -> None:
        no, n, head = self.oversized
        self.refused.append((no, f"line_too_long: event of {n} bytes, over the {self.max_event}-byte limit; not read",
                             head.lstrip(b" \t\r\n,")[:500].decode("utf-8", "replace")))
        self.n_events += 1
        self.oversized = None

    def partial(self) -> bytes:
        """What is left of a cut event (empty when the cut fell between events)."""
        if self.oversized is not None:
            return self.oversized[2].lstrip(b" \t\r\n,")
        return bytes(self.carry).lstrip(b" \t\r\n,")

    def metadata(self) -> dict:
        """The trace's top-level fields except traceEvents (distributedInfo, deviceProperties, ...)."""
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = bytes(self.tail).decode("utf-8", errors="replace").strip()
        for text in (head + '"traceEvents": []' + tail, head + '"traceEvents": []}'):
            try:
                meta = json.loads(text)
            except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
                continue
            return meta if isinstance(meta, dict) else {}
        return {}


@dataclass
class RankEvents:
    """The complete events of one rank (times in µs): ``gpu`` and ``ops`` frames
    (:data:`analyses.trace.model.GPU_SCHEMA` / ``OPS_SCHEMA``), with their event number ``ev``."""

    gpu: pl.DataFrame
    ops: pl.DataFrame
    metadata: dict
    n_events: int  # complete events in the file
    truncated: bool
    partial: bytes
    ns_resolution: bool  # sub-microsecond timestamps (rounded as HTA does unless rounding="none")
    bad_blocks: list[tuple[int, str, str]] = field(default_factory=list)  # (event_no, reason, raw)

    @property
    def n_kept(self) -> int:
        return self.gpu.height + self.ops.height

    @property
    def steps(self) -> pl.DataFrame:
        """ProfilerStep windows: step, ts, dur."""
        return profiler_steps(self.ops)

    @property
    def launches(self) -> pl.DataFrame:
        """CPU-side events with a correlation (the launches of GPU work): ev, ts, correlation."""
        return self.ops.filter(pl.col("correlation") >= 0).select("ev", "ts", "correlation")


_PARSE_ERRORS = (pl.exceptions.PolarsError, pl.exceptions.PanicException)


def _read_events(data: bytes) -> pl.DataFrame:
    return pl.read_ndjson(io.BytesIO(data), schema=_EVENT_SCHEMA, ignore_errors=True)


def _parse_block(block: bytes, first_event_no: int) -> tuple[pl.DataFrame, list[tuple[int, str, str]]]:
    """Parse an NDJSON block of events (column ``ev``: each one's number in the file); an event
    the parser refuses (broken JSON, NaN, invalid UTF-8, nested too deep) is rejected on its own.

    Rare path: when the block fails, it is bisected (halves parsed again) down to the bad
    events, so k bad events among n cost O(k log n) parses, each by the same parser."""
    try:
        return _numbered(_read_events(block), first_event_no), []
    except _PARSE_ERRORS:
        pass
    lines = [ln for ln in block.split(b"\n") if ln.strip()]
    frames: list[pl.DataFrame] = []
    bad: list[tuple[int, str, str]] = []

    def bisect(lo: int, hi: int) -> None:
        try:
            frames.append(_numbered(_read_events(b"\n".join(lines[lo:hi])), first_event_no + lo))
            return
        except _PARSE_ERRORS as exc:
            if hi - lo == 1:
                why = str(exc).replace("\n", " ")[:200]
                bad.append((first_event_no + lo, f"bad_event_json: {why}", lines[lo][:500].decode("utf-8", "replace")))
                return
        mid = (lo + hi) // 2
        bisect(lo, mid)
        bisect(mid, hi)

    if lines:
        bisect(0, len(lines))
    df = pl.concat(frames) if frames else _numbered(pl.DataFrame(schema=_EVENT_SCHEMA), first_event_no)
    return df, bad


def _numbered(df: pl.DataFrame, first_no: int) -> pl.DataFrame:
    return df.with_columns(ev=pl.int_range(pl.len(), dtype=pl.Int64) + first_no)


def _select(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(gpu, ops) of a parsed block: the complete events, only the needed columns."""
    args = pl.col("args").struct
    a = df.lazy().with_columns(
        stream=args.field("stream").cast(pl.Int64, strict=False),
        correlation=args.field("correlation").cast(pl.Int64, strict=False),
        device=args.field("device").cast(pl.Int64, strict=False),
    )
    x = a.filter(
        (pl.col("ph") == "X")
        & pl.col("dur").is_not_null()
        & pl.col("ts").is_not_null()
        & pl.col("cat").is_not_null()
        & (pl.col("cat") != "Trace")  # the whole-trace span (HTA drops it too)
    )
    is_gpu = ((pl.col("stream") >= 0) & (pl.col("correlation") >= 0)).fill_null(False)
    gpu = x.filter(is_gpu).select(
        *GPU_SCHEMA.keys() - {"bytes", "memory_bw_gbps"},
        bytes=args.field("bytes").cast(pl.Int64, strict=False),
        memory_bw_gbps=args.field("memory bandwidth (GB/s)").cast(pl.Float64, strict=False),
    ).select(list(GPU_SCHEMA))
    ops = x.filter(~is_gpu).select(list(OPS_SCHEMA))
    # names repeat across millions of events: kept Categorical (about 100 bytes an event less than
    # String here, whose views pin the parser's buffers); the tables get them back as String
    text = [pl.col("cat", "name", "pid", "tid").cast(pl.Categorical), pl.col("ev").cast(pl.Int32)]
    g, o = pl.collect_all([gpu.with_columns(text), ops.with_columns(text)])
    return g, o


def load_rank_events(path: Path, chunk_bytes: int = CHUNK_BYTES, rounding: str = "hta") -> RankEvents:
    """Stream one rank's trace into the frames the analyses need.

    ``rounding="hta"`` rounds ns-resolution traces to whole µs as HTA does (see
    :func:`analyses.kineto_breakdown.hta_round`); ``"none"`` keeps the exact times. Timestamps
    are microseconds whatever the trace's ``displayTimeUnit`` says: the Chrome trace format
    defines ``ts``/``dur`` in µs, and ``displayTimeUnit`` ("ms" or "ns") only tells a viewer how
    to label them.
    """
    split = _Split()
    gpu, ops, bad = [], [], []
    cut = False
    for data, was_cut in _decompressed_chunks(path, chunk_bytes):
        cut = cut or was_cut
        for first_no, block in split.feed(data):
            df, b = _parse_block(block, first_no)
            bad.extend(b)
            g, o = _select(df)
            gpu.append(g)
            ops.append(o)
    if split.phase == "head":
        raise UnreadableFile("no traceEvents array found: not a Kineto trace, or cut before its events")
    bad.extend(split.refused)
    truncated = cut or split.phase == "events"
    g = pl.concat(gpu) if gpu else pl.DataFrame(schema=GPU_SCHEMA)
    o = pl.concat(ops) if ops else pl.DataFrame(schema=OPS_SCHEMA)
    ns = has_sub_us(g["ts"]) or has_sub_us(o["ts"]) or has_sub_us(g["dur"]) or has_sub_us(o["dur"])
    if rounding == "hta" and ns:
        g, o = hta_round(g), hta_round(o)
    return RankEvents(
        gpu=g,
        ops=o,
        metadata=split.metadata(),
        n_events=split.n_events,
        truncated=truncated,
        partial=split.partial(),
        ns_resolution=ns,
        bad_blocks=bad,
    )


_MAX_RANK = 2**31 - 1  # a rank past this is a corrupt value, not a rank


def rank_of(meta: dict, path: Path) -> int | None:
    """Rank from ``distributedInfo.rank``, else from the file name (a non-negative Int32 only)."""
    info = meta.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank <= _MAX_RANK:
        return rank
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m and int(m.group(1)) <= _MAX_RANK else None


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
        n_events, n_kept, truncated = ev.n_events, ev.n_kept, ev.truncated
        rej_rows = list(ev.bad_blocks)
        if ev.truncated:
            rej_rows.append(
                (
                    ev.n_events + 1,
                    "truncated_trace: file ends inside traceEvents (cut write, truncated or corrupt gzip); complete events before the cut kept",
                    ev.partial[:500].decode("utf-8", "replace"),
                )
            )
        rt = build(ev.gpu, ev.ops)
        tables = trace_tables(rt, ev, rank, ctx.rel_path)
        del rt, ev  # the tables hold what is left
        lines = n_events + (1 if truncated else 0)
        rejected = len(rej_rows)
        ops, kernels = tables.pop("trace_ops"), tables.pop("trace_kernels")
        yield Chunk(
            tables={k: v for k, v in tables.items() if v.height},
            rejects=rejects_frame(
                [r[0] for r in rej_rows], [r[1] for r in rej_rows], [r[2] for r in rej_rows]
            )
            if rej_rows
            else None,
            lines=lines,
            rows_ok=n_kept,
            rows_rejected=rejected,
            rows_skipped=lines - n_kept - rejected,
        )
        # a trace's events are staged in slices, so each slice's Arrow copy (the Parquet writer's
        # input, names spelled out) is small; the slices share the frames' memory
        ids = {"rank": pl.lit(rank, dtype=pl.Int64), "path": pl.lit(ctx.rel_path, dtype=pl.String)}
        for name, frame in (("trace_kernels", kernels), ("trace_ops", ops)):
            for at in range(0, frame.height, SLICE_ROWS):
                yield Chunk(tables={name: frame.slice(at, SLICE_ROWS).with_columns(**ids)})


_KIND_OF_TYPE = {"COMPUTATION": "compute", "COMMUNICATION": "comm", "MEMORY": "memcpy", "OTHER": "other"}


def trace_tables(rt: RankTrace, ev: RankEvents, rank: int | None, path: str) -> dict[str, pl.DataFrame]:
    """The rows one rank's trace adds to ``rank_times`` and the ``trace_*`` tables (``trace_kernels``
    and ``trace_ops`` without their ``rank`` and ``path``, which the reader adds slice by slice)."""
    r = pl.lit(rank, dtype=pl.Int64)
    k = rt.kernels
    steps = ev.steps
    if steps.height:
        g = k.select(ts="ts_us", dur="dur_us", step="step",
                     kind=pl.col("kernel_type").replace_strict(_KIND_OF_TYPE, return_dtype=pl.String))
        times = step_rows(g, steps).with_columns(rank=r, source=pl.lit(KinetoTraceReader.name))
    else:
        times = pl.DataFrame(schema={"step": pl.Int64, "phase": pl.String, "seconds": pl.Float64})
    meta = ev.metadata
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    world = info.get("world_size")
    base_ns = meta.get("baseTimeNanoseconds")
    unit = meta.get("displayTimeUnit")
    ranks = pl.DataFrame([{
        "rank": rank,
        "world_size": world if isinstance(world, int) and not isinstance(world, bool) and 0 < world < 2**31 else None,
        "n_events": ev.n_events,
        "ns_resolution": ev.ns_resolution,
        "display_time_unit": unit if isinstance(unit, str) else None,
        "base_time_ns": base_ns if isinstance(base_ns, int) and not isinstance(base_ns, bool) and abs(base_ns) < 2**63 else None,
        "truncated": ev.truncated,
        "path": path,
        **rt.facts,
    }])
    return {
        "rank_times": times,
        "trace_ranks": ranks,
        "trace_kernels": k,
        "trace_ops": rt.ops,
    }
