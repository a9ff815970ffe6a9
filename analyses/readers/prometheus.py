"""dcgm-exporter telemetry: Prometheus text exposition (``/metrics`` scrapes) and Prometheus
``query_range`` / ``query`` JSON answers, into ``gpu_samples``.

Text format rules:
* ``# HELP`` / ``# TYPE`` and other ``#`` lines, and blank lines, are skipped (``# TYPE x
  counter`` marks ``x`` as a counter for reset repair). Any number of scrapes may be
  concatenated; each sample line stands alone.
* A sample line is ``name{labels} value [timestamp_ms]``. A line that starts like one (a metric
  name then ``{``, or ``DCGM_``) but does not parse - a scrape cut mid-line - is rejected, and so
  is a sample whose timestamp no epoch can be (``timestamp out of range``).
* Markdown or console captures that embed a scrape (vendor docs, ``kubectl logs`` output) are
  read too: any other line (prose, code fences, shell commands) is skipped as non-metric text.
  The sniffer only accepts a file holding a ``DCGM_FI_*`` sample line or a ``# TYPE`` line.
* Samples without a GPU label (``gpu``, ``minor_number``, ``device=nvidiaN``, ``UUID``) are not
  per-GPU telemetry and are skipped (node exporters, Go runtime metrics); ``NaN`` values are
  skipped as "no data".
* ``host`` = label ``Hostname`` (dcgm-exporter), else ``hostname``/``node``/``instance`` (port
  removed), else the file's path in the run without suffix. ``gpu`` = label ``gpu`` (with
  ``/GPU_I_ID`` appended for MIG instances), else ``minor_number``, else ``device`` without
  ``nvidia``, else ``UUID``.
* Values are converted to canonical units (ratios x100 and so on, see telemetry_units); dcgm
  fields not in the table keep their name and value.
* ``ts``: the sample's own timestamp (ms) when the line carries one. dcgm-exporter does not write
  timestamps, and a scrape saved to a file carries no time of its own: then ``ts`` is null.
  Neither the file's mtime (reset by every copy: the real files here show the copy time) nor
  run.toml's ``started_at`` (the run's start, not the scrape's) is a scrape time; a null is
  honest and alignment skips it, while the samples still count as snapshots.

JSON (``{"status":"success","data":{"resultType":"matrix","result":[...]}}``): each series'
``metric`` labels are read as above (``__name__`` is the metric); every ``[ts, "v"]`` pair is a
sample with ts in seconds. The document is one record per sample for the line accounting: an
entry that is not such a pair (``null``, ``[ts]``) is a rejected record, and so is a whole series
that is not ``{"metric": {...}, "values": [...]}``; ``data.result`` not being a list fails the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from analyses.readers import limits
from analyses.readers.base import (
    Chunk,
    FileContext,
    ReaderBase,
    UnreadableFile,
    accounted_chunk,
    epoch_in_range,
    rejects_frame,
)
from analyses.readers.lines import line_frames
from analyses.telemetry_units import (
    COUNTERS,
    DCGM_FIELDS,
    CounterRepair,
    SeriesClock,
    epoch_to_ts,
    factor_expr,
    file_host,
)

SOURCE_TEXT = "prometheus_text"
SOURCE_JSON = "prometheus_range_json"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_VALUE = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.|NaN|Inf|\+Inf|-Inf)"
SAMPLE_RE = rf"^\s*({_NAME})(?:\{{(.*)\}})?[ \t]+({_VALUE})(?:[ \t]+(-?[0-9]+))?[ \t]*$"
_CANDIDATE_RE = rf"^\s*(?:{_NAME}\{{|DCGM_)"
_TYPE_RE = rf"^#\s*TYPE\s+({_NAME})\s+(counter|gauge|histogram|summary|untyped)\b"
LABELS = ("Hostname", "hostname", "node", "instance", "gpu", "GPU_I_ID", "minor_number", "device", "UUID")


def _label(labels: pl.Expr, name: str) -> pl.Expr:
    return labels.str.extract(rf'(?:^|,)\s*{name}\s*=\s*"((?:[^"\\]|\\.)*)"', 1)


class PrometheusTextReader(ReaderBase):
    name = SOURCE_TEXT

    def sniff(self, head: str, path: Path) -> bool:
        if re.search(r"^\s*DCGM_FI_[A-Z0-9_]+(?:\{[^\n]*\})?[ \t]+" + _VALUE, head, re.M):
            return True
        return bool(re.search(_TYPE_RE, head, re.M)) and bool(re.search(SAMPLE_RE, head, re.M))

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        host = file_host(ctx.rel_path)
        norm = _Normalizer(host, SOURCE_TEXT)
        for batch in line_frames(ctx.path):
            yield self._chunk(batch, norm)

    def _chunk(self, batch: pl.DataFrame, norm: _Normalizer) -> Chunk:
        line = pl.col("line")
        g = line.str.extract_groups(SAMPLE_RE)
        b = batch.with_columns(
            _is_sample=line.str.contains(SAMPLE_RE),
            _candidate=line.str.contains(_CANDIDATE_RE),
            _type=line.str.extract_groups(_TYPE_RE),
            name=g.struct.field("1"),
            labels=g.struct.field("2").fill_null(""),
            _v=g.struct.field("3"),
            _ts=g.struct.field("4"),
        )
        for name, kind in (
            b.select(pl.col("_type").struct.field("1"), pl.col("_type").struct.field("2"))
            .drop_nulls()
            .iter_rows()
        ):
            if kind == "counter":
                norm.counters.add(name)
        # a timestamp (ms) no epoch can be would overflow the conversion: the line is rejected
        ts_us = epoch_in_range(pl.col("_ts").cast(pl.Float64, strict=False) * 1000)  # ms -> us
        bad_ts = pl.col("_is_sample") & pl.col("_ts").is_not_null() & ts_us.is_null()
        bad = b.filter((~pl.col("_is_sample") & pl.col("_candidate")) | bad_ts).with_columns(
            reason=pl.when(bad_ts)
            .then(pl.format("timestamp out of range: {}", pl.col("_ts").str.slice(0, 40)))
            .otherwise(pl.lit("malformed sample line (scrape cut mid-line?)"))
        )
        s = b.filter(pl.col("_is_sample") & ~bad_ts)
        s = s.select(
            "line_no",
            "line",
            "name",
            *[_label(pl.col("labels"), lab).alias(lab) for lab in LABELS],
            value=pl.col("_v").str.replace(r"^\+", "").cast(pl.Float64, strict=False),
            ts=epoch_to_ts(ts_us),
        )
        out, rej, n_skipped = norm.normalize(s)
        rej = pl.concat([bad.select("line_no", "line", "reason"), rej])
        n_skip = batch.height - s.height - bad.height + n_skipped
        return accounted_chunk(batch.height, "gpu_samples", out, rej, n_skip)


class _Normalizer:
    """Labels -> host/gpu, dcgm names -> canonical metric and unit, plus clock and counter
    hygiene, shared by the text and JSON readers (state spans the chunks of one file)."""

    def __init__(self, host: str, source: str) -> None:
        self.host = host
        self.source = source
        self.counters: set[str] = set()
        self.clock = SeriesClock(["host", "gpu", "metric"])
        self.repair = CounterRepair(["host", "gpu", "metric"])

    def normalize(self, s: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, int]:
        """``s``: line_no, line, name, label columns, value (float), ts. Returns samples,
        rejects (line_no, line, reason) and how many lines were skipped by rule."""
        # one chunk per column first: Polars 2.1 panics ("assertion failed: i < self.len()") in
        # the label expressions below on some multi-chunk frames (found by the fuzz: lines
        # near the line limit among samples); a rechunk costs one copy of the batch
        s = s.rechunk()
        for lab in LABELS:
            if lab not in s.columns:
                s = s.with_columns(pl.lit(None, dtype=pl.String).alias(lab))
        empty = lambda c: pl.when(pl.col(c) != "").then(pl.col(c))  # noqa: E731
        gpu = pl.coalesce(
            pl.when(empty("GPU_I_ID").is_not_null()).then(
                pl.format("{}/{}", empty("gpu"), empty("GPU_I_ID"))
            ),
            empty("gpu"),
            empty("minor_number"),
            empty("device").str.strip_prefix("nvidia"),
            empty("UUID"),
        )
        host = pl.coalesce(
            empty("Hostname"),
            empty("hostname"),
            empty("node"),
            empty("instance").str.replace(r":\d+$", ""),
            pl.lit(self.host),
        )
        s = s.with_columns(gpu=gpu, host=host)
        skip = pl.col("gpu").is_null() | pl.col("value").is_null() | pl.col("value").is_nan().fill_null(False)
        n_skipped = s.filter(skip).height
        s = s.filter(~skip)
        fields = {f: m for f, m in DCGM_FIELDS.items()}
        canon = pl.col("name").replace_strict({f: m.canonical for f, m in fields.items()}, default=None)
        factor = pl.lit(1.0)
        for unit in {m.dcgm_unit for m in fields.values() if m.dcgm_unit}:
            names = [f for f, m in fields.items() if m.dcgm_unit == unit]
            target = next(m.unit for m in fields.values() if m.dcgm_unit == unit)
            factor = (
                pl.when(pl.col("name").is_in(names)).then(factor_expr(pl.lit(unit), target)).otherwise(factor)
            )
        s = s.with_columns(
            metric=pl.coalesce(canon, pl.col("name")),
            value=pl.when(canon.is_not_null()).then(pl.col("value") * factor).otherwise(pl.col("value")),
        )
        reason = self.clock.check(s.select("host", "gpu", "metric", "ts"))
        s = s.with_columns(_reason=reason)
        rej = s.filter(pl.col("_reason").is_not_null()).select("line_no", "line", reason="_reason")
        s = s.filter(pl.col("_reason").is_null())
        counters = list(COUNTERS | self.counters)
        is_counter = pl.col("metric").is_in(counters) | pl.col("name").is_in(counters)
        c = s.filter(is_counter)
        if c.height:
            c = self.repair.apply(c)
            g = s.filter(~is_counter).with_columns(counter_reset=pl.lit(False))
            s = pl.concat([g, c]).sort("line_no")
        else:
            s = s.with_columns(counter_reset=pl.lit(False))
        out = s.select(
            "host",
            "gpu",
            "ts",
            "metric",
            "value",
            source=pl.lit(self.source),
            quality=pl.when(pl.col("counter_reset")).then(pl.lit("counter_reset")),
        )
        return out, rej, n_skipped


def _pair_columns(pairs: list) -> tuple[pl.Series, pl.Series]:
    """(ts seconds, value text) of ``[[ts, "v"], ...]``; null where an entry is not a pair.

    Two list comprehensions over the already-decoded pairs: measured ~50x faster than letting
    Polars convert the nested lists (``pl.Series(pairs, dtype=List(String), strict=False)``)."""
    is_pair = [isinstance(p, list) and len(p) == 2 for p in pairs]
    ts = [p[0] if ok else None for p, ok in zip(pairs, is_pair, strict=True)]
    raw = [str(p[1]) if ok else None for p, ok in zip(pairs, is_pair, strict=True)]
    return pl.Series("_t", ts, dtype=pl.Float64, strict=False), pl.Series("_raw", raw, dtype=pl.String)


class PrometheusRangeJsonReader(ReaderBase):
    name = SOURCE_JSON

    def sniff(self, head: str, path: Path) -> bool:
        h = head.lstrip()
        return (
            h.startswith("{")
            and bool(re.search(r'"resultType"\s*:\s*"(matrix|vector)"', head))
            and '"result"' in head
        )

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        size, cap = ctx.path.stat().st_size, limits.current().max_document_bytes
        if size > cap:
            raise UnreadableFile(f"JSON document of {size} bytes, over the {cap}-byte document limit")
        try:
            doc = json.loads(ctx.path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UnreadableFile(f"not a JSON document: {exc}") from exc
        except RecursionError as exc:  # a query answer is never nested that deep
            raise UnreadableFile("not a Prometheus answer: JSON nested past Python's recursion limit") from exc
        if (
            not isinstance(doc, dict)
            or doc.get("status") != "success"
            or not isinstance(doc.get("data"), dict)
        ):
            raise UnreadableFile(
                f"Prometheus answer is not a success: status={doc.get('status') if isinstance(doc, dict) else None!r}"
            )
        result = doc["data"].get("result") or []
        if not isinstance(result, list):
            raise UnreadableFile("Prometheus answer: data.result is not a list of series")
        frames = []
        # one frame per series (not per sample): the values arrays are converted column-wise
        for series in result:
            labels = series.get("metric") if isinstance(series, dict) else None
            pairs = None
            if isinstance(series, dict) and isinstance(labels or {}, dict):
                labels = labels or {}
                pairs = series.get("values") if "values" in series else [series.get("value")]
            if not isinstance(pairs, list):
                # a series that is not {"metric": {...}, "values": [...]}: one rejected record
                pairs, labels = [None], {"__name__": "", "malformed_series": json.dumps(series)[:200]}
            if not pairs:
                continue
            # a null or malformed entry stays a record (rejected below), never silently dropped
            ts_col, v_col = _pair_columns(pairs)
            f = pl.DataFrame({"_t": ts_col, "_raw": v_col})
            f = f.with_columns(
                name=pl.lit(str(labels.get("__name__", ""))),
                **{
                    lab: pl.lit(str(labels[lab]) if lab in labels else None, dtype=pl.String)
                    for lab in LABELS
                },
                _series=pl.lit(json.dumps(labels, sort_keys=True)[:300]),
            )
            frames.append(f)
        if not frames:
            yield Chunk(lines=0)
            return
        s = (
            pl.concat(frames)
            .with_row_index("line_no", offset=1)
            .with_columns(pl.col("line_no").cast(pl.Int64))
        )
        s = s.with_columns(
            value=pl.col("_raw").str.replace(r"^\+", "").cast(pl.Float64, strict=False),
            ts=epoch_to_ts(epoch_in_range(pl.col("_t"))),
            line=pl.format(
                "{} [{}, {}]", pl.col("_series"), pl.col("_t").cast(pl.String).fill_null("?"), pl.col("_raw").fill_null("?")
            ),
        )
        bad = s.filter(
            (pl.col("value").is_null() & ~pl.col("_raw").is_in(["NaN", "nan"]))
            | pl.col("ts").is_null()
            | (pl.col("name") == "")
        ).select(
            "line_no", "line", reason=pl.lit('sample is not [unix_seconds, "number"] under a named series')
        )
        s = s.join(bad.select("line_no"), on="line_no", how="anti").sort("line_no")
        norm = _Normalizer(file_host(ctx.rel_path), SOURCE_JSON)
        out, rej, n_skipped = norm.normalize(s.drop("_t", "_raw", "_series"))
        rej = pl.concat([bad, rej])
        total = s.height + bad.height
        yield Chunk(
            tables={"gpu_samples": out} if out.height else {},
            rejects=rejects_frame(rej["line_no"], rej["reason"], rej["line"]) if rej.height else None,
            lines=total,
            rows_rejected=rej.height,
            rows_skipped=n_skipped,
            rows_ok=total - rej.height - n_skipped,
        )
