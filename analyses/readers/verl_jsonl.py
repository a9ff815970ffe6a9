"""verl's JSONL file logger (``trainer.logger=['file']``): one line per ``Tracking.log`` call,
``{"step": N, "data": {"<metric>": <value>, ...}}``.

Two writer generations exist: ``json.dumps`` (``{"step": 1, "data": {...}}``, with spaces, and
bare ``NaN``/``Infinity`` for non-finite floats) and ``orjson.dumps`` (compact, non-finite floats
as ``null``). Both put ``step`` first. The keys of ``data`` vary by line (step 0 usually holds
only validation metrics; forks add their own keys), so lines are flattened by
:func:`analyses.readers.flat_metrics.json_leaves` rather than read with a fixed schema.

Line rule (counted in ``source_files``):

* blank line -> **skipped**;
* not valid JSON, not an object, no ``step`` key, a ``step`` that is not a non-negative integer
  (``1.0`` is accepted as 1; ``"1"``, ``1.5``, ``true`` are not), no ``data`` key, or a ``data``
  that is not an object -> **rejected** with that reason;
* a record whose ``data`` holds no value that is a metric (``{}``, or only nulls and words)
  -> **skipped** (nothing to store, nothing wrong);
* otherwise **parsed**: each metric value of ``data`` becomes one ``step_metrics`` row (name
  canonicalised by :func:`analyses.steps.canonical_metric`, ``is_validation`` per metric).

Values follow the rules of :mod:`analyses.readers.flat_metrics`: ``null`` values make no row;
strings become metrics only when they read as a number (``"0.5"``); other strings
(``"resize/mode": "schedule"``) are not metrics and are dropped without a ``rejects`` row (the
line itself is fine); their number is logged per file. Top-level keys other than ``step`` and
``data`` are ignored (verl writes none).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl

from analyses.readers.base import METRIC_SOURCE_STRUCTURED, Chunk, FileContext, ReaderBase, rejects_frame
from analyses.readers.flat_metrics import (
    dropped_counts,
    integral_step,
    json_leaves,
    metric_rows,
    query_frame,
    read_jsonl,
)

# first non-blank line: {"step": <number>, "data": {
_SNIFF = re.compile(r'\A\s*\{\s*"step"\s*:\s*-?\d+(?:\.\d+)?\s*,\s*"data"\s*:\s*\{')

# CASE evaluates its branch only on the rows that pass json_valid: an invalid line never
# reaches the other json functions (which would raise)
_CHECK_SQL = """
SELECT line_no, v AS ok,
       CASE WHEN v THEN json_type(line) END AS t,
       CASE WHEN v THEN json_type(line, '$.step') END AS step_t,
       CASE WHEN v THEN line ->> '$.step' END AS step_s,
       CASE WHEN v THEN json_type(line, '$.data') END AS data_t
FROM (SELECT line_no, line, json_valid(line) AS v FROM batch)
"""
_INT_TYPES = ("UBIGINT", "BIGINT", "DOUBLE")


class VerlFileLoggerReader(ReaderBase):
    metric_source = METRIC_SOURCE_STRUCTURED
    name = "verl_jsonl"
    framework = "verl"
    batch_lines = 500  # a verl line is ~4-15 KB (~150 keys): a few MB of text per batch

    def sniff(self, head: str, path: Path) -> bool:
        return _SNIFF.match(head) is not None

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        return read_jsonl(ctx, self.name, self.batch_lines, self._chunk)

    def _chunk(self, con: duckdb.DuckDBPyConnection, batch: pl.DataFrame) -> tuple[Chunk, dict[str, int]]:
        blank = batch["line"].str.strip_chars() == ""
        body = batch.filter(~blank)
        checked = query_frame(con, "batch", body, _CHECK_SQL)
        step, step_reason = integral_step(pl.col("step_s"))
        checked = checked.with_columns(
            step=step,
            reason=pl.when(~pl.col("ok"))
            .then(pl.lit("invalid JSON"))
            .when(pl.col("t") != "OBJECT")
            .then(pl.lit("not a JSON object"))
            .when(pl.col("step_t").is_null())
            .then(pl.lit("missing key 'step'"))
            .when(~pl.col("step_t").is_in(_INT_TYPES))
            .then(pl.lit("step is not an integer: ") + pl.col("step_s").str.slice(0, 40))
            .when(step_reason.is_not_null())
            .then(step_reason)
            .when(pl.col("data_t").is_null())
            .then(pl.lit("missing key 'data'"))
            .when(pl.col("data_t") != "OBJECT")
            .then(pl.lit("'data' is not a JSON object")),
        )
        reasons = (
            body.join(checked.filter(pl.col("reason").is_not_null()), on="line_no", how="inner")
            .select("line_no", "reason", "line")
            .sort("line_no")
        )
        ok_steps = checked.filter(pl.col("reason").is_null()).select("line_no", pl.col("step").cast(pl.Int64))
        leaves = json_leaves(con, body.join(ok_steps, on="line_no", how="semi"), "line -> '$.data'")
        rows = metric_rows(leaves, ok_steps)
        n_parsed = rows["line_no"].n_unique() if rows.height else 0
        chunk = Chunk(
            tables={"step_metrics": rows},
            rejects=rejects_frame(reasons["line_no"], reasons["reason"], reasons["line"]),
            lines=batch.height,
            rows_ok=n_parsed,
            rows_rejected=reasons.height,
            rows_skipped=int(blank.sum()) + ok_steps.height - n_parsed,
        )
        return chunk, dropped_counts(leaves)
