"""Typed, per-line-checked decoding of JSON-lines files, shared by the rollout workload readers.

Why not ``pl.read_ndjson`` or ``str.json_decode``: both fail the whole file on one bad line and
silently coerce types (``2.5`` into an Int64 column becomes ``2``, ``true`` becomes ``1``). A line
must instead be rejected with the reason it is bad. So lines are read with Polars
(:mod:`analyses.readers.lines`, 1-based line numbers) and handed, as one Arrow frame per batch, to DuckDB,
whose JSON functions check each line's validity and each field's JSON type exactly
(``json_valid``/``json_type``) before extracting typed values. Everything stays columnar: no
Python loop over lines.

That validating path parses each line four times. Most files have no bad line, so each batch is
first tried on a *fast path* (:func:`fast_decode_frame`): one typed ``json_transform`` per line,
after cheap whole-batch guards that prove no line could be rejected for its JSON types (see
:func:`conformance_pattern`), and whole-batch checks of the decoded values (required fields,
signs, list lengths). A batch that passes gives exactly what the validating path would give; any
doubt (one bad line, a parse error) sends the whole batch down the validating path instead.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from analyses.readers import limits
from analyses.readers.base import Chunk, FilesChunk, rejects_frame
from analyses.readers.duck_polars import ARROW_FROM_BYTES, duck_source, to_polars
from analyses.readers.flat_metrics import drop_thread_connection, thread_connection
from analyses.readers.json_scan import FLATTEN_BUDGET_BYTES, max_depth, split_too_deep
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
        """Move the good rows where ``reason`` (a String expression) is not null to rejects
        (which keep ``_file`` when the rows come from several files: :func:`decode_files`)."""
        df = self.ok.with_columns(_reason=reason)
        bad = df.filter(pl.col("_reason").is_not_null())
        if bad.height == 0:
            return self
        rej = rejects_frame(bad["line_no"], bad["_reason"], bad["line"])
        order = ["line_no"]
        if FILE_COLUMN in df.columns:
            rej, order = rej.with_columns(bad[FILE_COLUMN]), [FILE_COLUMN, "line_no"]
        return Decoded(
            ok=df.filter(pl.col("_reason").is_null()).drop("_reason"),
            rejects=pl.concat([self.rejects, rej]).sort(order),
            lines=self.lines,
            skipped=self.skipped,
        )

    def chunk(self, tables: dict[str, pl.DataFrame]) -> Chunk:
        return Chunk(tables=tables, rejects=self.rejects, lines=self.lines, rows_ok=self.ok.height,
                     rows_rejected=self.rejects.height, rows_skipped=self.skipped)


# ---------------------------------------------------------------------------- fast path

# After a key of each kind, the start of a value the validating path would reject for its JSON
# type (null is allowed: it reads as missing). DuckDB's parser also takes NaN, nan, inf,
# Infinity, -Infinity as numbers: those are refused here too (the validating path decides).
# Whitespace is JSON's four characters, not regex \s (Unicode's): a line with any other space
# between tokens does not parse, which fails the fast path anyway; the ASCII classes make the
# automaton smaller (the pattern's scan is the costliest check of a batch: 13% less CPU).
_WS = " \\t\\n\\r"
_BAD_VALUE = {
    "int": rf"(?:[^-0-9n{_WS}]|-[^0-9]|-?[0-9]+[.eE]|n[^u])",  # a fraction or an exponent: not an integer
    "num": rf"(?:[^-0-9n{_WS}]|-[^0-9]|n[^u])",
    "str": rf'(?:[^"n{_WS}]|n[^u])',
    "bool": rf"(?:[^tfn{_WS}]|n[^u])",
    # a list whose elements, up to its closing bracket, are not all plain integers
    "int_list": rf"(?:[^\[n{_WS}]|n[^u]|\[[-0-9,{_WS}]*[^-0-9,{_WS}\]])",
    "obj_list": rf"(?:[^\[n{_WS}]|n[^u])",
}
_SEP = f"[{_WS}]*:[{_WS}]*"  # between a key and its value


def conformance_pattern(fields: Sequence[Field], escapes: bool = True) -> str:
    """A regex that matches any line that might hold a value of the wrong JSON type for one of
    ``fields`` (or of their ``obj_list`` elements' ``sub`` fields).

    A key is matched as its literal text wherever it appears, so a same-named key elsewhere in a
    record only sends the batch down the validating path. Its spelling is literal unless the
    line holds a ``\\u`` escape (the keys are ``[A-Za-z0-9_]+``, see :class:`Field`): such lines
    match too, unless ``escapes`` is False (the caller looks for the literal ``\\u`` apart).
    """
    by_kind: dict[str, set[str]] = {}
    for f in fields:
        by_kind.setdefault(f.kind, set()).add(f.key)
        for sub in f.sub:
            by_kind.setdefault(sub.kind, set()).add(sub.key)
    alts = [r"\\u"] if escapes else []
    for kind, keys in sorted(by_kind.items()):
        alts.append('"(?:' + "|".join(sorted(keys)) + ')"' + _SEP + _BAD_VALUE[kind])
    # A key given twice: the typed read takes the first value, the validating path's types merge
    # both (so it rejects an optional integer given as null and then as a number, as out of
    # range): an optional integer given as null matches. (A list of objects given twice is
    # counted apart, see _fast_plan.)
    opt_ints = sorted(f.key for f in fields if f.kind == "int" and not f.required)
    if opt_ints:
        alts.append('"(?:' + "|".join(opt_ints) + ')"' + _SEP + "null")
    return "|".join(alts)


_ESCAPE = "\\u"

# a JSON number of 19 digits or more before any fraction (a run after "." is a fraction's): an
# integer from 2**63 on, which BIGINT does not hold (the validating path rejects it as out of
# range or, from 2**64 on, as a DOUBLE; the typed read gives null)
HUGE_INT = r"[:\[,\s]-?[0-9]{19}"


@dataclass(frozen=True)
class _FastPlan:
    spec: str  # json_transform target (the validating path's _v)
    line_checks: tuple[pl.Expr, ...]  # over src(line): all true = every line conforms textually
    # over the decoded fields: all true = no line is rejected; then _huge: an optional integer
    # is null somewhere, which it may be for being absent or for not fitting BIGINT (HUGE_INT
    # tells them apart)
    value_checks: tuple[pl.Expr, ...]
    complexity_ok: pl.Expr  # over src: no line over json_scan.too_complex's cheap bounds


@functools.lru_cache(maxsize=64)
def _fast_plan(fields: tuple[Field, ...], lim: limits.Limits) -> _FastPlan | None:
    """What the fast path checks for ``fields`` under ``lim``; None when it cannot prove a batch
    good (no required field: a line that is no object would pass unseen; an ``obj_list``
    without required sub-fields: an element that is no object would pass unseen)."""
    if not any(f.required for f in fields):
        return None
    if any(f.kind == "obj_list" and not any(s.required for s in f.sub) for f in fields):
        return None
    if any(f.key in ("line_no", "line") for f in fields):  # they sit beside the decoded fields
        return None
    line = pl.col("line")
    opens = line.str.count_matches(r"[\[{]")
    commas = line.str.count_matches(",", literal=True).cast(pl.Int64)
    size = line.str.len_bytes().cast(pl.Int64)
    line_checks = (
        line.str.starts_with("{").all(),  # a valid JSON text starting with { is one object
        # the escape apart, as a literal: in the pattern it cost a third of the pattern's scan
        ~line.str.contains(_ESCAPE, literal=True).any(),
        ~line.str.contains(conformance_pattern(fields, escapes=False)).any(),
        opens.max().fill_null(0) <= lim.max_json_depth,  # so no line nests deeper
        # a list of objects given twice: the typed read takes the first, the validating path
        # merges the types of both ({"turns": [{...}], "turns": [1]} is rejected)
        *(line.str.count_matches(f'"{f.key}"' + r"\s*:").max().fill_null(0) <= 1
          for f in fields if f.kind == "obj_list"),
    )
    complexity_ok = ~((commas >= lim.max_json_values) | ((commas + 1) * size > FLATTEN_BUDGET_BYTES)).any()
    checks: list[pl.Expr] = []
    optional_ints: list[pl.Expr] = []
    for f in fields:
        c = pl.col(f.key)
        if f.required:
            checks.append(c.null_count() == 0)
        elif f.kind == "int":
            optional_ints.append(c.null_count() > 0)
        if f.kind in ("int", "num"):
            if f.nonneg:
                checks.append(~(c < 0).any())
            continue
        if f.kind not in ("int_list", "obj_list"):
            continue
        checks.append(c.list.len().max().fill_null(0) <= lim.max_list_items)
        items = c.explode(empty_as_null=False, keep_nulls=False)
        if f.kind == "int_list":
            checks.append(items.null_count() == 0)
            if f.nonneg:
                checks.append(~(items < 0).any())
            continue
        for sub in f.sub:
            v = items.struct.field(sub.key)
            if sub.required:  # also catches an element that is null or no object
                checks.append(v.null_count() == 0)
            elif sub.kind == "int":
                optional_ints.append(v.null_count() > 0)
            if sub.nonneg:
                checks.append(~(v < 0).any())
    maybe_huge = pl.any_horizontal(optional_ints) if optional_ints else pl.lit(False)
    return _FastPlan(
        _value_spec(fields),
        tuple(e.alias(f"_l{i}") for i, e in enumerate(line_checks)),
        (*(e.alias(f"_v{i}") for i, e in enumerate(checks)), maybe_huge.alias("_huge")),
        complexity_ok,
    )


_NO_REJECTS = rejects_frame([], [], [])


def fast_decode_frame(src: pl.DataFrame, fields: Sequence[Field], lines: int, skipped: int) -> Decoded | None:
    """Decode non-blank lines ``src`` (``line_no, line``) with one typed ``json_transform`` each,
    when the batch provably holds no line the validating path would reject; else None.

    Proof: every line starts with ``{`` and parses (a parse error fails the query: None), so it
    is one object; no key of ``fields`` is followed by a value of the wrong JSON type
    (:func:`conformance_pattern`); no line is over the nesting and size bounds the validating
    path rejects (``json_too_deep``/``json_too_large``); required values are present (null:
    missing, or an integer too large), signed values are not negative, lists are within
    ``max_list_items`` and hold no nulls; an optional integer that is null is no huge integer
    (:data:`HUGE_INT`). Then every line is good, and its values are the validating path's (the
    same transform).
    """
    lim = limits.current()
    plan = _fast_plan(tuple(fields), lim)
    if plan is None or src.height == 0:
        return None
    # a line of n bytes has fewer than n values, and values x bytes < n * n: count the values
    # (json_scan.too_complex's bounds) only past that
    longest = src.get_column("line").str.len_bytes().max() or 0
    if (longest >= lim.max_json_values or longest * longest > FLATTEN_BUDGET_BYTES) and not (
        src.lazy().select(plan.complexity_ok).collect().item()
    ):
        return None
    if src.height > _PARAM_LINES:
        # a large batch: the textual checks run on Polars' threads while DuckDB decodes (safe:
        # the values guard above is passed, and DuckDB refuses nesting past its own limit)
        pending = src.lazy().select(plan.line_checks).collect(background=True)
        values = _transform(src, plan.spec, register=True)
        line_ok = pending.fetch_blocking().row(0)
    else:
        line_ok = src.select(plan.line_checks).row(0)
        values = None
        if all(v is True for v in line_ok):
            # a few lines: Python's json parser costs less than a DuckDB query (the same values,
            # see _parse_small); what it refuses goes to DuckDB
            values = _parse_small(src, tuple(fields), lim.max_list_items)
            if values is _BAD:  # a line the validating path rejects
                return None
            if values is None:
                values = _transform(src, plan.spec)
            else:  # checked while parsing
                return _decoded(src, values, fields, lines, skipped)
    if not all(v is True for v in line_ok) or values is None or values.height != src.height:
        return None
    *values_ok, maybe_huge = values.select(plan.value_checks).row(0)
    if not all(v is True for v in values_ok):
        return None
    if maybe_huge and src.get_column("line").str.contains(HUGE_INT).any():
        return None
    return _decoded(src, values, fields, lines, skipped)


def _decoded(src: pl.DataFrame, values: pl.DataFrame, fields: Sequence[Field], lines: int, skipped: int) -> Decoded:
    both = pl.concat([src, values], how="horizontal")
    return Decoded(
        ok=both.rename({f.key: f.col for f in fields if f.col != f.key}),
        rejects=_NO_REJECTS.clone(),
        lines=lines,
        skipped=skipped,
    )


# up to this many lines go to DuckDB as a parameter (no frame to register: ~1 ms less per
# small step file); more, as a registered frame (no copy into Python strings)
_PARAM_LINES = 64


def _transform(src: pl.DataFrame, spec: str, register: bool = False) -> pl.DataFrame | None:
    """``json_transform(line, spec)`` of each line of ``src``, unnested, in order; None when a
    line does not parse (the validating path says which). ``register``: hand ``src``'s lines over
    as a registered frame, whatever their number. Without pyarrow unless the batch is large
    (:mod:`analyses.readers.duck_polars`)."""
    con = thread_connection()
    large = src.height > _PARAM_LINES and (src.get_column("line").str.len_bytes().sum() or 0) >= ARROW_FROM_BYTES
    try:
        if not register and src.height <= _PARAM_LINES:
            # unnest of one list keeps its order
            sql = f"SELECT json_transform(line, '{spec}') AS _v FROM (SELECT unnest(?::VARCHAR[]) AS line)"
            df = to_polars(con.sql(sql, params=[src.get_column("line").to_list()]), large)
        else:
            con.register("src", duck_source(src.select("line"), large))
            df = to_polars(con.sql(f"SELECT json_transform(line, '{spec}') AS _v FROM src"), large)
            con.unregister("src")
    except duckdb.Error:
        drop_thread_connection()
        return None
    except BaseException:
        drop_thread_connection()
        raise
    return df.unnest("_v")


class _Refused(Exception):
    """A line :func:`_parse_small` leaves to DuckDB."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):  # DuckDB takes the first of a repeated key, Python the last
        raise _Refused
    return out


def _no_constant(name: str) -> object:
    raise _Refused  # NaN, Infinity: DuckDB's reading is left to DuckDB


_PL_TYPES = {"int": pl.Int64, "num": pl.Float64, "str": pl.String, "bool": pl.Boolean}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _pl_type(f: Field) -> pl.DataType:
    if f.kind == "int_list":
        return pl.List(pl.Int64)
    if f.kind == "obj_list":
        return pl.List(pl.Struct({s.key: _pl_type(s) for s in f.sub}))
    return _PL_TYPES[f.kind]()


class _Bad(Exception):
    """A value the fast path's value checks would fail: the validating path rejects its line."""


def _py_value(f: Field, v: object, max_items: int) -> object:
    """``v`` (from ``json.loads``) as ``json_transform`` types it for ``f``; raises _Refused
    for anything but the JSON types the textual checks let through, _Bad for what the value
    checks of :func:`_fast_plan` fail (missing required, negative, too many or null items)."""
    if v is None:
        if f.required:
            raise _Bad
        return None
    if f.kind == "int":
        if type(v) is not int or not _INT64[0] <= v <= _INT64[1]:
            raise _Refused
        if f.nonneg and v < 0:
            raise _Bad
        return v
    if f.kind == "num":
        if type(v) not in (int, float):
            raise _Refused
        if f.nonneg and v < 0:
            raise _Bad
        return float(v)  # as DuckDB casts a JSON integer to DOUBLE (round to nearest)
    if f.kind == "str":
        if type(v) is not str:
            raise _Refused
        return v
    if f.kind == "bool":
        if type(v) is not bool:
            raise _Refused
        return v
    if type(v) is not list:
        raise _Refused
    if len(v) > max_items:
        raise _Bad
    if f.kind == "int_list":
        return [_py_value(_NONNEG_ITEM if f.nonneg else _INT_ITEM, x, max_items) for x in v]
    out: list[dict[str, object] | None] = []
    for x in v:
        if x is None:  # its required sub-fields are missing (_fast_plan: an obj_list has some)
            raise _Bad
        if type(x) is not dict:
            raise _Refused
        out.append({s.key: _py_value(s, x.get(s.key), max_items) for s in f.sub})
    return out


_INT_ITEM = Field("item", "int")  # required: an int_list holds no nulls
_NONNEG_ITEM = Field("item", "int", nonneg=True)
_BAD = pl.DataFrame()  # _parse_small's answer for a batch with a bad line


def _parse_small(src: pl.DataFrame, fields: tuple[Field, ...], max_items: int) -> pl.DataFrame | None:
    """The values :func:`_transform` gives, from Python's ``json`` (no eval), for a batch the
    fast path's textual checks passed; None to leave the batch to DuckDB.

    Same values: the checks exclude the readings where the two parsers differ (a ``\\u``
    escape, as lone surrogates; NaN and Infinity; integers past BIGINT); repeated keys, where
    DuckDB keeps the first and Python the last, are refused here; both round decimal text to
    the nearest double (checked on 100,000 numbers of every shape). What only DuckDB accepts
    (trailing commas) fails Python's parse: DuckDB decides. The values are checked on the way
    as the fast path checks DuckDB's (:func:`_fast_plan`): ``_BAD`` when one fails. An optional
    integer that is null here is absent or null, never one past BIGINT (refused)."""
    cols: dict[str, list[object]] = {f.key: [] for f in fields}
    try:
        for text in src.get_column("line").to_list():
            obj = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
            if type(obj) is not dict:
                return None
            for f in fields:
                cols[f.key].append(_py_value(f, obj.get(f.key), max_items))
        return pl.DataFrame([pl.Series(f.key, cols[f.key], dtype=_pl_type(f), strict=True) for f in fields])
    except _Bad:
        return _BAD
    except (_Refused, ValueError, TypeError, OverflowError, RecursionError, pl.exceptions.PolarsError):
        return None


def _nonblank(lines: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """The lines that are not blank (``line_no`` Int64, a leading byte-order mark removed), and
    how many were blank (skipped: the documented rule)."""
    text = lines.get_column("line")
    if lines.schema["line_no"] == pl.Int64 and text.str.starts_with("{").all():  # the usual file: nothing to drop
        return lines, 0
    blank = text.str.strip_chars().str.len_bytes() == 0
    # a UTF-8 byte-order mark (Windows editors) would make the first record invalid JSON
    src = lines.filter(~blank).select(pl.col("line_no").cast(pl.Int64), pl.col("line").str.strip_prefix("\ufeff"))
    return src, int(blank.sum())


def decode_frame(lines: pl.DataFrame, fields: Sequence[Field], sql: str | None = None, fast: bool = True) -> Decoded:
    """Check and decode a frame of (line_no, line). Blank lines are skipped (documented rule).

    ``fast``: try :func:`fast_decode_frame` first (same result when it applies)."""
    src, skipped = _nonblank(lines)
    if fast:
        dec = fast_decode_frame(src, fields, lines=lines.height, skipped=skipped)
        if dec is not None:
            return dec
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
        skipped=skipped,
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


FILE_COLUMN = "_file"  # of rows decoded from several files at once: the index of their file


def decode_files(paths: Sequence[Path], fields: Sequence[Field],
                 datas: Sequence[bytes | None] | None = None) -> tuple[Decoded, list[int]] | None:
    """Several small files decoded as one batch (the lines of all of them, with ``_file``: see
    :func:`analyses.readers.lines.small_files_lines`), and each file's line count; None unless the
    fast path proves every line of every file good (no blank line, nothing to reject for its
    JSON): the caller decodes them one by one then, which gives each bad line its reason. The
    same rows as :func:`decode_jsonl` of each file: every line of a batch the fast path passes is
    decoded on its own. 315 step files of 11 KB: ~15 collects each before, a few in all now.
    ``datas``: each file's bytes when the caller read it whole already (else None)."""
    from analyses.readers.lines import small_files_lines

    if any(f.key == FILE_COLUMN for f in fields):
        return None
    got = small_files_lines(list(paths), given=datas)
    if got is None:
        return None
    lines, counts = got
    if not lines.get_column("line").str.starts_with("{").all():  # blank lines, a byte-order mark
        return None
    dec = fast_decode_frame(lines, fields, lines=lines.height, skipped=0)
    if dec is None:
        return None
    dec.rejects = dec.rejects.with_columns(pl.lit(None, dtype=pl.Int64).alias(FILE_COLUMN))
    return dec, counts


def files_chunk(dec: Decoded, counts: list[int], tables: dict[str, pl.DataFrame]) -> FilesChunk:
    """The :class:`FilesChunk` of rows :func:`decode_files` decoded (and a reader checked) from
    files of ``counts`` lines each."""
    n = len(counts)

    return FilesChunk(tables=tables, rejects=dec.rejects, lines=list(counts),
                      rows_ok=rows_per_file(dec.ok.get_column(FILE_COLUMN), n),
                      rows_rejected=rows_per_file(dec.rejects.get_column(FILE_COLUMN), n), rows_skipped=[0] * n)


def rows_per_file(files: pl.Series, n: int) -> list[int]:
    """How many of the rows whose file indexes are ``files`` each of ``n`` files has."""
    out = [0] * n
    if files.len():
        for i, k in files.value_counts().iter_rows():
            out[i] = k
    return out


class FileKeys:
    """The line on which each value of a key first appeared in a file, across the batches of
    :func:`decode_jsonl` (a step file longer than ``BATCH_LINES`` still gets its duplicates
    found and its groups numbered as a whole). Holds each distinct key once; nulls are a value."""

    def __init__(self, *keys: pl.Expr) -> None:
        self.keys = keys  # expressions over a decoded frame, each with a distinct output name
        self.first: pl.DataFrame | None = None  # key columns + _first, of the batches folded in
        self._pending: pl.DataFrame | None = None  # the last batch's keys + line_no, not folded yet

    def first_line(self, df: pl.DataFrame) -> pl.Series:
        """Per row of ``df`` (in order), the ``line_no`` its key first appeared on in this file
        (this batch included; ``!= line_no`` means a repeat); remembers the batch's keys."""
        k = df.select(*self.keys, pl.col("line_no"))
        names = k.columns[:-1]
        self._fold(names)
        self._pending = k
        if self.first is None:  # the first batch (of most files, the only one): a window will do
            return k.select(_first=pl.col("line_no").min().over(names)).get_column("_first")
        seen = k.group_by(names, maintain_order=True).agg(_first=pl.col("line_no").min())
        seen = pl.concat([self.first, seen]).group_by(names, maintain_order=True).agg(pl.col("_first").min())
        return k.join(seen, on=names, how="left", nulls_equal=True, maintain_order="left")["_first"]

    def _fold(self, names: list[str]) -> None:
        """Add the keys of the batch before into ``first`` (only when another batch comes)."""
        if self._pending is None:
            return
        seen = self._pending.group_by(names, maintain_order=True).agg(_first=pl.col("line_no").min())
        if self.first is not None:
            seen = pl.concat([self.first, seen]).group_by(names, maintain_order=True).agg(pl.col("_first").min())
        self.first, self._pending = seen, None


def step_from_name(path: Path, pattern: str) -> int | None:
    """The step number a file name states (``pattern`` has one group), or None."""
    m = re.search(pattern, path.name)
    return int(m.group(1)) if m and int(m.group(1)) < 2**63 else None  # past Int64: no step


def first_json_objects(head: str, n: int = 5) -> list[dict]:
    """Up to ``n`` JSON objects from the first complete lines of ``head`` (for sniffing only);
    a line that is no JSON, or nests deeper than the reader accepts, is passed over.

    Several readers sniff the same head in turn: the last head's objects are kept (read only),
    and serve any ``n`` they cover (as many, or all the head holds)."""
    depth_limit = limits.current().max_json_depth
    key = (head, depth_limit)
    last = _last_objects[0]  # one read: another thread may replace it
    if last is not None and last[0] == key and (len(last[1]) >= n or last[2]):
        return last[1] if len(last[1]) <= n else last[1][:n]
    out = _first_json_objects(head, n, depth_limit)
    _last_objects[0] = (key, out, len(out) < n)
    return out


# (head, depth limit), its first objects, and whether those are all it holds
_last_objects: list[tuple[tuple[str, int], list[dict], bool] | None] = [None]


def _first_json_objects(head: str, n: int, depth_limit: int) -> list[dict]:
    out: list[dict] = []
    for line in _head_lines(head.lstrip("\ufeff")):  # a line cut by the head limit fails to parse
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


def _head_lines(text: str, window: int = 8192) -> Iterator[str]:
    """``text.splitlines()``, split a window at a time: sniffing wants the first few lines of a
    64 KB head, and splitting all of it was a third of sniffing a small step file. A line cut by
    a window's end is split again from its start with the next; a ``\r\n`` cut between two
    windows gives one more blank line (which sniffing passes over)."""
    start = 0
    while start < len(text):
        if start + window >= len(text):
            yield from text[start:].splitlines()
            return
        parts = text[start:start + window].splitlines(keepends=True)
        if len(parts) < 2:  # one line longer than the window: a larger one
            window *= 2
            continue
        for part in parts[:-1]:
            yield part.splitlines()[0]
            start += len(part)
