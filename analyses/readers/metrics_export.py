"""Generic step-metric exports: one record per logged step, a step column and metric columns,
as JSONL (``metrics_jsonl``) or CSV (``metrics_csv``). A wandb history export
(``run.history()`` / ``run.scan_history()`` dumped to JSONL or CSV) is the typical producer:
it carries wandb's own ``_step``, ``_runtime`` (seconds since run start) and ``_timestamp``
(epoch seconds) besides the metrics.

The step of a record is the first present (non-null, non-empty) of :data:`STEP_COLUMNS`, in this
order: ``step``, ``_step``, ``global_step``, ``training/global_step``. It is chosen per record,
and a present but bad first candidate rejects the record (no fall-through to the next one).
Candidates that were not chosen are kept as metrics (verl logs ``training/global_step`` as a
metric), except ``_step``.

wandb bookkeeping is not stored as metrics: ``_step``, ``_runtime``, ``_timestamp`` and the
``_wandb/*`` subtree. ``_timestamp`` becomes the ``steps`` attribute ``ts`` (UTC); ``_runtime``
is dropped: a value present on every row would make validation-only rows look like training
steps, and ``ts`` carries the wall clock.

Values follow :mod:`analyses.readers.flat_metrics` (nested objects flattened with ``/``, booleans
as 1/0, numeric strings read as numbers, other strings/nulls/arrays/wandb media objects dropped
and counted in the per-file INFO log, not stored). CSV cells are all text: an empty cell is a
missing value; ``true``/``false`` (any case) are booleans; a non-numeric cell in a metric
column (``"{'_type': 'histogram', ...}"``, a run name) is dropped per cell, the rest of the row
is kept. A column named ``""`` or ``Unnamed: N`` is the index pandas' ``to_csv`` writes: ignored.

Line rule (counted in ``source_files``):

* JSONL: blank -> skipped; invalid JSON, not an object, no step, step not a JSON number or not a
  non-negative integer (``3.0`` counts as 3) -> rejected; a record with no metric value ->
  skipped; otherwise parsed.
* CSV: line 1 is the header (skipped); a blank line or a row of empty cells -> skipped; a row
  with a different number of fields than the header, no step cell, or a step that is not a
  non-negative integer -> rejected; a row with no metric value -> skipped; otherwise parsed.
  Rows are split on commas outside double quotes, one physical line per row: a quoted cell
  spanning lines (never written by wandb or pandas for numeric exports) makes its lines rejects.

Sniffing is strict since these are the most general formats: a step column plus at least one
other column, and none of the marks of the more specific formats (verl ``{"step", "data"}``,
PolyTrace/rollout records with ``input``/``output``/``dp_rank``/..., nvidia-smi ``[MiB]``
headers, per-worker ``worker,gpu,time`` tables).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl

from analyses.readers.base import Chunk, FileContext, ReaderBase, UnreadableFile, rejects_frame
from analyses.readers.flat_metrics import (
    BOOL_TEXT,
    LEAF_SCHEMA,
    NUMERIC_TEXT,
    add_counts,
    count_unseen,
    dropped_counts,
    epoch_seconds_ts,
    integral_step,
    json_leaves,
    log_dropped,
    metric_rows,
    query_frame,
    read_jsonl,
)
from analyses.readers.lines import iter_line_batches

STEP_COLUMNS: tuple[str, ...] = ("step", "_step", "global_step", "training/global_step")
WANDB_INTERNAL = ("_step", "_runtime", "_timestamp")
TIMESTAMP_COLUMN = "_timestamp"
# keys that mark a per-sample / per-rank record of a more specific format, never a metrics row
SAMPLE_MARKERS = frozenset(
    {
        "input",
        "output",
        "dp_rank",
        "tp_rank",
        "rank",
        "sample_id",
        "request_id",
        "prompt",
        "response",
        "turns",
        "tool_calls",
        "trainer_step",
        "local_index",
    }
)
_NO_STEP = "no step (none of " + ", ".join(STEP_COLUMNS) + ")"
# one CSV field after its separating comma (a comma is prepended to the line, so every field has
# one and no match is empty): quoted (with "" escapes) or bare
_CSV_FIELD = r',(?:"(?:[^"]|"")*"|[^,]*)'


def _is_internal(name: pl.Expr) -> pl.Expr:
    return name.is_in(list(WANDB_INTERNAL)) | (name == "_wandb") | name.str.starts_with("_wandb/")


def _records_chunk(long: pl.DataFrame, lines: pl.DataFrame, step_kind: str) -> tuple[Chunk, dict[str, int]]:
    """Shared tail of both readers.

    ``long``: ``line_no, name, kind, text`` for every record that is structurally fine;
    ``lines``: ``line_no, line, reason`` for every input line of the batch, where ``reason`` is
    already set for structural rejects and ``"blank"`` marks skipped blank lines.
    ``step_kind``: the leaf kind a step must have (``number`` for JSON, ``string`` for CSV text).
    """
    rank = {c: i for i, c in enumerate(STEP_COLUMNS)}
    cands = (
        long.filter(
            pl.col("name").is_in(list(STEP_COLUMNS))
            & (pl.col("kind") != "null")
            & (pl.col("text").str.strip_chars() != "")
        )
        .with_columns(rank=pl.col("name").replace_strict(rank, return_dtype=pl.Int64))
        .sort("line_no", "rank")
        .unique("line_no", keep="first", maintain_order=True)
    )
    step, step_reason = integral_step(pl.col("text"))
    cands = cands.with_columns(
        step=step,
        reason=pl.when(pl.col("kind") != step_kind)
        .then(
            pl.format("step column '{}' is not a number: {}", pl.col("name"), pl.col("text").str.slice(0, 40))
        )
        .when(step_reason.is_not_null())
        .then(pl.format("{} (column '{}')", step_reason, pl.col("name"))),
    )
    structural_ok = lines.filter(pl.col("reason").is_null()).select("line_no")
    no_step = structural_ok.join(cands, on="line_no", how="anti").with_columns(reason=pl.lit(_NO_STEP))
    step_rejects = cands.filter(pl.col("reason").is_not_null()).select("line_no", "reason")
    bad = pl.concat(
        [
            lines.filter(pl.col("reason").is_not_null() & (pl.col("reason") != "blank")).select(
                "line_no", "reason"
            ),
            no_step.select("line_no", "reason"),
            step_rejects,
        ]
    )
    rejected = lines.select("line_no", "line").join(bad, on="line_no", how="inner").sort("line_no")

    ok = cands.filter(pl.col("reason").is_null()).select(
        "line_no", pl.col("step").cast(pl.Int64), step_name="name"
    )
    metric_leaves = (
        long.join(ok.select("line_no", "step_name"), on="line_no", how="inner", maintain_order="left")
        .filter(~_is_internal(pl.col("name")) & (pl.col("name") != pl.col("step_name")))
        .drop("step_name")
    )
    rows = metric_rows(metric_leaves, ok.select("line_no", "step"))
    n_parsed = rows["line_no"].n_unique() if rows.height else 0
    ts = (
        long.filter((pl.col("name") == TIMESTAMP_COLUMN) & (pl.col("kind") == step_kind))
        .join(ok, on="line_no", how="inner", maintain_order="left")
        .select("step", ts=epoch_seconds_ts(pl.col("text").str.strip_chars().cast(pl.Float64, strict=False)))
        .filter(pl.col("ts").is_not_null())
    )
    chunk = Chunk(
        tables={"step_metrics": rows},
        step_attrs=ts if ts.height else None,
        rejects=rejects_frame(rejected["line_no"], rejected["reason"], rejected["line"]),
        lines=lines.height,
        rows_ok=n_parsed,
        rows_rejected=rejected.height,
        rows_skipped=lines.height - rejected.height - n_parsed,
    )
    return chunk, dropped_counts(metric_leaves)


def _first_line(head: str) -> str | None:
    for line in head.splitlines():
        if line.strip():
            return line.lstrip("\ufeff")
    return None


def _flatten(obj: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and "_type" not in v:
            out.update(_flatten(v, name + "/"))
        else:
            out[name] = v
    return out


def _integral_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer() and v >= 0


class MetricsJsonlReader(ReaderBase):
    name = "metrics_jsonl"
    # a batch is bounded by its text, not only its lines (each DuckDB round trip costs ~10 ms whatever
    # its size): batches of 1,000 lines read a wandb history export at 2.7 MB/s of CPU, of 4 MiB of
    # text (some 18,000 of its lines) 2.4x faster, in 110 MB more memory
    batch_lines = 50_000
    batch_bytes = 4 << 20

    def sniff(self, head: str, path: Path) -> bool:
        line = _first_line(head)
        if line is None or not line.lstrip().startswith("{"):
            return False
        try:
            obj = json.loads(line)  # one line of the head, to classify the file
            flat = _flatten(obj) if isinstance(obj, dict) else {}
        except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
            return False
        if not isinstance(obj, dict) or ("step" in obj and isinstance(obj.get("data"), dict)):
            return False  # verl file logger
        if SAMPLE_MARKERS & obj.keys() or any(isinstance(v, list) for v in obj.values()):
            return False
        step = next((flat[c] for c in STEP_COLUMNS if flat.get(c) is not None), None)
        if not _integral_number(step):
            return False
        others = [
            k
            for k in flat
            if k not in STEP_COLUMNS and k not in WANDB_INTERNAL and not k.startswith("_wandb")
        ]
        return any(isinstance(flat[k], int | float) and not isinstance(flat[k], bool) for k in others)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        return read_jsonl(ctx, self.name, self.batch_lines, self._chunk, self.batch_bytes)

    def _chunk(self, con: duckdb.DuckDBPyConnection, batch: pl.DataFrame) -> tuple[Chunk, dict[str, int]]:
        blank = batch["line"].str.strip_chars() == ""
        body = batch.filter(~blank)
        kinds = query_frame(
            con, "batch", body, "SELECT line_no, CASE WHEN json_valid(line) THEN json_type(line) END AS t FROM batch"
        )
        lines = batch.join(kinds, on="line_no", how="left", maintain_order="left").with_columns(
            reason=pl.when(blank)
            .then(pl.lit("blank"))
            .when(pl.col("t").is_null())
            .then(pl.lit("invalid JSON"))
            .when(pl.col("t") != "OBJECT")
            .then(pl.lit("not a JSON object"))
        )
        objects = lines.filter(pl.col("reason").is_null()).select("line_no", "line")
        long = json_leaves(con, objects, "line")
        return _records_chunk(long, lines.select("line_no", "line", "reason"), step_kind="number")


class MetricsCsvReader(ReaderBase):
    name = "metrics_csv"
    batch_lines = 5_000

    def sniff(self, head: str, path: Path) -> bool:
        lines = head.splitlines()
        if not lines:
            return False
        header = _parse_header(lines[0])
        if header is None or len(header) < 2 or len(set(header)) != len(header):
            return False
        if not any(c in STEP_COLUMNS for c in header):
            return False
        if any("[" in c and "]" in c for c in header) or {"worker", "time"} <= set(header):
            return False  # nvidia-smi units in headers; per-worker iteration times
        complete = lines[1:-1] if not head.endswith("\n") else lines[1:]
        sample = [ln for ln in complete if ln.strip()][:20]
        if not sample:
            return len(lines) == 1 or (len(lines) == 2 and not lines[1].strip())  # header only
        return any(_row_has_step(ln, header) for ln in sample)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        dropped: dict[str, int] = {}
        header: list[str] | None = None
        for batch in iter_line_batches(ctx.path, batch_lines=self.batch_lines):
            rows = batch.lines
            skipped_header = 0
            if header is None and rows.height:
                first = rows["line"][0]
                header = _parse_header(first)
                if (
                    header is None
                    or len(set(header)) != len(header)
                    or not any(c in STEP_COLUMNS for c in header)
                ):
                    raise UnreadableFile(f"not a metrics CSV header: {first[:200]!r}")
                rows = rows.slice(1)
                skipped_header = 1
            chunk, counts = self._chunk(rows, header or [])
            count_unseen(chunk, batch)
            chunk.lines += skipped_header
            chunk.rows_skipped += skipped_header
            add_counts(dropped, counts)
            yield chunk
        log_dropped(self.name, ctx.rel_path, dropped)

    def _chunk(self, batch: pl.DataFrame, header: list[str]) -> tuple[Chunk, dict[str, int]]:
        n = len(header)
        fields = (pl.lit(",") + pl.col("line")).str.extract_all(_CSV_FIELD)
        lines = batch.with_columns(fields=fields).with_columns(n_fields=pl.col("fields").list.len())
        cells = [
            _unquote(pl.col("fields").list.get(i, null_on_oob=True).str.strip_prefix(",")).alias(f"c{i}")
            for i in range(n)
            if not _is_index_column(header[i])
        ]
        wide = lines.select("line_no", *cells)
        long = (
            wide.unpivot(index="line_no", variable_name="col", value_name="text")
            .filter(pl.col("text").str.strip_chars() != "")
            .with_columns(name=pl.col("col").replace_strict({f"c{i}": h for i, h in enumerate(header)}))
            .with_columns(
                kind=pl.when(pl.col("text").str.strip_chars().str.contains(BOOL_TEXT))
                .then(pl.lit("bool"))
                .otherwise(pl.lit("string"))
            )
            .sort("line_no")
            .select(list(LEAF_SCHEMA))
        )
        has_cell = long.select("line_no").unique()
        lines = lines.with_columns(
            reason=pl.when(pl.col("line").str.strip_chars() == "")
            .then(pl.lit("blank"))
            .when(pl.col("n_fields") != n)
            .then(pl.format("expected {} fields, found {}", pl.lit(n), pl.col("n_fields")))
            .when(~pl.col("line_no").is_in(has_cell["line_no"].implode()))
            .then(pl.lit("blank"))  # a row of empty cells (",,,")
        )
        long = long.join(lines.filter(pl.col("reason").is_null()).select("line_no"), on="line_no", how="semi")
        return _records_chunk(long, lines.select("line_no", "line", "reason"), step_kind="string")


def _is_index_column(name: str) -> bool:
    """pandas' ``to_csv`` writes the frame index as a first column named "" (``Unnamed: 0`` once
    read and written again): a row number, not a metric."""
    return name == "" or re.fullmatch(r"Unnamed: \d+", name) is not None


def _unquote(cell: pl.Expr) -> pl.Expr:
    quoted = cell.str.starts_with('"') & cell.str.ends_with('"') & (cell.str.len_chars() >= 2)
    return (
        pl.when(quoted)
        .then(cell.str.slice(1, cell.str.len_chars() - 2).str.replace_all('""', '"', literal=True))
        .otherwise(cell)
    )


def _parse_header(line: str) -> list[str] | None:
    line = line.lstrip("\ufeff")
    if not line.strip() or line.lstrip()[:1] in ("{", "[", "#"):
        return None
    try:
        cols = next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None
    return [c.strip() for c in cols]


def _row_has_step(line: str, header: list[str]) -> bool:
    try:
        row = next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return False
    if len(row) != len(header):
        return False
    cells = dict(zip(header, (c.strip() for c in row), strict=True))
    step = next((cells[c] for c in STEP_COLUMNS if cells.get(c)), None)
    if step is None or not re.match(NUMERIC_TEXT, step):
        return False
    v = float(step)
    return v >= 0 and v.is_integer()
