"""Cluster utilization tables into ``gpu_samples``: long (one row per host x time) and wide (one
column per host or host-GPU, as AcmeTrace publishes its DCGM data).

Long (``value,timestamp_anon,container_ip`` - Alibaba GenAI ``pod_gpu_duty_cycle``): columns are
recognized by name - a time column (``timestamp*``/``time*``/``ts``), a value column (``value``,
``*util*``, ``*duty*``), a host column (``container*``, ``pod*``, ``host*``, ``node*``,
``instance*``, ``ip*``, ``machine*``), optionally ``gpu`` and ``metric``; every column must be
one of these (the sniffer is strict so generic metric CSVs go to their own reader).
``host`` = the container/pod; ``gpu`` = the ``gpu`` column, else ``"all"`` (the value is per
container, whatever number of GPUs it holds).

Wide (``Time,10.0.0.1-0,10.0.0.1-1,...``): first column a time, every other column either
``<host>-<gpu index>`` or an IPv4 address (then ``gpu`` = ``"all"``). Empty cells write no sample.

Both: the metric comes from the ``metric`` column, else from the file name
(:func:`analyses.telemetry_units.stem_metric`: ``duty_cycle``/``GPU_UTIL`` -> ``gpu_util_pct``,
``SM_ACTIVE`` -> ``sm_active_pct`` as ratio x100, ...), else the file stem verbatim. Timestamps
are epoch seconds/ms/us (by magnitude) or date-time text. Lines whose field count is wrong,
whose time or value does not parse, are rejected; time going backwards or repeating for a
host/GPU rejects the line (telemetry_units). A value that is an N/A marker (``N/A``, ``-``, an
empty cell, ...: ``telemetry_units.NA_MARKERS``) writes no sample, and its line still counts as
parsed. Blank lines are skipped. Reading is columnar, ``LINE_CHUNK`` lines at a time.

``.tar.gz``/``.tgz``/``.tar`` archives (the Alibaba trace ships as one) are read member by member,
streamed: CSV members in the sniffed layout are parsed, other members' lines are skipped. A member
whose bytes equal a file of the same run beside the archive (same name, same size, same sha256 -
the archive's own extracted copy) is skipped whole (its lines count as skipped) so the run does
not hold every sample twice; an archive ingested on its own (or without its copy among the run's
files) reads every member, whatever lies beside it on disk. Line numbers run on across members.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import polars as pl

from analyses.readers import limits
from analyses.readers.base import (
    Chunk,
    FileContext,
    ReaderBase,
    UnreadableFile,
    accounted_chunk,
    epoch_in_range,
)
from analyses.readers.lines import line_frames, stream_line_frames
from analyses.telemetry_units import (
    LINE_CHUNK,
    NA_MARKERS,
    SeriesClock,
    epoch_to_ts,
    manifest_timezone,
    parse_ts_any,
    stem_metric,
    unit_factor,
)

SOURCE_LONG = "cluster_util_long"
SOURCE_WIDE = "cluster_util_wide"

_HOST_PREFIXES = ("container", "pod", "host", "node", "instance", "ip", "machine")
_HOST_GPU = re.compile(r"^(.+)-(\d+)$")
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")


def _role(col: str) -> str | None:
    c = col.strip().strip('"').lower()
    if c in ("timestamp", "time", "ts", "datetime", "date_time") or c.startswith(("timestamp", "time_")):
        return "time"
    if c in ("value", "val") or "util" in c or "duty" in c:
        return "value"
    if c.startswith(_HOST_PREFIXES):
        return "host"
    if c in ("gpu", "gpu_index", "gpu_id", "gpu_idx"):
        return "gpu"
    if c in ("metric", "metric_name"):
        return "metric"
    return None


def long_layout(header: str) -> dict[str, int] | None:
    cols = header.lstrip("\ufeff").split(",")
    roles = [_role(c) for c in cols]
    if None in roles or len(set(roles)) != len(roles) or not {"time", "value", "host"} <= set(roles):
        return None
    return {r: i for i, r in enumerate(roles) if r is not None}


def wide_layout(header: str) -> list[str] | None:
    cols = [c.strip().strip('"') for c in header.lstrip("\ufeff").split(",")]
    if len(cols) < 2 or _role(cols[0]) != "time" and cols[0].lower() not in ("date",):
        return None
    rest = cols[1:]
    if all(_HOST_GPU.match(c) for c in rest) or all(_IPV4.match(c) for c in rest):
        return cols
    return None


def _tar_first_lines(head: str) -> list[str] | None:
    """First lines of the members whose data starts inside ``head`` when ``head`` is the start
    of a tar stream (walking the 512-byte member headers); None when it is not a tar."""
    if len(head) < 600 or head[257:262] != "ustar":
        return None
    out, off = [], 0
    while off + 512 <= len(head) and head[off + 257 : off + 262] == "ustar":
        name = head[off : off + 100].split("\x00", 1)[0]
        try:
            size = int(head[off + 124 : off + 136].strip("\x00 ") or "0", 8)
        except ValueError:
            break
        start = off + 512
        if name.lower().endswith((".csv", ".txt")) and start < len(head):
            out.append(head[start:].split("\n", 1)[0].rstrip("\r"))
        off = start + (size + 511) // 512 * 512
    return out


def _sniff_layout(head: str, layout) -> bool:
    members = _tar_first_lines(head)
    if members is None:
        return layout(_first_line(head)) is not None
    return any(layout(line) is not None for line in members)


def _first_line(head: str) -> str:
    return head.split("\n", 1)[0].rstrip("\r")


# -------------------------------------------------------------------------------- sources


def _sha256_stream(fh) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def _is_extracted_copy(tf: tarfile.TarFile, member: tarfile.TarInfo, archive: Path, run_files: frozenset[Path]) -> bool:
    sibling = archive.parent / PurePosixPath(member.name).name
    if sibling not in run_files or not sibling.is_file() or sibling.stat().st_size != member.size:
        return False
    fh = tf.extractfile(member)
    if fh is None:
        return False
    with open(sibling, "rb") as sf:
        return _sha256_stream(fh) == _sha256_stream(sf)


def _count_lines(fh) -> int:
    n, last = 0, b"\n"
    for block in iter(lambda: fh.read(1 << 20), b""):
        n += block.count(b"\n")
        last = block[-1:]
    return n + (last != b"\n")


def iter_sources(
    path: Path, accepts, chunk_lines: int = LINE_CHUNK, run_files: frozenset[Path] = frozenset()
) -> Iterator[tuple[str, Iterator[pl.DataFrame] | None, int]]:
    """(name, line batches or None when skipped, lines of a skipped member) per CSV source in
    ``path``: the file itself, or each member of a tar archive. ``accepts(header)`` says
    whether a member's first line is in this reader's layout; a member whose extracted copy is
    one of ``run_files`` is skipped. Consume each member's batches before asking for the next."""
    if not tarfile.is_tarfile(path):
        yield path.name, line_frames(path, chunk_lines), 0
        return
    consumed = [0]  # lines of earlier members, so line numbers run on across the archive
    cap = limits.current().gzip_cap(path.stat().st_size)
    inflated = 0  # member bytes so far: a tar.gz bomb is refused before its members are read
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                fh = tf.extractfile(member) if member.isfile() else None
                if fh is None:
                    continue
                inflated += member.size
                if inflated > cap:
                    raise UnreadableFile(
                        f"archive members hold over {cap} bytes ({limits.current().gzip_max_ratio}x the "
                        "archive's size): refused as a possible archive bomb"
                    )
                first = fh.readline(1 << 16).decode("utf-8", errors="replace").rstrip("\r\n")
                fh.seek(0)
                if (
                    not member.name.lower().endswith((".csv", ".txt"))
                    or not accepts(first)
                    or _is_extracted_copy(tf, member, path, run_files)
                ):
                    n = _count_lines(fh)
                    consumed[0] += n
                    yield member.name, None, n
                    continue
                yield member.name, stream_line_frames(fh, member.name, consumed, chunk_lines), 0
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise UnreadableFile(f"broken archive: {exc}") from exc


# ------------------------------------------------------------------------------------ long


def _metric_for(stem: str) -> tuple[str, float]:
    m = stem_metric(stem)
    if m is None:
        return stem, 1.0
    # cluster traces export the dcgm field as dcgm writes it (PROF ratios 0..1, energy in mJ)
    return m.canonical, unit_factor(m.dcgm_unit, m.unit) or 1.0


def _fields(n: int) -> pl.Expr:
    return pl.col("line").str.split(",")


def _cell(i: int) -> pl.Expr:
    return pl.col("_p").list.get(i, null_on_oob=True).str.strip_chars().str.strip_chars('"')


def _ts_expr(d: pl.DataFrame, cell: pl.Expr, tz: str | None) -> pl.Expr:
    """Epoch numbers when every time cell of this batch is one (the common case, and ~3x
    cheaper than trying the text formats), else text-or-epoch per cell. A number no epoch can be
    (``1e30``, ``inf``, ``nan``) gives a null time (the line is rejected), not a failed file."""
    num = cell.cast(pl.Float64, strict=False)
    text = d.select((num.is_null() & cell.is_not_null() & (cell != "")).sum()).item()
    if text == 0:
        return epoch_to_ts(epoch_in_range(num))
    return parse_ts_any(pl.when(num.is_null() | epoch_in_range(num).is_not_null()).then(cell), tz)


def _finish(batch: pl.DataFrame, samples: pl.DataFrame, bad: pl.DataFrame, skipped: int, source: str) -> Chunk:
    """The batch's chunk: ``bad`` lines (with ``_reason``) rejected, ``skipped`` skipped, the
    rest parsed into ``samples``."""
    rows = samples.with_columns(source=pl.lit(source))
    return accounted_chunk(batch.height, "gpu_samples", rows, bad.select("line_no", "line", reason="_reason"), skipped)


def _read(ctx: FileContext, layout_of, kind: str, clock_keys: list[str], chunk) -> Iterator[Chunk]:
    """The read loop of both layouts: per CSV source, its header line (skipped) gives the
    layout, then every batch goes through ``chunk(batch, body, skipped, layout, metric, factor,
    tz, clock)``; a skipped archive member is one chunk of skipped lines."""
    tz = manifest_timezone(ctx.manifest)
    for name, batches, n_skip in iter_sources(ctx.path, lambda h: layout_of(h) is not None, run_files=ctx.run_files):
        if batches is None:
            yield Chunk(lines=n_skip, rows_skipped=n_skip)
            continue
        metric, factor = _metric_for(PurePosixPath(name).stem)
        clock = SeriesClock(clock_keys)
        layout = None
        for batch in batches:
            body, skipped = batch, 0
            if layout is None:
                layout = layout_of(batch["line"][0])
                if layout is None:
                    raise UnreadableFile(f"{name}: header is not a {kind} utilization table")
                dup = _duplicate_column(layout)
                if dup is not None:  # two columns for one GPU: which value is its would be a guess
                    raise UnreadableFile(f"{name}: header names column {dup!r} twice")
                body, skipped = batch.slice(1), 1
            yield chunk(batch, body, skipped, layout, metric, factor, tz, clock)


def _duplicate_column(layout: list[str] | dict[str, int]) -> str | None:
    if not isinstance(layout, list):
        return None  # the long layout's roles are unique by construction
    seen: set[str] = set()
    for c in layout:
        if c in seen:
            return c
        seen.add(c)
    return None


def _clock_split(d: pl.DataFrame, clock: SeriesClock, keys: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(good, bad) rows of ``d``: rows with a ``_reason`` are bad, then the clock check (time
    going backwards or repeating per series ``keys``) moves more of the rest to bad."""
    good = d.filter(pl.col("_reason").is_null())
    good = good.with_columns(_reason=clock.check(good.select(*keys, "ts")))
    bad = pl.concat([d.filter(pl.col("_reason").is_not_null()), good.filter(pl.col("_reason").is_not_null())])
    return good.filter(pl.col("_reason").is_null()), bad


class ClusterUtilLongReader(ReaderBase):
    name = SOURCE_LONG
    reads_siblings = True  # an archive member with an extracted copy beside it is skipped

    def sniff(self, head: str, path: Path) -> bool:
        return _sniff_layout(head, long_layout)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        return _read(ctx, long_layout, "long", ["host", "gpu", "metric"], self._chunk)

    def _chunk(self, batch, body, skipped, layout, metric, factor, tz, clock) -> Chunk:
        blank = body.filter(pl.col("line").str.strip_chars() == "")
        body = body.filter(pl.col("line").str.strip_chars() != "")
        n = len(layout)
        d = body.with_columns(_p=_fields(n))
        cell = lambda role: _cell(layout[role])  # noqa: E731
        raw_v = cell("value")
        d = d.with_columns(
            host=cell("host"),
            gpu=cell("gpu") if "gpu" in layout else pl.lit("all"),
            metric=cell("metric") if "metric" in layout else pl.lit(metric),
            ts=_ts_expr(d, cell("time"), tz),
            value=raw_v.cast(pl.Float64, strict=False) * factor,
            _na=raw_v.is_in(list(NA_MARKERS)),
        )
        reason = (
            pl.when(pl.col("_p").list.len() != n)
            .then(pl.format("expected {} fields, got {}", pl.lit(n), pl.col("_p").list.len()))
            .when(pl.col("ts").is_null())
            .then(pl.lit("unparseable timestamp"))
            .when(pl.col("host").is_null() | (pl.col("host") == ""))
            .then(pl.lit("missing host"))
            .when(pl.col("value").is_null() & ~pl.col("_na"))
            .then(pl.lit("non-numeric value"))
        )
        d = d.with_columns(_reason=reason)
        good, bad = _clock_split(d, clock, ["host", "gpu", "metric"])
        good = good.filter(pl.col("value").is_not_null())  # an N/A value: parsed, no sample
        samples = good.select("host", "gpu", "ts", "metric", "value")
        return _finish(batch, samples, bad, skipped + blank.height, SOURCE_LONG)


# ------------------------------------------------------------------------------------ wide


class ClusterUtilWideReader(ReaderBase):
    name = SOURCE_WIDE
    reads_siblings = True  # an archive member with an extracted copy beside it is skipped

    def sniff(self, head: str, path: Path) -> bool:
        return _sniff_layout(head, wide_layout)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        return _read(ctx, wide_layout, "wide", ["_k"], self._chunk)

    def _chunk(self, batch, body, skipped, cols, metric, factor, tz, clock) -> Chunk:
        blank = body.filter(pl.col("line").str.strip_chars() == "")
        body = body.filter(pl.col("line").str.strip_chars() != "")
        n = len(cols)
        d = body.with_columns(_p=_fields(n))
        cell = _cell
        vals = {f"_v{i}": pl.when(~cell(i).is_in(list(NA_MARKERS))).then(cell(i)) for i in range(1, n)}
        d = d.with_columns(ts=_ts_expr(d, cell(0), tz), **vals)
        nums = {k: pl.col(k).cast(pl.Float64, strict=False) for k in vals}
        non_numeric = pl.any_horizontal([pl.col(k).is_not_null() & nums[k].is_null() for k in vals])
        reason = (
            pl.when(pl.col("_p").list.len() != n)
            .then(pl.format("expected {} fields, got {}", pl.lit(n), pl.col("_p").list.len()))
            .when(pl.col("ts").is_null())
            .then(pl.lit("unparseable timestamp"))
            .when(non_numeric)
            .then(pl.lit("non-numeric value"))
        )
        d = d.with_columns(_reason=reason, _k=pl.lit(0), **{k: e * factor for k, e in nums.items()})
        good, bad = _clock_split(d, clock, ["_k"])
        long = (
            good.select("ts", *vals)
            .rename({f"_v{i}": cols[i] for i in range(1, n)})
            .unpivot(index="ts", variable_name="_col", value_name="value")
            .filter(pl.col("value").is_not_null())
        )
        hg = pl.col("_col").str.extract_groups(r"^(.+)-(\d+)$")
        samples = long.select(
            host=pl.coalesce(hg.struct.field("1"), pl.col("_col")),
            gpu=pl.coalesce(hg.struct.field("2"), pl.lit("all")),
            ts="ts",
            metric=pl.lit(metric),
            value="value",
        )
        return _finish(batch, samples, bad, skipped + blank.height, SOURCE_WIDE)
