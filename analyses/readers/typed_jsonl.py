"""Typed, per-line-checked decoding of JSON-lines files, shared by the rollout workload readers.

Why not ``pl.read_ndjson`` or ``str.json_decode``: both fail the whole file on one bad line and
silently coerce types (``2.5`` into an Int64 column becomes ``2``, ``true`` becomes ``1``). A line
must instead be rejected with the reason it is bad. So lines are read with Polars
(:mod:`analyses.readers.lines`, 1-based line numbers) and handed, as one Arrow frame per batch, to DuckDB,
whose JSON functions check each line's validity and each field's JSON type exactly
(``json_valid``/``json_type``) before extracting typed values. Everything stays columnar: no
Python loop over lines.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analyses.readers import limits
from analyses.readers.base import Chunk, rejects_frame
from analyses.readers.flat_metrics import drop_thread_connection, thread_connection
from analyses.readers.json_scan import max_depth, split_too_deep
from analyses.readers.lines import iter_line_batches

# One batch of lines is decoded at a time; checks that must see the whole file (duplicates, the
# first line of a prompt group) carry their state across batches in a FileKeys.
BATCH_LINES = 50_000

_INT_TYPES = ("UBIGINT", "BIGINT", "HUGEINT")  # HUGEINT: DuckDB's merge of signed and unsigned
_ALLOWED = {"int": _INT_TYPES, "num": (*_INT_TYPES, "DOUBLE"), "str": ("VARCHAR",), "bool": ("BOOLEAN",)}
_SQL_TYPES = {"int": "BIGINT", "num": "DOUBLE", "str": "VARCHAR", "bool": "BOOLEAN"}
_INT_LISTS = tuple(f'["{t}"]' for t in (*_INT_TYPES, "NULL"))  # NULL: the structure of []
_KEY_OK = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class Field:
    """One JSON key of a record: its kind, whether it must be present, and whether >= 0.

    kinds: int, num, str, bool (scalars), int_list (list of integers), obj_list (list of objects
    whose keys are ``sub`` fields). ``name`` is the output column (defaults to ``key``).
    A JSON ``null`` counts as missing.
    """

    key: str
    kind: str
    required: bool = True
    nonneg: bool = False
    sub: tuple[Field, ...] = ()
    name: str | None = None

    def __post_init__(self) -> None:
        if not _KEY_OK.match(self.key):
            raise ValueError(f"unsupported JSON key {self.key!r}")
        if self.kind not in (*_SQL_TYPES, "int_list", "obj_list"):
            raise ValueError(f"unknown field kind {self.kind!r}")

    @property
    def col(self) -> str:
        return self.name or self.key


def _value_spec(fields: Sequence[Field]) -> str:
    parts = []
    for f in fields:
        if f.kind in _SQL_TYPES:
            parts.append(f'"{f.key}": "{_SQL_TYPES[f.kind]}"')
        elif f.kind == "int_list":
            parts.append(f'"{f.key}": ["BIGINT"]')
        else:
            parts.append(f'"{f.key}": [{_value_spec(f.sub)}]')
    return "{" + ", ".join(parts) + "}"


def build_sql(fields: Sequence[Field]) -> str:
    """The DuckDB query over ``src(line_no, line)``.

    Each line is parsed three times at most, in C: ``_t`` holds the JSON type of every top-level
    field (from ``json_structure``; a list field shows its merged element structure as text),
    ``_s`` the merged JSON types of the keys of ``obj_list`` elements, ``_v`` the values cast to
    the target types. Casting alone would hide wrong types (DuckDB turns 2.5 into 2), hence the
    types; the checks themselves are Polars expressions (:func:`reason_expr`).
    """
    top = "{" + ", ".join(f'"{f.key}": "VARCHAR"' for f in fields) + "}"
    objs = [f for f in fields if f.kind == "obj_list"]
    sub = "{" + ", ".join(
        f'"{f.key}": [{{' + ", ".join(f'"{s.key}": "VARCHAR"' for s in f.sub) + "}]" for f in objs
    ) + "}"
    cols = [
        f"json_transform(st, '{top}') AS _t",
        f"CASE WHEN top = 'OBJECT' THEN json_transform(line, '{_value_spec(fields)}') END AS _v",
    ]
    if objs:
        cols.append(f"json_transform(st, '{sub}') AS _s")
    return (
        "WITH v AS (SELECT line_no, line, json_valid(line) AS valid FROM src), "
        "w AS (SELECT *, CASE WHEN valid THEN json_type(line) END AS top FROM v), "
        "x AS (SELECT *, CASE WHEN top = 'OBJECT' THEN json_structure(line) END AS st FROM w) "
        f"SELECT line_no, line, valid, top, {', '.join(cols)} FROM x"
    )


def _missing(t: pl.Expr) -> pl.Expr:
    return t.is_null() | (t == "NULL")


def _field_reasons(f: Field) -> list[pl.Expr]:
    """Expressions giving the reason a line is bad for field ``f`` (null when it is fine)."""
    t = pl.col("_t").struct.field(f.key)
    v = pl.col("_v").struct.field(f.key)
    present = ~_missing(t)
    out: list[pl.Expr] = []
    if f.required:
        out.append(pl.when(~present).then(pl.lit(f"missing field: {f.key}")))
    if f.kind in _ALLOWED:
        out.append(pl.when(present & ~t.is_in(_ALLOWED[f.kind])).then(pl.format(f"wrong type for {f.key}: {{}}", t)))
        if f.kind == "int":
            out.append(pl.when(present & v.is_null()).then(pl.lit(f"integer out of range: {f.key}")))
        if f.nonneg:
            out.append(pl.when(present & (v < 0)).then(pl.lit(f"negative value: {f.key}")))
        return out
    is_list = t.str.starts_with("[")
    out.append(pl.when(present & ~is_list).then(pl.format(f"wrong type for {f.key}: {{}}", t)))
    # one record's list becomes that many rows: past the limit it is no real record (a prompt
    # sampled 8M times), and exploding it would cost gigabytes
    max_items = limits.current().max_list_items
    out.append(pl.when(present & (v.list.len() > max_items))
               .then(pl.format(f"list too long: {f.key} has {{}} items, over the limit of {max_items}", v.list.len())))
    if f.kind == "int_list":
        out.append(pl.when(present & is_list & ~t.is_in(_INT_LISTS)).then(pl.lit(f"non-integer element in {f.key}")))
        out.append(pl.when(present & v.list.eval(pl.element().is_null().any()).list.first())
                   .then(pl.lit(f"null or out-of-range element in {f.key}")))
        if f.nonneg:
            out.append(pl.when(present & (v.list.min() < 0)).then(pl.lit(f"negative value in {f.key}")))
        return out
    objs_ok = t.str.starts_with("[{") | (t == '["NULL"]')
    out.append(pl.when(present & is_list & ~objs_ok).then(pl.lit(f"non-object element in {f.key}")))
    for s in f.sub:
        st = pl.col("_s").struct.field(f.key).list.first().struct.field(s.key)
        sv = v.list.eval(pl.element().struct.field(s.key))
        where = f"{f.key}[].{s.key}"
        out.append(pl.when(present & ~_missing(st) & ~st.is_in(_ALLOWED[s.kind]))
                   .then(pl.format(f"wrong type for {where}: {{}}", st)))
        if s.required:
            out.append(pl.when(present & sv.list.eval(pl.element().is_null().any()).list.first())
                       .then(pl.lit(f"missing or out-of-range value: {where}")))
        if s.nonneg:
            out.append(pl.when(present & (sv.list.min() < 0)).then(pl.lit(f"negative value: {where}")))
    return out


def reason_expr(fields: Sequence[Field]) -> pl.Expr:
    """The first reason a decoded line is bad, in field order; null for a good line."""
    # built once per field set and list limit: building it cost ~3.5 ms, more than a small file's decode
    return _reason_expr(tuple(fields), limits.current().max_list_items)


@functools.lru_cache(maxsize=64)
def _reason_expr(fields: tuple[Field, ...], _max_list_items: int) -> pl.Expr:
    checks = [
        pl.when(~pl.col("valid")).then(pl.lit("invalid JSON")),
        pl.when(pl.col("top") != "OBJECT").then(pl.lit("not a JSON object")),
    ]
    for f in fields:
        checks += _field_reasons(f)
    return pl.coalesce(checks)


@dataclass
class Decoded:
    """Good lines (``line_no``, ``line`` and the typed field columns), rejected lines, and the
    accounting of the batch they came from."""

    ok: pl.DataFrame
    rejects: pl.DataFrame
    lines: int
    skipped: int

    def reject_where(self, reason: pl.Expr) -> Decoded:
        """Move the good rows where ``reason`` (a String expression) is not null to rejects."""
        df = self.ok.with_columns(_reason=reason)
        bad = df.filter(pl.col("_reason").is_not_null())
        if bad.height == 0:
            return self
        rej = rejects_frame(bad["line_no"], bad["_reason"], bad["line"])
        return Decoded(
            ok=df.filter(pl.col("_reason").is_null()).drop("_reason"),
            rejects=pl.concat([self.rejects, rej]).sort("line_no"),
            lines=self.lines,
            skipped=self.skipped,
        )

    def chunk(self, tables: dict[str, pl.DataFrame]) -> Chunk:
        return Chunk(tables=tables, rejects=self.rejects, lines=self.lines, rows_ok=self.ok.height,
                     rows_rejected=self.rejects.height, rows_skipped=self.skipped)


def decode_frame(lines: pl.DataFrame, fields: Sequence[Field], sql: str | None = None) -> Decoded:
    """Check and decode a frame of (line_no, line). Blank lines are skipped (documented rule)."""
    blank = lines["line"].str.strip_chars().str.len_bytes() == 0
    # a UTF-8 byte-order mark (Windows editors) would make the first record invalid JSON
    src = lines.filter(~blank).select(pl.col("line_no").cast(pl.Int64), pl.col("line").str.strip_prefix("\ufeff"))
    src, deep = split_too_deep(src, limits.current().max_json_depth)
    con = thread_connection()
    try:
        con.register("src", src)
        out = con.sql(sql or build_sql(fields)).pl()
        con.unregister("src")
    except BaseException:  # a failed query may leave the connection unusable: start afresh next time
        drop_thread_connection()
        raise
    out = out.sort("line_no").with_columns(reason=reason_expr(fields))
    good = out.filter(pl.col("reason").is_null())
    values = good.select("line_no", "line", pl.col("_v").struct.unnest())
    bad = pl.concat([out.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "line"), deep])
    bad = bad.sort("line_no")
    return Decoded(
        ok=values.rename({f.key: f.col for f in fields if f.col != f.key}),
        rejects=rejects_frame(bad["line_no"], bad["reason"], bad["line"]),
        lines=lines.height,
        skipped=int(blank.sum()),
    )


def decode_jsonl(path: Path, fields: Sequence[Field], batch_lines: int = BATCH_LINES) -> Iterator[Decoded]:
    """Stream ``path`` as batches of decoded lines (one batch for any ordinary step file).

    Lines come from :func:`analyses.readers.lines.iter_line_batches`: plain or gzip, and an
    invalid UTF-8 byte is replaced (U+FFFD) rather than failing the whole file.
    """
    sql = build_sql(fields)
    for batch in iter_line_batches(path, batch_lines=batch_lines):
        if batch.lines.height:  # unfiltered: the batch holds every line it covers
            yield decode_frame(batch.lines, fields, sql)


class FileKeys:
    """The line on which each value of a key first appeared in a file, across the batches of
    :func:`decode_jsonl` (a step file longer than ``BATCH_LINES`` still gets its duplicates
    found and its groups numbered as a whole). Holds each distinct key once; nulls are a value."""

    def __init__(self, *keys: pl.Expr) -> None:
        self.keys = keys  # expressions over a decoded frame, each with a distinct output name
        self.first: pl.DataFrame | None = None  # key columns + _first

    def first_line(self, df: pl.DataFrame) -> pl.Series:
        """Per row of ``df`` (in order), the ``line_no`` its key first appeared on in this file
        (this batch included; ``!= line_no`` means a repeat); remembers the batch's keys."""
        k = df.select(*self.keys, pl.col("line_no"))
        names = k.columns[:-1]
        seen = k.group_by(names, maintain_order=True).agg(_first=pl.col("line_no").min())
        if self.first is not None:
            seen = pl.concat([self.first, seen]).group_by(names, maintain_order=True).agg(pl.col("_first").min())
        self.first = seen
        return k.join(seen, on=names, how="left", nulls_equal=True, maintain_order="left")["_first"]


def step_from_name(path: Path, pattern: str) -> int | None:
    """The step number a file name states (``pattern`` has one group), or None."""
    m = re.search(pattern, path.name)
    return int(m.group(1)) if m and int(m.group(1)) < 2**63 else None  # past Int64: no step


def first_json_objects(head: str, n: int = 5) -> list[dict]:
    """Up to ``n`` JSON objects from the first complete lines of ``head`` (for sniffing only);
    a line that is no JSON, or nests deeper than the reader accepts, is passed over."""
    out: list[dict] = []
    depth_limit = limits.current().max_json_depth
    for line in head.lstrip("\ufeff").splitlines():  # a line cut by the head limit fails to parse
        if not line.strip():
            continue
        try:
            if line.count("{") + line.count("[") > depth_limit and max_depth(line.encode()) > depth_limit:
                continue
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            out.append(obj)
        if len(out) >= n:
            break
    return out
