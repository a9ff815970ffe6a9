"""wandb offline/online run files (``run-<id>.wandb``) -> step_metrics, steps.ts, gpu_samples.

A ``.wandb`` file is wandb's transaction log: LevelDB's log format (32 KiB blocks of records
with a 7-byte header ``crc32 | length | type``; a record longer than a block is split into
FIRST/MIDDLE/LAST pieces) behind a 7-byte file header (``:W&B``, magic 0xBEE1, version 0).
Each record's payload is a ``wandb_internal_pb2.Record`` protobuf. wandb < 0.19 shipped a Python
reader (``wandb.sdk.internal.datastore``); current wandb (0.31) reads the file in its Go core
only, so the framing is read here (checksum: zlib CRC-32 seeded with the type byte, as wandb's
writer) and the payload is decoded with wandb's own protobuf classes — the optional extra
``pip install 'polytrace[wandb]'``. Without it the file is sniffed and failed with that hint.

What is read (line accounting unit = one logical record):

* ``history`` -> ``step_metrics`` (numeric values only; ``_step``/``_runtime``/``_timestamp`` are
  not metrics) and a ``steps`` attribute ``ts`` from ``_timestamp``. The step is the trainer's
  global step: ``train/global_step`` when the record has it, else wandb's ``_step`` (which verl
  sets to its global step). transformers' ``WandbCallback`` (HF Trainer, TRL, Unsloth) logs with
  wandb's own counter, one per logging call: ``_step`` 0..25 where ``train/global_step`` is
  30..760, so steps and step times would be per logging interval. Its names are transformers'
  console names behind ``train/`` (``eval_x`` as ``eval/x``): ``train/loss`` is stored as ``loss``
  and ``eval/loss`` as ``eval_loss``, canonicalised as the console and trainer_state readers do, so
  the run's console capture (``files/output.log``) and its history land on one name and one axis
  (a name canonical already, ``train/completions/mean_length`` or OpenRLHF's
  ``train/policy_loss``, keeps its canonical name). In such a record ``train/global_step`` and
  ``train/epoch`` are bookkeeping and the end-of-training summary (``train/train_runtime``, ...)
  describes the run, not a step: not stored, as in the console reader. Validation metrics are
  flagged by name as the console reader does.
* ``stats`` -> ``gpu_samples``: the system monitor's ``gpu.<N>.<field>`` values at the record's
  timestamp, mapped to the canonical metrics of :mod:`analyses.telemetry_units`; fields with no
  canonical name keep their wandb name. Host-level stats (cpu, disk, network, proc.*) are not
  GPU samples and are not stored.
* Every other record type (run, environment, summary, output_raw, files, config, telemetry,
  header, footer, exit, ...) is skipped by rule. In particular the ``run`` and ``environment``
  records are never decoded further: they carry the user's e-mail, user name, host name and
  command line, none of which may reach the warehouse. ``host`` is the file's name
  (``run-<id>``), not the machine's.
* A record with a bad checksum or an undecodable payload is rejected; a record cut by the end
  of the file (a run still writing, or a truncated copy) is one rejected line ``truncated_record``.
  So is a multi-block record whose LAST piece never comes (another record starts first), and a
  history record without an integral ``_step`` (its metrics would have no step to land on).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from analyses.readers import limits
from analyses.readers.base import (
    METRIC_SOURCE_BINARY,
    Chunk,
    FileContext,
    ReaderBase,
    UnreadableFile,
    epoch_in_range,
    rejects_frame,
)
from analyses.readers.trl_console import SUMMARY_KEYS
from analyses.steps import canonical_metric, is_validation_metric
from analyses.telemetry_units import epoch_to_ts

INSTALL_HINT = "wandb run file: install the wandb extra: pip install 'polytrace[wandb]'"
MAGIC = b":W&B"
HEADER = MAGIC + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
REC_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
RECORDS_PER_CHUNK = 5_000  # a history record can hold thousands of metrics

_CRC_SEED = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}
_GPU_KEY = re.compile(r"^gpu\.(\d+)\.([A-Za-z][A-Za-z0-9_]*)$")

# wandb system-monitor GPU field -> (canonical metric, factor to its unit)
GPU_FIELDS: dict[str, tuple[str, float]] = {
    "gpu": ("gpu_util_pct", 1.0),
    "memory": ("mem_util_pct", 1.0),  # NVML utilization.memory: % of time memory was read/written
    "memoryAllocatedBytes": ("mem_used_mib", 1.0 / 2**20),
    "powerWatts": ("power_w", 1.0),
    "enforcedPowerLimitWatts": ("power_limit_w", 1.0),
    "temp": ("temp_gpu_c", 1.0),
    "smClock": ("sm_clock_mhz", 1.0),
    "memoryClock": ("mem_clock_mhz", 1.0),
    "graphicsClock": ("gr_clock_mhz", 1.0),
    "fanSpeed": ("fan_speed_pct", 1.0),
    # not in the canonical table (kept verbatim, as telemetry_units prescribes): memoryAllocated
    # (% of memory allocated), powerPercent, correctedMemoryErrors, uncorrectedMemoryErrors
}
_HISTORY_RESERVED = ("_step", "_runtime", "_timestamp")
HF_STEP = "train/global_step"  # transformers' WandbCallback: the trainer's step in every record it logs
# in such a record: bookkeeping, and the end-of-training summary (the console reader's rules)
_HF_NOT_METRICS = (HF_STEP, "train/epoch", *(f"train/{k}" for k in SUMMARY_KEYS))


def _pb() -> Any:
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as exc:
        raise UnreadableFile(INSTALL_HINT) from exc
    return wandb_internal_pb2


def iter_records(path: Path) -> Iterator[tuple[int, bytes | None, str | None]]:
    """(record number, payload, error) for each logical record, in file order.

    ``error`` is set (and payload None) for a record with a bad checksum or a record cut by the
    end of the file. Reads one 32 KiB block at a time.
    """
    n = 0
    pending: bytearray | None = None  # a FIRST..MIDDLE sequence awaiting its LAST
    max_record = limits.current().max_line_bytes
    with open(path, "rb") as fh:
        head = fh.read(REC_HEADER)
        if head[:4] != MAGIC:
            raise UnreadableFile("not a wandb transaction log (no ':W&B' header)")
        if head != HEADER:
            raise UnreadableFile(f"unsupported wandb log header {head!r}")
        block, pos = head + fh.read(BLOCK - REC_HEADER), REC_HEADER
        while True:
            while pos + REC_HEADER <= len(block):
                crc, length, rtype = struct.unpack_from("<IHB", block, pos)
                if rtype == 0 and length == 0:  # zero padding (pre-allocated or block trailer)
                    break
                end = pos + REC_HEADER + length
                if end > len(block):
                    if len(block) < BLOCK:  # end of file inside the record
                        n += 1
                        yield n, None, "truncated_record: file ends inside a record"
                        return
                    n += 1
                    yield n, None, "corrupt_record: record overruns its block"
                    pending = None
                    break
                data = block[pos + REC_HEADER : end]
                pos = end
                if rtype not in _CRC_SEED or zlib.crc32(data, _CRC_SEED[rtype]) != crc:
                    n += 1
                    pending = None
                    yield n, None, f"bad_checksum: record type {rtype} at byte {pos - length - REC_HEADER}"
                    continue
                if rtype in (FULL, FIRST) and pending is not None:  # the open record never got its LAST
                    n += 1
                    pending = None
                    yield n, None, "corrupt_record: multi-block record without its LAST piece"
                if rtype == FULL:
                    n += 1
                    yield n, data, None
                elif rtype == FIRST:
                    pending = bytearray(data)
                elif pending is not None:
                    pending += data
                    if len(pending) > max_record:  # its remaining pieces are orphans, dropped
                        n += 1
                        pending = None
                        yield n, None, f"line_too_long: record over the {max_record}-byte limit; not read"
                    elif rtype == LAST:
                        n += 1
                        yield n, bytes(pending), None
                        pending = None
            if len(block) < BLOCK:
                break
            block, pos = fh.read(BLOCK), 0
            if not block:
                break
    if pending is not None:
        yield n + 1, None, "truncated_record: file ends inside a multi-block record"


def _item_value(item: Any) -> str | None:
    """The JSON text of a history/stats item's value (wandb writes value_json; newer writers
    may use the typed oneof)."""
    if item.value_json:
        return item.value_json
    kind = item.WhichOneof("value") if hasattr(item, "WhichOneof") else None
    if kind in ("integer", "number"):
        return repr(getattr(item, kind))
    return None


class _Batch:
    """Column lists for one chunk of records."""

    def __init__(self) -> None:
        self.h_rec: list[int] = []
        self.h_key: list[str] = []
        self.h_val: list[str | None] = []
        self.s_rec: list[int] = []
        self.s_ts: list[float] = []
        self.s_key: list[str] = []
        self.s_val: list[str] = []
        self.rej: list[tuple[int, str, str]] = []
        self.lines = self.ok = self.skipped = 0


def _decode(pb: Any, n: int, payload: bytes, b: _Batch) -> None:
    rec = pb.Record()
    try:
        rec.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError (a plain Exception subclass)
        b.rej.append((n, f"bad_protobuf: {exc}", ""))
        return
    kind = rec.WhichOneof("record_type")
    if kind == "history":
        for it in rec.history.item:
            b.h_rec.append(n)
            b.h_key.append(it.key or ".".join(it.nested_key))
            b.h_val.append(_item_value(it))
        b.ok += 1
    elif kind == "stats":
        ts = rec.stats.timestamp.seconds + rec.stats.timestamp.nanos * 1e-9
        for it in rec.stats.item:
            if it.key.startswith("gpu."):
                b.s_rec.append(n)
                b.s_ts.append(ts)
                b.s_key.append(it.key)
                b.s_val.append(it.value_json)
        b.ok += 1
    else:  # run/environment (personal data), summary, console output, files, ...: skipped by rule
        b.skipped += 1


def _history_frames(b: _Batch) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(step_metrics rows, steps attribute rows, records rejected for want of a usable step:
    ``line_no, reason``)."""
    h = pl.DataFrame(
        {"line_no": b.h_rec, "raw_metric": b.h_key, "value": pl.Series(b.h_val, dtype=pl.String)},
        schema={"line_no": pl.Int64, "raw_metric": pl.String, "value": pl.String},
    ).with_columns(value=pl.col("value").str.strip_chars().cast(pl.Float64, strict=False))
    per_row = h.group_by("line_no", maintain_order=True).agg(
        _s=pl.coalesce(pl.col("value").filter(pl.col("raw_metric") == HF_STEP).first(),
                       pl.col("value").filter(pl.col("raw_metric") == "_step").first()),
        _hf=(pl.col("raw_metric") == HF_STEP).any(),
        ts=pl.col("value").filter(pl.col("raw_metric") == "_timestamp").first(),
    )
    # an integral, non-negative _step only (a plain cast would turn 2.5 into step 2)
    usable = pl.col("_s").is_finite() & (pl.col("_s") >= 0) & (pl.col("_s") == pl.col("_s").floor())
    per_row = per_row.with_columns(step=pl.when(usable).then(pl.col("_s")).cast(pl.Int64, strict=False))
    bad = per_row.filter(pl.col("step").is_null()).select(
        "line_no",
        reason=pl.when(pl.col("_s").is_null())
        .then(pl.lit("history record without a numeric _step"))
        .otherwise(pl.format("history record with a _step that is not a non-negative integer: {}", pl.col("_s"))),
    )
    raw = pl.col("raw_metric")
    sm = (
        h.join(per_row, on="line_no", how="left")
        .filter(
            ~raw.is_in(list(_HISTORY_RESERVED))
            & ~(pl.col("_hf") & raw.is_in(list(_HF_NOT_METRICS)))
            & pl.col("value").is_not_null()
            & pl.col("step").is_not_null()
        )
        .with_columns(metric=_metric_name(raw, pl.col("_hf")))
        .with_columns(is_validation=is_validation_metric(pl.col("metric")))
        .select("step", "metric", "value", "raw_metric", "is_validation", "line_no")
    )
    steps = per_row.filter(pl.col("step").is_not_null() & epoch_in_range(pl.col("ts")).is_not_null()).select(
        "step", ts=epoch_to_ts(epoch_in_range(pl.col("ts")))
    )
    return sm, steps, bad


def _metric_name(raw: pl.Expr, hf: pl.Expr) -> pl.Expr:
    """The canonical name of a history key: in a transformers record (``hf``), a ``train/``/``eval/``
    /``test/`` name without a canonical name of its own is the console's (``loss``, ``eval_loss``),
    canonicalised with transformers' names (see the module rules)."""
    plain = canonical_metric(raw)
    console = (
        pl.when(raw.str.starts_with("train/")).then(raw.str.slice(len("train/")))
        .when(raw.str.starts_with("eval/")).then(pl.lit("eval_") + raw.str.slice(len("eval/")))
        .when(raw.str.starts_with("test/")).then(pl.lit("test_") + raw.str.slice(len("test/")))
    )
    return pl.when(hf & (plain == raw) & console.is_not_null()).then(canonical_metric(console, hf=True)).otherwise(plain)


def _stats_frame(b: _Batch, host: str) -> pl.DataFrame:
    s = pl.DataFrame(
        {"ts": b.s_ts, "key": b.s_key, "value": b.s_val},
        schema={"ts": pl.Float64, "key": pl.String, "value": pl.String},
    )
    fields = pl.DataFrame(
        {
            "field": list(GPU_FIELDS),
            "metric": [v[0] for v in GPU_FIELDS.values()],
            "factor": [v[1] for v in GPU_FIELDS.values()],
        }
    )
    return (
        s.with_columns(
            gpu=pl.col("key").str.extract(_GPU_KEY.pattern, 1),
            field=pl.col("key").str.extract(_GPU_KEY.pattern, 2),
            value=pl.col("value").str.strip_chars().cast(pl.Float64, strict=False),
        )
        .filter(pl.col("gpu").is_not_null() & pl.col("value").is_not_null())
        .join(fields, on="field", how="left")
        .select(
            host=pl.lit(host),
            gpu="gpu",
            ts=epoch_to_ts(epoch_in_range(pl.col("ts"))),
            metric=pl.coalesce("metric", "field"),
            value=pl.col("value") * pl.col("factor").fill_null(1.0),
            source=pl.lit("wandb_offline"),
        )
    )


class WandbOfflineReader(ReaderBase):
    metric_source = METRIC_SOURCE_BINARY
    """wandb ``run-<id>.wandb`` transaction logs (needs the ``wandb`` extra to decode)."""

    name = "wandb_offline"

    def sniff(self, head: str, path: Path) -> bool:
        return head.startswith(MAGIC.decode())

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        pb = _pb()  # UnreadableFile with the install hint when wandb is missing
        host = ctx.rel_path.rsplit("/", 1)[-1].removesuffix(".wandb")
        b = _Batch()
        for n, payload, err in iter_records(ctx.path):
            b.lines += 1
            if err is not None:
                b.rej.append((n, err, ""))
            else:
                _decode(pb, n, payload, b)
            if b.lines >= RECORDS_PER_CHUNK:
                yield self._chunk(b, host)
                b = _Batch()
        if b.lines:
            yield self._chunk(b, host)

    def _chunk(self, b: _Batch, host: str) -> Chunk:
        tables: dict[str, pl.DataFrame] = {}
        attrs = None
        if b.h_rec:
            sm, steps, no_step = _history_frames(b)
            tables["step_metrics"] = sm
            if steps.height:
                attrs = steps
            # decoded fine, so counted ok by _decode; without a step its values cannot land
            b.ok -= no_step.height
            b.rej.extend((n, reason, "") for n, reason in no_step.iter_rows())
        if b.s_rec:
            tables["gpu_samples"] = _stats_frame(b, host)
        rej = (
            rejects_frame([r[0] for r in b.rej], [r[1] for r in b.rej], [r[2] for r in b.rej])
            if b.rej
            else None
        )
        return Chunk(
            tables=tables,
            step_attrs=attrs,
            rejects=rej,
            lines=b.lines,
            rows_ok=b.ok,
            rows_rejected=len(b.rej),
            rows_skipped=b.skipped,
        )
