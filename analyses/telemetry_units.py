"""Canonical GPU telemetry metrics, unit normalization, and time-series hygiene.

Every telemetry reader (nvidia-smi CSV and dmon, dcgm-exporter Prometheus text and
``query_range`` JSON, cluster utilization tables) maps its field names to ONE canonical metric
with ONE unit, so ``gpu_samples`` can be queried without knowing which tool wrote a row.

Canonical metrics (``metric`` column of ``gpu_samples``)
--------------------------------------------------------

| canonical             | unit  | kind    | nvidia-smi --query-gpu                             | dmon         | dcgm-exporter field (unit if not canonical) |
|-----------------------|-------|---------|----------------------------------------------------|--------------|---------------------------------------------|
| gpu_util_pct          | %     | gauge   | utilization.gpu                                    | sm           | DCGM_FI_DEV_GPU_UTIL                        |
| mem_util_pct          | %     | gauge   | utilization.memory                                 | mem          | DCGM_FI_DEV_MEM_COPY_UTIL                   |
| enc_util_pct          | %     | gauge   | utilization.encoder                                | enc          | DCGM_FI_DEV_ENC_UTIL                        |
| dec_util_pct          | %     | gauge   | utilization.decoder                                | dec          | DCGM_FI_DEV_DEC_UTIL                        |
| sm_active_pct         | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_SM_ACTIVE (ratio)              |
| sm_occupancy_pct      | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_SM_OCCUPANCY (ratio)           |
| gr_engine_active_pct  | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio)       |
| dram_active_pct       | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_DRAM_ACTIVE (ratio)            |
| tensor_active_pct     | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (ratio)     |
| fp16_active_pct       | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_PIPE_FP16_ACTIVE (ratio)       |
| fp32_active_pct       | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_PIPE_FP32_ACTIVE (ratio)       |
| fp64_active_pct       | %     | gauge   | -                                                  | -            | DCGM_FI_PROF_PIPE_FP64_ACTIVE (ratio)       |
| mem_used_mib          | MiB   | gauge   | memory.used                                        | fb           | DCGM_FI_DEV_FB_USED                         |
| mem_free_mib          | MiB   | gauge   | memory.free                                        | -            | DCGM_FI_DEV_FB_FREE                         |
| mem_total_mib         | MiB   | gauge   | memory.total                                       | -            | DCGM_FI_DEV_FB_TOTAL                        |
| mem_reserved_mib      | MiB   | gauge   | memory.reserved                                    | -            | DCGM_FI_DEV_FB_RESERVED                     |
| power_w               | W     | gauge   | power.draw, power.draw.average, power.draw.instant | pwr          | DCGM_FI_DEV_POWER_USAGE                     |
| power_limit_w         | W     | gauge   | power.limit                                        | -            | DCGM_FI_DEV_POWER_MGMT_LIMIT                |
| energy_j              | J     | counter | -                                                  | -            | DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ)   |
| temp_gpu_c            | C     | gauge   | temperature.gpu                                    | gtemp        | DCGM_FI_DEV_GPU_TEMP                        |
| temp_mem_c            | C     | gauge   | temperature.memory                                 | mtemp        | DCGM_FI_DEV_MEMORY_TEMP                     |
| sm_clock_mhz          | MHz   | gauge   | clocks.sm, clocks.current.sm                       | pclk         | DCGM_FI_DEV_SM_CLOCK                        |
| mem_clock_mhz         | MHz   | gauge   | clocks.mem, clocks.current.memory                  | mclk         | DCGM_FI_DEV_MEM_CLOCK                       |
| gr_clock_mhz          | MHz   | gauge   | clocks.gr, clocks.current.graphics                 | -            | -                                           |
| fan_speed_pct         | %     | gauge   | fan.speed                                          | -            | DCGM_FI_DEV_FAN_SPEED                       |
| pcie_tx_bytes_per_s   | B/s   | gauge   | -                                                  | txpci (MB/s) | DCGM_FI_PROF_PCIE_TX_BYTES                  |
| pcie_rx_bytes_per_s   | B/s   | gauge   | -                                                  | rxpci (MB/s) | DCGM_FI_PROF_PCIE_RX_BYTES                  |
| nvlink_tx_bytes_per_s | B/s   | gauge   | -                                                  | -            | DCGM_FI_PROF_NVLINK_TX_BYTES                |
| nvlink_rx_bytes_per_s | B/s   | gauge   | -                                                  | -            | DCGM_FI_PROF_NVLINK_RX_BYTES                |
| pcie_replay_count     | count | counter | -                                                  | -            | DCGM_FI_DEV_PCIE_REPLAY_COUNTER             |
| xid_last              | code  | gauge   | -                                                  | -            | DCGM_FI_DEV_XID_ERRORS                      |

``(ratio)`` fields are 0..1 and are multiplied by 100; dmon's ``sm`` column is NVML's GPU
utilization (the same counter as ``utilization.gpu``), not DCGM's SM activity.

Cluster-trace tables (Alibaba ``pod_gpu_duty_cycle``, AcmeTrace ``GPU_UTIL``) map by file stem:
``duty_cycle`` / ``gpu_util`` -> ``gpu_util_pct``; ``SM_ACTIVE`` -> ``sm_active_pct`` (ratio x100),
and so on through the dcgm names without their ``DCGM_FI_DEV_`` / ``DCGM_FI_PROF_`` prefix.

Unit rules
----------
* Percent-like metrics are stored as percent 0..100. DCGM ``PROF`` fields are ratios 0..1 and are
  multiplied by 100; ``DCGM_FI_DEV_*_UTIL`` and nvidia-smi ``utilization.*`` already are percent.
* Memory in MiB. nvidia-smi writes ``MiB``; dmon labels the same number ``MB`` (it is MiB), so
  ``MB`` is read as MiB *for memory*; ``GiB``/``KiB`` are converted.
* Power in W (``mW`` converted), temperature in C, clocks in MHz (``GHz``/``kHz`` converted),
  energy in J (dcgm's mJ divided by 1000), PCIe/NVLink rates in bytes/s (dmon's MB/s x 2**20).
* A value whose unit (in the cell, like ``17092 MiB``, or in the header, like
  ``memory.used [MiB]``) cannot be converted to the metric's unit is an *unknown unit*: the
  reader rejects the line with that reason rather than store a number in the wrong unit.
* Metric names not in the table are kept verbatim (``DCGM_FI_DEV_VGPU_LICENSE_STATUS``,
  ``pcie.link.gen.current``) with their value unconverted; canonical names are lower snake case
  with a unit suffix, so the two never collide.
* ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``-`` (dmon) and empty cells mean "not
  measured": no sample is written for that cell; the line still counts as parsed.

Time-series hygiene (shared by the readers, see :class:`SeriesClock` and :class:`CounterRepair`)
-----------------------------------------------------------------------------------------------
* Clock jump: a sample whose timestamp is *earlier* than the latest timestamp already seen for
  the same series (host, gpu[, metric]) in the file is rejected (``clock went backwards``), so
  every stored series is strictly increasing in time, which step alignment needs.
* Duplicate timestamp: a sample whose timestamp *equals* the latest one seen for its series is
  rejected (``duplicate timestamp``); the first occurrence wins.
* Counter reset (``energy_j``, ``pcie_replay_count``, or any ``# TYPE x counter``): in file order
  per series, a value lower than the previous one is a reset; from it on the previous total is
  added (Prometheus ``increase()`` semantics) so the stored counter stays monotonic. The sample
  where a reset was detected carries ``quality = 'counter_reset'`` (count them with SQL).
* Naive timestamps (nvidia-smi and dmon print local time without a zone) are read as UTC unless
  run.toml says ``timezone = "Area/City"`` (a free-form tag), in which case they are converted.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import polars as pl

from analyses.manifest import RunManifest
from analyses.readers.base import is_gzip


@dataclass(frozen=True)
class Metric:
    canonical: str
    unit: str  # canonical unit: pct | MiB | W | C | MHz | J | B/s | count | code
    kind: str  # gauge | counter
    smi: tuple[str, ...] = ()
    dmon: tuple[str, ...] = ()
    dcgm: tuple[str, ...] = ()
    dcgm_unit: str = ""  # unit dcgm reports the field in ("" = canonical unit)
    dmon_unit: str = ""


METRICS: tuple[Metric, ...] = (
    Metric("gpu_util_pct", "pct", "gauge", ("utilization.gpu",), ("sm",), ("DCGM_FI_DEV_GPU_UTIL",)),
    Metric("mem_util_pct", "pct", "gauge", ("utilization.memory",), ("mem",), ("DCGM_FI_DEV_MEM_COPY_UTIL",)),
    Metric("enc_util_pct", "pct", "gauge", ("utilization.encoder",), ("enc",), ("DCGM_FI_DEV_ENC_UTIL",)),
    Metric("dec_util_pct", "pct", "gauge", ("utilization.decoder",), ("dec",), ("DCGM_FI_DEV_DEC_UTIL",)),
    Metric("sm_active_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_SM_ACTIVE",), dcgm_unit="ratio"),
    Metric("sm_occupancy_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_SM_OCCUPANCY",), dcgm_unit="ratio"),
    Metric(
        "gr_engine_active_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_GR_ENGINE_ACTIVE",), dcgm_unit="ratio"
    ),
    Metric("dram_active_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_DRAM_ACTIVE",), dcgm_unit="ratio"),
    Metric("tensor_active_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",), dcgm_unit="ratio"),
    Metric("fp16_active_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_PIPE_FP16_ACTIVE",), dcgm_unit="ratio"),
    Metric("fp32_active_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_PIPE_FP32_ACTIVE",), dcgm_unit="ratio"),
    Metric("fp64_active_pct", "pct", "gauge", dcgm=("DCGM_FI_PROF_PIPE_FP64_ACTIVE",), dcgm_unit="ratio"),
    Metric("mem_used_mib", "MiB", "gauge", ("memory.used",), ("fb",), ("DCGM_FI_DEV_FB_USED",)),
    Metric("mem_free_mib", "MiB", "gauge", ("memory.free",), (), ("DCGM_FI_DEV_FB_FREE",)),
    Metric("mem_total_mib", "MiB", "gauge", ("memory.total",), (), ("DCGM_FI_DEV_FB_TOTAL",)),
    Metric("mem_reserved_mib", "MiB", "gauge", ("memory.reserved",), (), ("DCGM_FI_DEV_FB_RESERVED",)),
    Metric(
        "power_w",
        "W",
        "gauge",
        ("power.draw", "power.draw.average", "power.draw.instant"),
        ("pwr",),
        ("DCGM_FI_DEV_POWER_USAGE",),
    ),
    Metric("power_limit_w", "W", "gauge", ("power.limit",), (), ("DCGM_FI_DEV_POWER_MGMT_LIMIT",)),
    Metric("energy_j", "J", "counter", dcgm=("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), dcgm_unit="mJ"),
    Metric("temp_gpu_c", "C", "gauge", ("temperature.gpu",), ("gtemp",), ("DCGM_FI_DEV_GPU_TEMP",)),
    Metric("temp_mem_c", "C", "gauge", ("temperature.memory",), ("mtemp",), ("DCGM_FI_DEV_MEMORY_TEMP",)),
    Metric(
        "sm_clock_mhz",
        "MHz",
        "gauge",
        ("clocks.sm", "clocks.current.sm"),
        ("pclk",),
        ("DCGM_FI_DEV_SM_CLOCK",),
    ),
    Metric(
        "mem_clock_mhz",
        "MHz",
        "gauge",
        ("clocks.mem", "clocks.current.memory"),
        ("mclk",),
        ("DCGM_FI_DEV_MEM_CLOCK",),
    ),
    Metric("gr_clock_mhz", "MHz", "gauge", ("clocks.gr", "clocks.current.graphics")),
    Metric("fan_speed_pct", "pct", "gauge", ("fan.speed",), (), ("DCGM_FI_DEV_FAN_SPEED",)),
    Metric(
        "pcie_tx_bytes_per_s",
        "B/s",
        "gauge",
        (),
        ("txpci",),
        ("DCGM_FI_PROF_PCIE_TX_BYTES",),
        dmon_unit="MB/s",
    ),
    Metric(
        "pcie_rx_bytes_per_s",
        "B/s",
        "gauge",
        (),
        ("rxpci",),
        ("DCGM_FI_PROF_PCIE_RX_BYTES",),
        dmon_unit="MB/s",
    ),
    Metric("nvlink_tx_bytes_per_s", "B/s", "gauge", dcgm=("DCGM_FI_PROF_NVLINK_TX_BYTES",)),
    Metric("nvlink_rx_bytes_per_s", "B/s", "gauge", dcgm=("DCGM_FI_PROF_NVLINK_RX_BYTES",)),
    Metric("pcie_replay_count", "count", "counter", dcgm=("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",)),
    Metric("xid_last", "code", "gauge", dcgm=("DCGM_FI_DEV_XID_ERRORS",)),
)
BY_CANONICAL: dict[str, Metric] = {m.canonical: m for m in METRICS}
SMI_FIELDS: dict[str, Metric] = {f: m for m in METRICS for f in m.smi}
DMON_COLUMNS: dict[str, Metric] = {f: m for m in METRICS for f in m.dmon}
DCGM_FIELDS: dict[str, Metric] = {f: m for m in METRICS for f in m.dcgm}
COUNTERS: frozenset[str] = frozenset(m.canonical for m in METRICS if m.kind == "counter")

# source unit spelling -> (canonical unit, factor)
UNITS: dict[str, tuple[str, float]] = {
    "%": ("pct", 1.0),
    "pct": ("pct", 1.0),
    "ratio": ("pct", 100.0),
    "MiB": ("MiB", 1.0),
    "MB": ("MiB", 1.0),
    "GiB": ("MiB", 1024.0),
    "GB": ("MiB", 1024.0),
    "KiB": ("MiB", 1 / 1024),
    "KB": ("MiB", 1 / 1024),
    "W": ("W", 1.0),
    "mW": ("W", 1e-3),
    "kW": ("W", 1e3),
    "C": ("C", 1.0),
    "°C": ("C", 1.0),
    "MHz": ("MHz", 1.0),
    "GHz": ("MHz", 1e3),
    "kHz": ("MHz", 1e-3),
    "Hz": ("MHz", 1e-6),
    "J": ("J", 1.0),
    "mJ": ("J", 1e-3),
    "kJ": ("J", 1e3),
    "B/s": ("B/s", 1.0),
    "KB/s": ("B/s", 1024.0),
    "MB/s": ("B/s", 1024.0**2),
    "GB/s": ("B/s", 1024.0**3),
    "count": ("count", 1.0),
    "code": ("code", 1.0),
}

# Values that mean "not measured" rather than "bad input"
NA_MARKERS: tuple[str, ...] = (
    "",
    "-",
    "N/A",
    "[N/A]",
    "[Not Supported]",
    "Not Supported",
    "[Unknown Error]",
    "[Insufficient Permissions]",
    "[GPU is lost]",
    "[Requires Pstate]",
    "nan",
    "NaN",
)


def unit_factor(source_unit: str, canonical_unit: str) -> float | None:
    """Factor converting ``source_unit`` to ``canonical_unit``; None when not convertible.

    An empty ``source_unit`` means the value is already in the canonical unit.
    """
    if not source_unit or source_unit == canonical_unit:
        return 1.0
    hit = UNITS.get(source_unit)
    if hit is None or hit[0] != canonical_unit:
        return None
    return hit[1]


def factor_expr(unit: pl.Expr, canonical_unit: str) -> pl.Expr:
    """Vectorized :func:`unit_factor`: null where the unit does not convert."""
    mapping = {u: f for u, (cu, f) in UNITS.items() if cu == canonical_unit}
    mapping[canonical_unit] = 1.0
    mapping[""] = 1.0
    return unit.fill_null("").replace_strict(mapping, default=None, return_dtype=pl.Float64)


def unit_table() -> pl.DataFrame:
    """The table above as a frame (for docs, notebooks and tests)."""
    return pl.DataFrame(
        {
            "canonical": [m.canonical for m in METRICS],
            "unit": [m.unit for m in METRICS],
            "kind": [m.kind for m in METRICS],
            "nvidia_smi": [", ".join(m.smi) for m in METRICS],
            "dmon": [", ".join(m.dmon) for m in METRICS],
            "dcgm": [", ".join(m.dcgm) for m in METRICS],
            "dcgm_unit": [m.dcgm_unit or m.unit for m in METRICS],
        }
    )


def stem_metric(stem: str) -> Metric | None:
    """The metric a cluster-trace file holds, from its name (``pod_gpu_duty_cycle_anon`` ->
    gpu_util_pct, AcmeTrace ``SM_ACTIVE`` -> sm_active_pct)."""
    s = stem.upper()
    if "DUTY_CYCLE" in s or s.startswith("GPU_UTIL") or s.endswith("GPU_UTIL") or s == "UTIL":
        return BY_CANONICAL["gpu_util_pct"]
    for field, m in sorted(DCGM_FIELDS.items(), key=lambda kv: -len(kv[0])):
        short = field.removeprefix("DCGM_FI_DEV_").removeprefix("DCGM_FI_PROF_")
        if short in s:
            return m
    return None


# ---------------------------------------------------------------------------------------- time


TS = pl.Datetime("us", "UTC")
_TS_FORMATS = (
    "%Y/%m/%d %H:%M:%S%.f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S",
    "%Y%m%d %H:%M:%S",
    "%a %b %d %H:%M:%S %Y",
)


def manifest_timezone(manifest: RunManifest | None) -> str | None:
    if manifest is None:
        return None
    tz = manifest.tags.get("timezone")
    return str(tz) if tz else None


def parse_ts_text(s: pl.Expr, tz: str | None = None) -> pl.Expr:
    """Text timestamps -> UTC datetime. Zone-aware ISO strings keep their zone; naive ones are
    read in ``tz`` (UTC when None). Null where no known format matches."""
    s = s.str.strip_chars()
    aware = s.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%z", strict=False, time_unit="us").dt.convert_time_zone(
        "UTC"
    )
    naive = pl.coalesce([s.str.strptime(pl.Datetime("us"), f, strict=False) for f in _TS_FORMATS])
    naive = naive.dt.replace_time_zone(
        tz or "UTC", ambiguous="earliest", non_existent="null"
    ).dt.convert_time_zone("UTC")
    return pl.coalesce(aware, naive).cast(TS)


def epoch_to_ts(x: pl.Expr) -> pl.Expr:
    """Epoch numbers -> UTC datetime; seconds, milliseconds or microseconds by magnitude."""
    x = x.cast(pl.Float64)
    us = pl.when(x.abs() >= 1e14).then(x).when(x.abs() >= 1e11).then(x * 1e3).otherwise(x * 1e6)
    return us.round(0).cast(pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")


def parse_ts_any(s: pl.Expr, tz: str | None = None) -> pl.Expr:
    """Text or epoch-number timestamps -> UTC datetime (null when neither)."""
    s = s.cast(pl.String).str.strip_chars()
    num = s.cast(pl.Float64, strict=False)
    return pl.when(num.is_not_null()).then(epoch_to_ts(num)).otherwise(parse_ts_text(s, tz))


# ------------------------------------------------------------------------------ series hygiene


class SeriesClock:
    """Rejects samples whose timestamp does not move forward within their series.

    Stateful across the chunks of one file: the latest timestamp per series is carried over,
    so a clock jump that spans a chunk boundary is still caught. Works on whole frames.
    """

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.state: pl.DataFrame | None = None

    def check(self, df: pl.DataFrame, ts: str = "ts") -> pl.Series:
        """Reason per row of ``df`` (in file order): null when fine, else why it is rejected.
        Rows with a null ``ts`` are not checked."""
        k = self.keys
        d = df.select(*k, ts).with_row_index("_i")
        if self.state is not None:
            d = d.join(self.state, on=k, how="left", nulls_equal=True).sort("_i")
        else:
            d = d.with_columns(pl.lit(None, dtype=TS).alias("_prev"))
        # materialize the window once: used inline it would be evaluated per branch below
        d = d.with_columns(_run=pl.col(ts).cum_max().shift(1).over(k))
        d = d.with_columns(_prior=pl.max_horizontal("_run", "_prev"))
        prior = pl.col("_prior")
        d = d.with_columns(
            reason=pl.when(pl.col(ts).is_null() | prior.is_null())
            .then(pl.lit(None, dtype=pl.String))
            .when(pl.col(ts) < prior)
            .then(pl.lit("clock went backwards: timestamp earlier than a previous sample of this GPU"))
            .when(pl.col(ts) == prior)
            .then(pl.lit("duplicate timestamp for this GPU"))
        )
        latest = d.group_by(k).agg(pl.col(ts).max().alias("_prev"))
        if self.state is not None:
            latest = pl.concat([self.state, latest]).group_by(k).agg(pl.col("_prev").max())
        self.state = latest.filter(pl.col("_prev").is_not_null())
        return d["reason"]


class CounterRepair:
    """Makes counters monotonic across resets, in file order per series, carrying state over
    chunks. Returns the repaired values and a flag marking where a reset was detected."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.state: pl.DataFrame | None = None  # keys, _last, _offset

    def apply(self, df: pl.DataFrame, value: str = "value") -> pl.DataFrame:
        """``df`` with ``value`` repaired and a ``counter_reset`` boolean column added."""
        k = self.keys
        d = df.with_row_index("_i")
        if self.state is not None:
            d = d.join(self.state, on=k, how="left", nulls_equal=True).sort("_i")
        else:
            d = d.with_columns(
                pl.lit(None, dtype=pl.Float64).alias("_last"), pl.lit(None, dtype=pl.Float64).alias("_offset")
            )
        prev = pl.coalesce(pl.col(value).shift(1).over(k), pl.col("_last"))
        d = d.with_columns(counter_reset=(pl.col(value) < prev).fill_null(False), _prev_raw=prev)
        add = pl.when(pl.col("counter_reset")).then(pl.col("_prev_raw")).otherwise(0.0)
        d = d.with_columns(_off=add.cum_sum().over(k) + pl.col("_offset").fill_null(0.0), _raw=pl.col(value))
        d = d.with_columns((pl.col(value) + pl.col("_off")).alias(value))
        last = d.group_by(k, maintain_order=True).agg(
            pl.col("_raw").last().alias("_last"), pl.col("_off").last().alias("_offset")
        )
        if self.state is not None:
            last = pl.concat([self.state.join(last.select(k), on=k, how="anti", nulls_equal=True), last])
        self.state = last
        return d.drop("_i", "_last", "_offset", "_prev_raw", "_off", "_raw")


def file_host(rel_path: str) -> str:
    """Host name for a telemetry file that names none: its path in the run without suffixes
    (``gpu_usage.csv`` -> ``gpu_usage``; ``node3/smi.csv`` -> ``node3/smi``), so the samples of
    two files never collide and each stays traceable to its file."""
    name = rel_path
    for suf in (".gz", ".csv", ".txt", ".log", ".prom", ".json", ".md", ".tsv"):
        name = name.removesuffix(suf)
    return name


# ------------------------------------------------------------------------------------- input

LINE_CHUNK = 200_000
STREAM_BLOCK = 16 << 20


def line_batches(path: Path, chunk_lines: int = LINE_CHUNK) -> Iterator[pl.DataFrame]:
    """The file as frames of ``line_no`` (1-based, Int64) and ``line``, in order, ``chunk_lines``
    at a time; ``\\r`` line ends are stripped. Gzipped files are decompressed as a stream."""
    if is_gzip(path):
        with gzip.open(path, "rb") as fh:
            yield from stream_line_batches(fh, chunk_lines)
        return
    lf = pl.scan_lines(path, row_index_name="line_no", row_index_offset=1)
    for batch in lf.collect_batches(chunk_size=chunk_lines):
        if batch.height:
            yield batch.with_columns(pl.col("line_no").cast(pl.Int64))


def stream_line_batches(fh: IO[bytes], chunk_lines: int = LINE_CHUNK) -> Iterator[pl.DataFrame]:
    """Like :func:`line_batches` over a binary stream (a gzip or tar member), read
    ``STREAM_BLOCK`` bytes at a time and cut at the last newline of each block."""
    rest, offset = b"", 0
    while block := fh.read(STREAM_BLOCK):
        data = rest + block
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        rest = data[cut + 1 :]
        for b in _bytes_batches(data[: cut + 1], offset, chunk_lines):
            offset += b.height
            yield b
    if rest:
        yield from _bytes_batches(rest, offset, chunk_lines)


def _bytes_batches(data: bytes, offset: int, chunk_lines: int) -> Iterator[pl.DataFrame]:
    lf = pl.scan_lines(data, row_index_name="line_no", row_index_offset=offset + 1)
    for b in lf.collect_batches(chunk_size=chunk_lines):
        if b.height:
            yield b.with_columns(pl.col("line_no").cast(pl.Int64))
