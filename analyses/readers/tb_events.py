"""TensorBoard event files (``events.out.tfevents.*``) -> step_metrics and steps.ts.

verl (``trainer.logger=['tensorboard']``), OpenRLHF (``--use_tensorboard``), NeMo-RL
(``logger.tensorboard_enabled``) and transformers/TRL (``report_to="tensorboard"``) write their
step metrics as TensorBoard scalars: an event file is a sequence of TFRecord records (``uint64
length | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of the data``), each
holding an ``Event`` protobuf (``wall_time``, ``step``, and a ``Summary`` of tagged values).

The framing is read here, one record at a time, with CRC-32C from ``google-crc32c``; the payload
is decoded with TensorBoard's own protobuf classes (``tensorboard.compat.proto``). (TensorBoard's
``EventFileLoader`` without TensorFlow checks CRCs in pure Python, about 3.5 MB/s, and silently
stops at the first corrupt record; a bad record must be a counted reject instead.) Both come with
the optional extra ``pip install 'polytrace[tensorboard]'``; without it the file is sniffed and
failed with that hint.

What is read (line accounting unit = one record):

* **Scalars** -> ``step_metrics``: a ``simple_value`` (what ``torch.utils.tensorboard``,
  tensorboardX and TF1 write), or a one-element tensor of the ``scalars`` plugin (TF2's
  ``tf.summary.scalar``; the plugin is named in the first value of a tag only, so it is
  remembered per tag). ``step`` = the event's step, ``metric`` =
  :func:`analyses.steps.canonical_metric` of the tag (verl's tags are its metric names;
  OpenRLHF's, NeMo-RL's and transformers' ``train/...`` tags map to the same canonical names),
  ``is_validation`` by name as elsewhere.
* ``steps.ts``: the latest ``wall_time`` of the step's scalars (frameworks log a step's metrics
  when it ends). With no logged step time, :func:`analyses.steps.derive_steps` then takes the
  wall time between consecutive steps (``log_ts_diff``).
* A record with at least one scalar is parsed; a record without (the ``file_version`` header,
  graphs, histograms, images, text, hparams) is skipped.
* Rejected: a record whose data fails its checksum or does not decode, an event with a negative
  step, and a record cut by the end of the file (a run still writing). A length that fails its
  checksum leaves nothing to find the next record by: the rest of the file is one rejected
  record (``corrupt_record``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from analyses.readers.base import (
    METRIC_SOURCE_STRUCTURED,
    Chunk,
    FileContext,
    ReaderBase,
    UnreadableFile,
    epoch_in_range,
    rejects_frame,
)
from analyses.steps import canonical_metric, is_validation_metric
from analyses.telemetry_units import epoch_to_ts

INSTALL_HINT = "TensorBoard event file: install the tensorboard extra: pip install 'polytrace[tensorboard]'"
RECORDS_PER_CHUNK = 20_000
FILE_VERSION = b"brain.Event:"
SCALARS_PLUGIN = "scalars"
_MASK_DELTA = 0xA282EAD8


def _libs() -> tuple[Any, Any, Any]:
    try:
        import google_crc32c
        from tensorboard.compat.proto import event_pb2
        from tensorboard.util import tensor_util
    except ImportError as exc:
        raise UnreadableFile(INSTALL_HINT) from exc
    return google_crc32c, event_pb2, tensor_util


def masked_crc32c(crc: int) -> int:
    """TFRecord's mask over a CRC-32C value."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _first_record_ok(path: Path) -> bool:
    """The file starts with a TFRecord whose data holds the ``brain.Event:`` file version (and,
    when google-crc32c is there to check it, whose length passes its checksum)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    if len(head) < 12:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    if not 0 < length < 1 << 20 or FILE_VERSION not in head[12 : 12 + length]:
        return False
    try:
        import google_crc32c
    except ImportError:  # read() says what to install
        return True
    return masked_crc32c(google_crc32c.value(head[:8])) == struct.unpack("<I", head[8:12])[0]


def iter_records(path: Path, crc: Any) -> Iterator[tuple[int, bytes | None, str | None]]:
    """(record number, data, error) for each record in file order; ``error`` set (data None) for
    a record that fails its checksum or is cut by the end of the file."""
    n = 0
    with open(path, "rb") as fh:
        while True:
            head = fh.read(12)
            if not head:
                return
            n += 1
            if len(head) < 12:
                yield n, None, "truncated_record: file ends inside a record header"
                return
            (length,) = struct.unpack("<Q", head[:8])
            if masked_crc32c(crc.value(head[:8])) != struct.unpack("<I", head[8:])[0]:
                yield n, None, f"corrupt_record: length checksum mismatch at byte {fh.tell() - 12}; rest of file unreadable"
                return
            data = fh.read(length)
            tail = fh.read(4)
            if len(data) < length or len(tail) < 4:
                yield n, None, "truncated_record: file ends inside a record"
                return
            if masked_crc32c(crc.value(data)) != struct.unpack("<I", tail)[0]:
                yield n, None, f"bad_checksum: record data at byte {fh.tell() - length - 4}"
                continue
            yield n, data, None


class _Batch:
    def __init__(self) -> None:
        self.rec: list[int] = []
        self.step: list[int] = []
        self.wall: list[float] = []
        self.tag: list[str] = []
        self.value: list[float] = []
        self.rej: list[tuple[int, str]] = []
        self.lines = self.ok = self.skipped = 0


class TensorBoardReader(ReaderBase):
    metric_source = METRIC_SOURCE_STRUCTURED  # float32 as logged, not rounded for print
    """TensorBoard ``events.out.tfevents.*`` files (needs the ``tensorboard`` extra to decode)."""

    name = "tensorboard"

    def sniff(self, head: str, path: Path) -> bool:
        # the first event of every writer is the file_version record "brain.Event:2"
        return "brain.Event:" in head[:64] and _first_record_ok(path)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        crc, event_pb2, tensor_util = _libs()
        plugins: dict[str, str] = {}  # tag -> plugin named in its first value
        b = _Batch()
        for n, data, err in iter_records(ctx.path, crc):
            b.lines += 1
            if err is not None:
                b.rej.append((n, err))
            else:
                _decode(event_pb2, tensor_util, plugins, n, data, b)
            if b.lines >= RECORDS_PER_CHUNK:
                yield _chunk(b)
                b = _Batch()
        if b.lines:
            yield _chunk(b)


def _decode(event_pb2: Any, tensor_util: Any, plugins: dict[str, str], n: int, data: bytes, b: _Batch) -> None:
    try:
        ev = event_pb2.Event.FromString(data)
    except Exception as exc:  # protobuf's DecodeError is a plain Exception subclass
        b.rej.append((n, f"bad_protobuf: {exc}"))
        return
    if not ev.HasField("summary"):
        b.skipped += 1
        return
    found = 0
    for v in ev.summary.value:
        if v.HasField("metadata") and v.metadata.plugin_data.plugin_name:
            plugins.setdefault(v.tag, v.metadata.plugin_data.plugin_name)
        kind = v.WhichOneof("value")
        if kind == "simple_value":
            x = float(v.simple_value)
        elif kind == "tensor" and plugins.get(v.tag) == SCALARS_PLUGIN:
            try:
                arr = tensor_util.make_ndarray(v.tensor)
            except (TypeError, ValueError):
                continue
            if arr.size != 1 or arr.dtype.kind not in "biuf":
                continue
            x = float(arr.reshape(-1)[0])
        else:
            continue
        if ev.step < 0:
            b.rej.append((n, f"negative step {ev.step}"))
            return
        b.rec.append(n)
        b.step.append(ev.step)
        b.wall.append(ev.wall_time)
        b.tag.append(v.tag)
        b.value.append(x)
        found += 1
    if found:
        b.ok += 1
    else:
        b.skipped += 1


def _chunk(b: _Batch) -> Chunk:
    tables: dict[str, pl.DataFrame] = {}
    attrs = None
    if b.rec:
        s = pl.DataFrame(
            {"line_no": b.rec, "step": b.step, "wall": b.wall, "raw_metric": b.tag, "value": b.value},
            schema={"line_no": pl.Int64, "step": pl.Int64, "wall": pl.Float64, "raw_metric": pl.String, "value": pl.Float64},
        )
        tables["step_metrics"] = s.select(
            "step",
            metric=canonical_metric(pl.col("raw_metric")),
            value="value",
            raw_metric="raw_metric",
            line_no="line_no",
        ).with_columns(is_validation=is_validation_metric(pl.col("metric")))
        wall = epoch_in_range(pl.col("wall"))
        steps = (
            s.filter(wall.is_not_null() & (pl.col("wall") > 0))
            .group_by("step")
            .agg(pl.col("wall").max())
            .sort("step")
            .select("step", ts=epoch_to_ts(pl.col("wall")))
        )
        if steps.height:
            attrs = steps
    rej = rejects_frame([r[0] for r in b.rej], [r[1] for r in b.rej], [""] * len(b.rej)) if b.rej else None
    return Chunk(
        tables=tables, step_attrs=attrs, rejects=rej, lines=b.lines, rows_ok=b.ok, rows_rejected=len(b.rej), rows_skipped=b.skipped
    )
