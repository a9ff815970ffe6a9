"""Shared machinery of the step-metric readers that see one record per step with open-ended keys
(verl's JSONL file logger, wandb-style history exports in JSONL and CSV).

A record's keys are unknown and vary from line to line, so a fixed-schema NDJSON read does not
fit (an inferred struct would also break on a key that is a number in one line and a word in
the next). Instead each batch of lines goes through DuckDB's ``json_each`` (top level) and
``json_tree`` (nested objects only), which turn every record into its scalar *leaves*: one row
per leaf, in C++, no Python per line. Nested objects are flattened with ``/``
(``{"train": {"loss": 1}}`` -> ``train/loss``), which is how verl and wandb name metrics anyway.

Value rules (the same for every reader that uses this module; what is not a metric is counted
and logged per file at INFO, not stored):

* JSON numbers (including Python's ``NaN``/``Infinity`` that ``json.dumps`` writes) -> the value;
* booleans -> 1.0 / 0.0 (flags such as ``resize/applied`` are per-step facts worth keeping);
* strings that read as a decimal number (``"0.5"``, ``"1e-3"``, ``" 2 "``, ``"nan"``, ``"inf"``)
  -> the number; any other string (``"schedule"``, ``""``) is **not a metric**: dropped;
* ``null`` -> no row (the metric was not logged at that step);
* leaves inside arrays, and whole wandb media/histogram objects (objects with a ``_type`` key,
  e.g. ``{"_type": "histogram", "bins": [...]}``) -> not metrics: dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import duckdb
import polars as pl

from analyses import duckdb_instance
from analyses.readers import limits
from analyses.readers.base import Chunk, FileContext, rejects_frame
from analyses.readers.json_scan import split_too_deep
from analyses.readers.lines import LineBatch, iter_line_batches
from analyses.steps import canonical_metric, is_validation_metric

log = logging.getLogger(__name__)

# one path token of a DuckDB json_tree fullkey: .bare  ."quoted \" key"  [3]
_TOKEN = r'\.(?:"(?:[^"\\]|\\.)*"|[^."\[]+)|\[\d+\]'
NUMERIC_TEXT = r"(?i)^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$|^[+-]?(?:nan|inf|infinity)$"
BOOL_TEXT = r"(?i)^(?:true|false)$"

# DuckDB json_tree type -> our leaf kind
_KIND = {
    "UBIGINT": "number",
    "BIGINT": "number",
    "DOUBLE": "number",
    "BOOLEAN": "bool",
    "VARCHAR": "string",
    "NULL": "null",
}

LEAF_SCHEMA = {"line_no": pl.Int64, "name": pl.String, "kind": pl.String, "text": pl.String}
DUCKDB_THREADS = duckdb_instance.THREADS


def connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB for one file's batches."""
    return duckdb.connect(config={"threads": DUCKDB_THREADS})


_local = threading.local()


def thread_connection() -> duckdb.DuckDBPyConnection:
    """This thread's connection to the process's in-memory DuckDB (:mod:`analyses.duckdb_instance`),
    shared by the JSON readers (opening a database costs more than reading a small step file, and
    PolyTrace writes one file per step). Queries register their frames under a name and
    unregister them after."""
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb_instance.cursor()
    return con


def drop_thread_connection() -> None:
    """After a failed query: the next file starts on a fresh connection (and database, when the
    failure invalidated it)."""
    con = getattr(_local, "con", None)
    _local.con = None
    if con is not None:
        con.close()
    duckdb_instance.after_failure()


# top level first (json_each is ~4x cheaper than json_tree): scalars are leaves as they are;
# only objects/arrays (rare in metric logs) go through json_tree below
_TOP_SQL = """
SELECT d.line_no, t.id, t.key, t.type, json_extract_string(t.value, '$') AS text,
       CASE WHEN t.type IN ('OBJECT', 'ARRAY') THEN t.value END AS sub
FROM (SELECT line_no, {doc} AS doc FROM batch) d, json_each(d.doc) t
"""
# leaves of nested containers; an object with a "_type" key (wandb media/histogram) marks its
# whole subtree as media
_SUB_SQL = """
WITH nodes AS (
    SELECT s.line_no, s.id AS top_id, s.key AS top_key, s.type AS top_type,
           t.id, t.key, t.type, t.path, t.fullkey, json_extract_string(t.value, '$') AS text
    FROM subs s, json_tree(s.sub) t
),
media AS (SELECT DISTINCT line_no, top_id, path FROM nodes WHERE key = '_type' AND type = 'VARCHAR')
SELECT n.line_no, n.top_id, n.top_key, n.top_type, n.id, n.key, n.type, n.path, n.fullkey, n.text,
       EXISTS (SELECT 1 FROM media m WHERE m.line_no = n.line_no AND m.top_id = n.top_id
               AND (starts_with(n.fullkey, m.path || '.') OR starts_with(n.fullkey, m.path || '['))) AS in_media
FROM nodes n
WHERE n.type NOT IN ('OBJECT', 'ARRAY')
"""


def query_frame(con: duckdb.DuckDBPyConnection, name: str, frame: pl.DataFrame, sql: str) -> pl.DataFrame:
    """``sql`` run on ``con`` with ``frame`` registered as the view ``name`` for the query only."""
    con.register(name, frame)
    try:
        return con.sql(sql).pl()
    finally:
        con.unregister(name)


def _kind(type_col: str) -> pl.Expr:
    return pl.col(type_col).replace_strict(_KIND, default="string")


def _nested_leaves(con: duckdb.DuckDBPyConnection, subs: pl.DataFrame) -> pl.DataFrame:
    raw = query_frame(con, "subs", subs, _SUB_SQL)
    if raw.height == 0:
        return pl.DataFrame(
            schema={"line_no": pl.Int64, "top_id": pl.Int64, "sub_id": pl.Int64, **LEAF_SCHEMA}
        )
    path_tokens = pl.col("path").str.extract_all(_TOKEN)
    inner = path_tokens.list.eval(
        pl.element().str.strip_prefix(".").str.replace(r'^"(.*)"$', "${1}").str.replace_all(r"\\(.)", "${1}")
    ).list.join("/")
    prefix = pl.when(pl.col("path") == "$").then(pl.col("top_key")).otherwise(pl.col("top_key") + "/" + inner)
    in_array = (pl.col("top_type") == "ARRAY") | pl.col("fullkey").str.extract_all(_TOKEN).list.eval(
        pl.element().str.starts_with("[")
    ).list.any().fill_null(False)
    return raw.select(
        pl.col("line_no").cast(pl.Int64),
        pl.col("top_id").cast(pl.Int64),
        sub_id=pl.col("id").cast(pl.Int64),
        name=prefix + "/" + pl.col("key"),
        kind=pl.when(pl.col("in_media"))
        .then(pl.lit("media"))
        .when(in_array)
        .then(pl.lit("array"))
        .otherwise(_kind("type")),
        text=pl.col("text"),
    )


def json_leaves(con: duckdb.DuckDBPyConnection, batch: pl.DataFrame, doc_sql: str = "line") -> pl.DataFrame:
    """Scalar leaves of the JSON objects in ``batch`` (columns ``line_no``, ``line``; every line
    must be valid JSON). ``doc_sql`` selects the object to flatten (e.g. ``line -> '$.data'``).

    Returns ``line_no, name, kind, text`` in document order; kind is number | bool | string |
    null | array | media.
    """
    if batch.height == 0:
        return pl.DataFrame(schema=LEAF_SCHEMA)
    top = query_frame(con, "batch", batch, _TOP_SQL.format(doc=doc_sql))
    top = top.with_columns(pl.col("line_no").cast(pl.Int64), top_id=pl.col("id").cast(pl.Int64))
    flat = top.filter(pl.col("sub").is_null()).select(
        "line_no",
        "top_id",
        sub_id=pl.lit(0, pl.Int64),
        name=pl.col("key"),
        kind=_kind("type"),
        text=pl.col("text"),
    )
    subs = top.filter(pl.col("sub").is_not_null()).select("line_no", "id", "key", "type", "sub")
    parts = [flat, _nested_leaves(con, subs)] if subs.height else [flat]
    # json ids follow document order: sorting keeps the output identical run to run
    return pl.concat(parts).sort("line_no", "top_id", "sub_id").select(list(LEAF_SCHEMA))


def leaf_value(kind: pl.Expr, text: pl.Expr) -> pl.Expr:
    """The numeric value of a leaf under the module's value rules, null when it is no metric."""
    t = text.str.strip_chars()
    return (
        pl.when(kind == "number")
        .then(t.cast(pl.Float64, strict=False))
        .when(kind == "bool")
        .then((t.str.to_lowercase() == "true").cast(pl.Float64))
        .when((kind == "string") & t.str.contains(NUMERIC_TEXT))
        .then(t.cast(pl.Float64, strict=False))
        .otherwise(None)
    )


def integral_step(text: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(step as Int64 or null, reason or null) from a step's text: integral and >= 0 only."""
    t = text.str.strip_chars()
    as_float = pl.when(t.str.contains(NUMERIC_TEXT)).then(t.cast(pl.Float64, strict=False))
    as_int = t.cast(pl.Int64, strict=False)
    ok_int = (
        as_int.is_not_null()
        | (as_float.is_finite() & (as_float == as_float.floor()) & (as_float.abs() < 2**62))
    ).fill_null(False)
    step = pl.when(ok_int).then(pl.coalesce(as_int, as_float.cast(pl.Int64, strict=False)))
    reason = (
        pl.when(~ok_int)
        .then(pl.lit("step is not an integer: ") + t.str.slice(0, 40))
        .when(step < 0)
        .then(pl.lit("negative step: ") + t.str.slice(0, 40))
    )
    return pl.when(reason.is_null()).then(step), reason


def epoch_seconds_ts(seconds: pl.Expr) -> pl.Expr:
    """wandb ``_timestamp`` (epoch seconds, float) -> UTC datetime; implausible values -> null."""
    plausible = (seconds > 0) & (seconds < 1e11)  # beyond year 5000: not seconds (ms?) -> no ts
    us = pl.when(plausible).then((seconds * 1_000_000).round(0).cast(pl.Int64, strict=False))
    return pl.from_epoch(us, time_unit="us").dt.replace_time_zone("UTC")


def metric_rows(leaves: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``step_metrics`` rows from metric leaves (``line_no, name, kind, text``) and the step of
    each line (``line_no, step``); leaves that are not metrics under the value rules are dropped."""
    return (
        leaves.join(steps, on="line_no", how="inner", maintain_order="left")
        .with_columns(value=leaf_value(pl.col("kind"), pl.col("text")))
        .filter(pl.col("value").is_not_null())
        .select(
            "step",
            metric=canonical_metric(pl.col("name")),
            value="value",
            raw_metric="name",
            line_no="line_no",
        )
        .with_columns(is_validation=is_validation_metric(pl.col("metric")))
    )


def dropped_counts(leaves: pl.DataFrame) -> dict[str, int]:
    """How many leaves the value rules drop, by cause (for the per-file INFO log and tests)."""
    v = leaf_value(pl.col("kind"), pl.col("text"))
    out = leaves.select(
        null=(pl.col("kind") == "null").sum(),
        non_numeric_string=((pl.col("kind") == "string") & v.is_null()).sum(),
        in_array=(pl.col("kind") == "array").sum(),
        media=(pl.col("kind") == "media").sum(),
    )
    return {k: int(out[k][0] or 0) for k in out.columns}


def add_counts(total: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, 0) + v


def log_dropped(reader: str, rel_path: str, counts: dict[str, int]) -> None:
    if any(counts.values()):
        log.info("%s %s: values that are not metrics, not stored: %s", reader, rel_path, counts)


def count_unseen(chunk: Chunk, batch: LineBatch) -> None:
    """Physical lines a batch covers but does not hold (none when no filter is used): skipped."""
    unseen = batch.n_lines - batch.lines.height
    chunk.lines += unseen
    chunk.rows_skipped += unseen


ChunkFn = Callable[[duckdb.DuckDBPyConnection, pl.DataFrame], tuple[Chunk, dict[str, int]]]


def read_jsonl(ctx: FileContext, reader: str, batch_lines: int, chunk: ChunkFn,
               batch_bytes: int | None = None) -> Iterator[Chunk]:
    """The read loop of the JSON-lines metric readers: batches of at most ``batch_lines`` lines
    (and about ``batch_bytes`` of text), each turned into a chunk by ``chunk(con, lines)`` on one
    DuckDB connection for the file, with the values that are not metrics counted and logged once
    per file."""
    con = thread_connection()
    dropped: dict[str, int] = {}
    sized = {} if batch_bytes is None else {"batch_bytes": batch_bytes}
    try:
        for batch in iter_line_batches(ctx.path, batch_lines=batch_lines, **sized):
            # a record nested past DuckDB's JSON depth limit is rejected before any JSON function
            # sees it (json_tree's memory also grows with depth squared)
            body, deep = split_too_deep(batch.lines, limits.current().max_json_depth)
            out, counts = chunk(con, body)
            if deep.height:
                rej = rejects_frame(deep["line_no"], deep["reason"], deep["line"])
                out.rejects = rej if out.rejects is None else pl.concat([out.rejects, rej]).sort("line_no")
                out.lines += deep.height
                out.rows_rejected += deep.height
            count_unseen(out, batch)
            add_counts(dropped, counts)
            yield out
    except BaseException:
        drop_thread_connection()
        raise
    log_dropped(reader, ctx.rel_path, dropped)
