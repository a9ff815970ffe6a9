"""nvidia-smi telemetry: ``--query-gpu=... --format=csv`` logs and ``nvidia-smi dmon`` output.

Both go to ``gpu_samples`` in long form (host, gpu, ts, metric, value) with canonical metric
names and units from :mod:`analyses.telemetry_units`.

Rules (CSV):
* Any column set. The header (``timestamp, memory.used [MiB], utilization.gpu [%]``) names the
  columns; a header line met again mid-file (the logger restarted, maybe with other columns)
  is skipped and applies to the lines after it. Blank lines are skipped.
* Units may sit in the header (``[MiB]``), in the cells (``17092 MiB``), or nowhere
  (``nounits``: the header unit, else the metric's canonical unit, applies).
* ``gpu`` is the first of the id columns ``index``, ``uuid``, ``pci.bus_id``, ``gpu``, ``gpu_id``,
  ``gpu_index`` that tells apart the lines of a query pass (the lines that share a timestamp: one
  per GPU), i.e. takes several values within at least half of the passes of several lines. A header
  can be wrong about its columns: a real 8-GPU capture headed ``timestamp,gpu,index,memory.used,...``
  holds 0 in every row of ``index`` while the column headed ``gpu`` cycles 0..7 within each
  timestamp; taking ``index`` made the 8 GPUs one and rejected 7 of 8 lines as repeated times. So a
  column that is constant within the passes is not the id; the one that tells their lines apart is
  (decided on the first passes of several lines, kept for the rest of the header's lines; a pass
  that repeats one GPU's line is a duplicate, rejected). With no such column, the lines of one query
  pass come in index order, so the k-th line of a run of equal timestamps is GPU k when the
  file's passes typically hold >= 2 lines; a log whose passes hold one line is one GPU ``"0"``
  (see :class:`_Passes`).
* Only nvidia-smi's query fields become metrics (``nvidia-smi --help-query-gpu``: the canonical
  ones of :mod:`analyses.telemetry_units`, others such as ``clocks_event_reasons.*`` verbatim when
  numeric). A column that is no query field (``gpu``, ``host``, ``step``: something a logging
  script added) is never stored as a GPU metric.
* ``host`` is the file's path in the run without its suffix (``gpu_usage``): nvidia-smi does not
  print a host name, and the path keeps the samples of two nodes' files apart.
* A line is rejected (with its reason) when its field count differs from the header, its
  timestamp does not parse, a known metric's cell is not a number, or its unit is unknown.
  ``[N/A]``/``[Not Supported]`` cells write no sample. Time going backwards or repeating for a
  GPU rejects the line (see telemetry_units); a line whose cells are all N/A writes nothing and
  is not time-checked.
* Timestamps are local time without a zone: read as UTC unless run.toml has ``timezone``.

Rules (dmon): the ``# gpu pwr gtemp ...`` line names the columns, the ``# Idx W C ...`` line
gives units; both are skipped, as are other ``#`` lines; ``-`` means not measured. With
``-o DT`` the Date and Time columns give ``ts``; without them ``ts`` is null (dmon prints no
time, and inventing one from a sampling interval we do not know would mislead alignment).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, ReaderBase, accounted_chunk
from analyses.readers.lines import line_frames
from analyses.telemetry_units import (
    DMON_COLUMNS,
    NA_MARKERS,
    SMI_FIELDS,
    UNITS,
    SeriesClock,
    factor_expr,
    file_host,
    manifest_timezone,
    parse_ts_text,
)

SOURCE_CSV = "nvidia_smi_csv"
SOURCE_DMON = "nvidia_smi_dmon"

_FIELD_RE = r"^\s*[a-z][a-z0-9_]*(\.[a-z0-9_]+)*(\s*\[[^\]]*\])?\s*$"
_FIELD = re.compile(_FIELD_RE)
_SMI_PREFIXES = (
    "utilization.",
    "memory.",
    "power.",
    "temperature.",
    "clocks.",
    "fan.",
    "pcie.",
    "ecc.",
    "enforced.",
    "encoder.",
    "clocks_throttle_reasons.",
    "clocks_event_reasons.",
)
ID_FIELDS = ("index", "uuid", "pci.bus_id")
# columns that may number the GPUs, in order of trust: nvidia-smi's own ids, then the names a logging
# script gives its own GPU counter (see the module rules)
ID_CANDIDATES = (*ID_FIELDS, "gpu", "gpu_id", "gpu_index")
# nvidia-smi --help-query-gpu: field names, and the prefixes of its dotted field groups
QUERY_FIELDS = frozenset({
    "timestamp", "driver_version", "count", "name", "serial", "uuid", "index", "display_mode", "display_active",
    "persistence_mode", "addressing_mode", "vbios_version", "pstate", "compute_mode", "compute_cap",
    "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid",
})
QUERY_PREFIXES = (
    "pci.", "pcie.", "accounting.", "driver_model.", "inforom.", "gom.", "fan.", "clocks_throttle_reasons.",
    "clocks_event_reasons.", "memory.", "utilization.", "encoder.", "ecc.", "retired_pages.", "remapped_rows.",
    "temperature.", "power.", "enforced.", "clocks.", "clocks_max.", "clocks_applications.", "clocks_default_applications.",
    "mig.", "fabric.", "protected_memory.", "reset_status.", "module.", "platform.", "gsp.", "c2c.",
)
NON_METRIC = {
    "timestamp",
    "index",
    "uuid",
    "pci.bus_id",
    "name",
    "serial",
    "driver_version",
    "vbios_version",
    "pci.bus",
    "pci.domain",
    "pci.device",
    "pci.device_id",
    "pci.sub_device_id",
    "count",
}
_SAMPLE_SCHEMA = {
    "gpu": pl.String,
    "ts": pl.Datetime("us", "UTC"),
    "metric": pl.String,
    "value": pl.Float64,
    "host": pl.String,
    "source": pl.String,
}
# a number, optionally followed by a unit
_NUM_UNIT = r"^([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S.*)?$"


def _split_field(raw: str) -> tuple[str, str]:
    """``memory.used [MiB]`` -> (``memory.used``, ``MiB``)."""
    m = re.match(r"^\s*([^\[]+?)\s*(?:\[([^\]]*)\])?\s*$", raw)
    return (m.group(1), (m.group(2) or "").strip()) if m else (raw.strip(), "")


def _is_smi_header(line: str) -> bool:
    fields = [f for f in line.lstrip("\ufeff").split(",")]
    if not fields or not all(_FIELD.match(f) for f in fields):
        return False
    names = [_split_field(f)[0] for f in fields]
    return any(n in SMI_FIELDS or n.startswith(_SMI_PREFIXES) for n in names)


class NvidiaSmiCsvReader(ReaderBase):
    name = SOURCE_CSV

    def sniff(self, head: str, path: Path) -> bool:
        for line in head.splitlines():
            if line.strip():
                return _is_smi_header(line)
        return False

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        tz = manifest_timezone(ctx.manifest)
        host = file_host(ctx.rel_path)
        clock = SeriesClock(["gpu"])
        passes = _Passes()
        gpu_ids = _GpuIds()
        header: list[tuple[str, str]] | None = None
        for batch in line_frames(ctx.path):
            chunk, header = _csv_chunk(batch, header, host, tz, clock, passes, gpu_ids)
            yield chunk


# `nvidia-smi --help-query-gpu` documents ~250 fields; a fuzzed 262 KB header of 13,106 "fields"
# built that many column expressions for its one data line (2.0 GB, 5 s); memory grows with the
# fields (each a compiled regex): 512 fields read in 0.5 GB, a 20,000-line ingest of them 0.86 GB
SMI_MAX_FIELDS = 512


def _csv_chunk(
    batch: pl.DataFrame,
    header: list[tuple[str, str]] | None,
    host: str,
    tz: str | None,
    clock: SeriesClock,
    passes: _Passes,
    gpu_ids: _GpuIds,
) -> tuple[Chunk, list[tuple[str, str]] | None]:
    b = batch.with_columns(pl.col("line").str.strip_prefix("\ufeff"))
    blank = pl.col("line").str.strip_chars() == ""
    is_hdr = pl.col("line").str.split(",").list.eval(pl.element().str.contains(_FIELD_RE)).list.all()
    b = b.with_columns(_blank=blank, _hdr=is_hdr & ~blank).with_columns(_seg=pl.col("_hdr").cum_sum())
    hdr_lines = b.filter("_hdr")["line"].to_list()
    headers = [header] + [[_split_field(f) for f in h.split(",")] for h in hdr_lines]
    data = b.filter(~pl.col("_blank") & ~pl.col("_hdr"))
    samples, rejects = [], []
    for seg, hdr in enumerate(headers):
        rows = data.filter(pl.col("_seg") == seg).select("line_no", "line")
        if rows.height == 0:
            continue
        if hdr is None:
            rejects.append(rows.with_columns(reason=pl.lit("data line before any nvidia-smi header")))
            continue
        if len(hdr) > SMI_MAX_FIELDS:  # a column expression per field would cost seconds and gigabytes
            rejects.append(rows.with_columns(reason=pl.lit(
                f"its nvidia-smi header has {len(hdr)} fields, over {SMI_MAX_FIELDS}: not an nvidia-smi table")))
            continue
        ok, bad = _csv_segment(rows, hdr, host, tz, clock, passes, gpu_ids)
        samples.append(ok)
        rejects.append(bad)
    skipped = int(b["_blank"].sum() + b["_hdr"].sum())
    return _assemble(batch.height, samples, rejects, skipped), headers[-1]


def _assemble(n_lines: int, samples: list[pl.DataFrame], rejects: list[pl.DataFrame], skipped: int) -> Chunk:
    """One chunk from per-segment samples and rejects (frames of line_no, line, reason)."""
    rej = (
        pl.concat(rejects)
        if rejects
        else pl.DataFrame(schema={"line_no": pl.Int64, "line": pl.String, "reason": pl.String})
    )
    out = pl.concat(samples, how="vertical_relaxed") if samples else None
    return accounted_chunk(n_lines, "gpu_samples", out, rej, skipped)


def _csv_segment(
    rows: pl.DataFrame,
    hdr: list[tuple[str, str]],
    host: str,
    tz: str | None,
    clock: SeriesClock,
    passes: _Passes,
    gpu_ids: _GpuIds,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    names = [n for n, _ in hdr]
    d = rows.with_columns(_p=pl.col("line").str.split(","))

    def cell(i: int) -> pl.Expr:
        return pl.col("_p").list.get(i, null_on_oob=True).str.strip_chars()

    reasons: list[pl.Expr] = [
        pl.when(pl.col("_p").list.len() != len(names)).then(
            pl.format("expected {} fields, got {}", pl.lit(len(names)), pl.col("_p").list.len())
        )
    ]
    cols: dict[str, pl.Expr] = {}
    if "timestamp" in names:
        t = cell(names.index("timestamp"))
        cols["ts"] = parse_ts_text(t, tz)
        reasons.append(
            pl.when(parse_ts_text(t, tz).is_null()).then(pl.format("unparseable timestamp '{}'", t.str.slice(0, 80)))
        )
    else:
        cols["ts"] = pl.lit(None, dtype=pl.Datetime("us", "UTC"))
    ids = [f for f in ID_CANDIDATES if f in names]
    cols.update({f"_id{k}": cell(names.index(f)) for k, f in enumerate(ids)})
    metric_names: dict[str, str] = {}
    for i, (name, hunit) in enumerate(hdr):
        if name in NON_METRIC or not is_query_field(name):
            continue
        c = cell(i)
        g = c.str.extract_groups(_NUM_UNIT)
        num = g.struct.field("1").cast(pl.Float64, strict=False)
        unit = pl.coalesce(g.struct.field("2").str.strip_chars(), pl.lit(hunit))
        na = c.is_in(list(NA_MARKERS)) | c.is_null()
        m = SMI_FIELDS.get(name)
        key = f"_v{i}"
        if m is not None:
            factor = factor_expr(unit, m.unit)
            cols[key] = pl.when(~na).then(num * factor)
            reasons.append(
                pl.when(~na & num.is_null())
                .then(pl.format("non-numeric value '{}' in {}", c.str.slice(0, 80), pl.lit(name)))
                .when(~na & factor.is_null())
                .then(pl.format("unknown unit '{}' for {}", unit.str.slice(0, 80), pl.lit(name)))
            )
            metric = m.canonical if m.canonical not in metric_names.values() else name
        else:
            # a query field without a canonical name: kept verbatim when numeric (plain or a known unit)
            known_unit = unit.is_in(list(UNITS)) | (unit == "")
            cols[key] = pl.when(~na & known_unit).then(num)
            metric = name
        metric_names[key] = metric
    d = d.with_columns(_reason=pl.coalesce(reasons), **cols)
    which = gpu_ids.choose(tuple(names), ids, d)
    if which is None:
        d = d.with_columns(gpu=passes.number(d["ts"]))
    else:
        d = d.with_columns(gpu=pl.col(f"_id{ids.index(which)}"))
    return _segment_rows(d, metric_names, clock, host, SOURCE_CSV)


def is_query_field(name: str) -> bool:
    """Whether ``name`` is one of nvidia-smi's ``--query-gpu`` fields (see the module rules)."""
    return name in SMI_FIELDS or name in QUERY_FIELDS or name.startswith(QUERY_PREFIXES)


class _GpuIds:
    """Which column numbers the GPUs, per header (see the module rules): the first id column that
    takes several values within at least half of the query passes of several lines; None (number
    by position in the pass) when none does. Decided on the first batch that holds such passes;
    until then the first id column present."""

    def __init__(self) -> None:
        self._chosen: dict[tuple[str, ...], str | None] = {}

    def choose(self, header: tuple[str, ...], ids: list[str], d: pl.DataFrame) -> str | None:
        if header in self._chosen:
            return self._chosen[header]
        if not ids:
            return None
        good = d.filter(pl.col("_reason").is_null() & pl.col("ts").is_not_null())
        passes = good.group_by("ts").agg(
            pl.len().alias("_n"), *[pl.col(f"_id{k}").n_unique().alias(f"_u{k}") for k in range(len(ids))]
        ).filter(pl.col("_n") >= 2)
        if passes.height == 0:
            return ids[0]  # no pass of several lines yet: nothing tells the columns apart
        # telling: more than one value in at least half of the passes (a duplicated line is not a pass)
        telling = [f for k, f in enumerate(ids) if passes.select((pl.col(f"_u{k}") > 1).mean()).item() >= 0.5]
        self._chosen[header] = telling[0] if telling else None
        return self._chosen[header]


def _segment_rows(
    d: pl.DataFrame, metric_names: dict[str, str], clock: SeriesClock, host: str, source: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Shared tail of the CSV and dmon segments. ``d``: line_no, line, _reason, gpu, ts and one
    value column per key of ``metric_names`` (-> metric name). Returns the long samples and the
    rejects (line_no, line, reason): the lines with a ``_reason``, then those the clock rejects."""
    bad = d.filter(pl.col("_reason").is_not_null())
    good = d.filter(pl.col("_reason").is_null())
    good = good.with_columns(_reason=clock.check(_timed_rows(good, list(metric_names))))
    bad = pl.concat([bad, good.filter(pl.col("_reason").is_not_null())])
    good = good.filter(pl.col("_reason").is_null())
    if metric_names:
        long = (
            good.select("gpu", "ts", *metric_names)
            .unpivot(index=["gpu", "ts"], variable_name="metric", value_name="value")
            # mapped after the unpivot: a header naming one column twice must not collide
            .with_columns(pl.col("metric").replace_strict(metric_names, return_dtype=pl.String))
            .filter(pl.col("value").is_not_null())
            .with_columns(host=pl.lit(host), source=pl.lit(source))
        )
    else:  # a header naming no metric column: typed, so it concatenates with other segments
        long = pl.DataFrame(schema=_SAMPLE_SCHEMA)
    return long, bad.select("line_no", "line", pl.col("_reason").alias("reason"))


class _Passes:
    """GPU numbers for a log without an id column.

    nvidia-smi prints every GPU of one query pass with the pass's timestamp, in index order. So
    when the file's passes typically hold several lines (decided on its first data batch: the
    most common length of runs of equal consecutive timestamps is >= 2), the k-th line of a run
    is GPU k. When passes hold one line, the log is one GPU ("0") and a repeated timestamp is a
    duplicate. State carries over batches, so a pass cut by a batch boundary keeps numbering.
    """

    def __init__(self) -> None:
        self.multi: bool | None = None
        self.last_ts = None
        self.last_pos = -1

    def number(self, ts: pl.Series) -> pl.Series:
        if ts.len() == 0:
            return pl.Series("gpu", [], dtype=pl.String)
        df = pl.DataFrame({"ts": ts})
        same = (pl.col("ts") == pl.col("ts").shift(1)).fill_null(False)
        if self.last_ts is not None:
            first = pl.int_range(pl.len()) == 0
            same = pl.when(first).then(pl.col("ts") == self.last_ts).otherwise(same).fill_null(False)
        df = df.with_columns(_run=(~same).cum_sum())
        if self.multi is None:
            lengths = df.group_by("_run").len()["len"]
            self.multi = bool(lengths.mode().max() >= 2)
        if not self.multi:
            return pl.Series("gpu", ["0"] * ts.len(), dtype=pl.String)
        pos = df.select(
            p=pl.int_range(pl.len()).over("_run")
            + pl.when(pl.col("_run") == 0).then(self.last_pos + 1).otherwise(0)
        )["p"]
        self.last_ts, self.last_pos = ts[-1], int(pos[-1])
        return pos.cast(pl.String).alias("gpu")


def _timed_rows(good: pl.DataFrame, value_cols: list[str]) -> pl.DataFrame:
    """(gpu, ts) for the clock check; a line whose cells are all N/A writes no sample, so its
    time is not checked (null) and a stray all-N/A line cannot reject itself or the next one."""
    has_value = (
        pl.any_horizontal([pl.col(c).is_not_null() for c in value_cols]) if value_cols else pl.lit(False)
    )
    return good.select("gpu", ts=pl.when(has_value).then(pl.col("ts")))


# ------------------------------------------------------------------------------------- dmon

_DMON_NAMES = r"^#\s*(?:Date\s+)?(?:Time\s+)?gpu\s+\S"
_DMON_UNITS = r"^#\s*(?:YYYYMMDD\s+)?(?:HH:MM:SS\s+)?Idx\b"


class NvidiaSmiDmonReader(ReaderBase):
    name = SOURCE_DMON

    def sniff(self, head: str, path: Path) -> bool:
        return bool(re.search(_DMON_NAMES, head, re.M)) and bool(re.search(_DMON_UNITS, head, re.M))

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        tz = manifest_timezone(ctx.manifest)
        host = file_host(ctx.rel_path)
        clock = SeriesClock(["gpu"])
        state: tuple[list[str] | None, list[str] | None] = (None, None)
        for batch in line_frames(ctx.path):
            chunk, state = _dmon_chunk(batch, state, host, tz, clock)
            yield chunk


# nvidia-smi dmon prints ~10-30 fields (every -s group); a fuzzed 262 KB header of 40,000 "fields"
# built 40,000 column expressions (1.4 GB, 3.5 s)
DMON_MAX_FIELDS = 256


def _dmon_chunk(
    batch: pl.DataFrame,
    state: tuple[list[str] | None, list[str] | None],
    host: str,
    tz: str | None,
    clock: SeriesClock,
) -> tuple[Chunk, tuple[list[str] | None, list[str] | None]]:
    line = pl.col("line")
    b = batch.with_columns(
        _blank=line.str.strip_chars() == "",
        _names=line.str.contains(_DMON_NAMES),
        _units=line.str.contains(_DMON_UNITS),
        _comment=line.str.starts_with("#"),
        _tok=line.str.replace(r"^#", "").str.extract_all(r"\S+"),
    ).with_columns(_seg=pl.col("_names").cum_sum())
    # per segment: its names line and the first units line that follows it
    # segment 0 continues the previous batch's header (its units line may fall in this batch)
    units0 = b.filter((pl.col("_seg") == 0) & pl.col("_units"))["_tok"]
    heads: list[tuple[list[str] | None, list[str] | None]] = [
        (state[0], units0[0].to_list() if len(units0) else state[1])
    ]
    for seg, names in b.filter("_names").select("_seg", "_tok").iter_rows():
        units = b.filter((pl.col("_seg") == seg) & pl.col("_units"))["_tok"]
        heads.append((names, units[0].to_list() if len(units) else None))
    data = b.filter(~pl.col("_blank") & ~pl.col("_comment"))
    samples, rejects = [], []
    for seg, (names, units) in enumerate(heads):
        rows = data.filter(pl.col("_seg") == seg).select("line_no", "line", "_tok")
        if rows.height == 0:
            continue
        if names is None:
            rejects.append(rows.select("line_no", "line", reason=pl.lit("data line before any dmon header")))
            continue
        if len(names) > DMON_MAX_FIELDS:  # a column per field would cost seconds and gigabytes
            rejects.append(rows.select("line_no", "line", reason=pl.lit(
                f"its dmon header has {len(names)} fields, over {DMON_MAX_FIELDS}: not a dmon table")))
            continue
        ok, bad = _dmon_segment(rows, names, units, host, tz, clock)
        samples.append(ok)
        rejects.append(bad)
    skipped = int((b["_blank"] | b["_comment"]).sum())
    return _assemble(batch.height, samples, rejects, skipped), heads[-1]


def _dmon_segment(
    rows: pl.DataFrame,
    names: list[str],
    units: list[str] | None,
    host: str,
    tz: str | None,
    clock: SeriesClock,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    units = units if units is not None and len(units) == len(names) else [""] * len(names)

    def tok(i: int) -> pl.Expr:
        return pl.col("_tok").list.get(i, null_on_oob=True)

    reasons = [
        pl.when(pl.col("_tok").list.len() != len(names)).then(
            pl.format("expected {} fields, got {}", pl.lit(len(names)), pl.col("_tok").list.len())
        )
    ]
    cols: dict[str, pl.Expr] = {}
    if "Date" in names and "Time" in names:
        text = pl.concat_str([tok(names.index("Date")), tok(names.index("Time"))], separator=" ")
        cols["ts"] = parse_ts_text(text, tz)
        reasons.append(
            pl.when(parse_ts_text(text, tz).is_null()).then(pl.format("unparseable date/time '{}'", text.str.slice(0, 80)))
        )
    else:
        cols["ts"] = pl.lit(None, dtype=pl.Datetime("us", "UTC"))
    cols["gpu"] = tok(names.index("gpu")) if "gpu" in names else pl.lit("0")
    metric_names: dict[str, str] = {}
    for i, (name, unit) in enumerate(zip(names, units, strict=True)):
        if name in ("Date", "Time", "gpu"):
            continue
        c = tok(i)
        na = c.is_in(list(NA_MARKERS)) | c.is_null()
        num = c.cast(pl.Float64, strict=False)
        m = DMON_COLUMNS.get(name)
        key = f"_v{i}"
        if m is not None:
            src_unit = m.dmon_unit or unit
            factor = factor_expr(pl.lit(src_unit), m.unit)
            cols[key] = pl.when(~na).then(num * factor)
            reasons.append(
                pl.when(~na & num.is_null())
                .then(pl.format("non-numeric value '{}' in {}", c.str.slice(0, 80), pl.lit(name)))
                .when(~na & factor.is_null())
                .then(pl.lit(f"unknown unit '{src_unit}' for {name}"))
            )
            metric_names[key] = m.canonical
        else:
            cols[key] = pl.when(~na).then(num)  # unknown column: verbatim name, value as printed
            metric_names[key] = name
    d = rows.with_columns(_reason=pl.coalesce(reasons), **cols)
    return _segment_rows(d, metric_names, clock, host, SOURCE_DMON)
