"""Read-only SQL over the warehouse in DuckDB's own sandbox.

What a query connection can touch is decided by DuckDB, not by inspecting SQL text:

- ``enable_external_access = false`` with ``allowed_paths`` = exactly the warehouse's data
  files: no other file, directory listing, extension, secret or database can be opened;
- ``lock_configuration = true``: a query cannot switch that off again (nor raise the memory
  limits set before it, :mod:`analyses.duckdb_limits`);
- DuckDB's own parser (``extract_statements``) classifies each statement, and only queries run
  (``SELECT``/``WITH``/``FROM``/``VALUES``/``DESCRIBE``/``SUMMARIZE``/``SHOW``/``PIVOT ... IN``),
  and ``EXPLAIN`` / ``EXPLAIN ANALYZE`` of a query. An allowed path is writable too, so
  ``COPY ... TO`` one of the warehouse's own files would pass the path check; and ``EXPLAIN
  ANALYZE`` executes the statement it explains, so the statement classified is the one that
  would run: the EXPLAIN's own (after ``ANALYZE``/``ANALYSE`` or an option list, comments
  anywhere), found with DuckDB's tokenizer and parsed again by DuckDB. What cannot be told
  for certain is refused.

Every statement is checked before the first one runs, so a refused input changes nothing.
``polytrace query`` also confines its own process with Landlock (:mod:`analyses.landlock`):
even a statement that got past this check could not write a file outside its scratch directory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:  # Polars once a result becomes a frame: `polytrace query` prints from DuckDB's rows
    import polars as pl

_ST = duckdb.StatementType
_TT = duckdb.token_type
_WORD = re.compile(r"[A-Za-z_]+")


class QueryRefused(ValueError):
    """SQL that the sandbox does not run, with a one-line reason."""


def lock_down(con: duckdb.DuckDBPyConnection, readable: Iterable[str]) -> None:
    """Let ``con`` read only ``readable`` files from now on, for good."""
    paths = sorted(set(readable))
    con.execute("SET allowed_paths = $1", [paths])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def one_line(exc: Exception) -> str:
    """DuckDB's message on one line, its hints ("Did you mean ...") kept, the SQL excerpt and the
    advice that follows a blank line ("Possible solutions: ...") left out."""
    lines = []
    for ln in str(exc).splitlines():
        if ln.startswith("LINE ") or (lines and not ln.strip()):
            break
        if ln.strip():
            lines.append(ln.strip())
    return " ".join(lines) or type(exc).__name__


def _kind(t: duckdb.StatementType) -> str:
    return str(t).rsplit(".", 1)[-1]


def _explained(sql: str) -> list[str] | None:
    """The texts that may be the statement an ``EXPLAIN`` runs: what follows ``EXPLAIN
    [ANALYZE|ANALYSE]`` or ``EXPLAIN (options)``, and what follows ``EXPLAIN`` alone (``EXPLAIN
    (SELECT 1)`` explains a parenthesized query). None when ``sql`` does not start with EXPLAIN."""
    every = duckdb.tokenize(sql)
    # (start, end, kind) of each token but the comments; a token ends where the next one starts
    toks = [(off, every[k + 1][0] if k + 1 < len(every) else len(sql), kind)
            for k, (off, kind) in enumerate(every) if kind != _TT.comment]
    if not toks or toks[0][2] != _TT.keyword or sql[toks[0][0]:toks[0][1]].strip().upper() != "EXPLAIN":
        return None
    if len(toks) < 2:
        return []
    out = [sql[toks[1][0]:]]
    i = 1
    word = _WORD.match(sql, toks[1][0])
    if toks[1][2] == _TT.keyword and word and word.group().upper() in ("ANALYZE", "ANALYSE"):
        i = 2
    elif sql[toks[1][0]] == "(":
        depth = 0
        i = len(toks)
        for j in range(1, len(toks)):
            if toks[j][2] == _TT.operator:
                text = sql[toks[j][0]:toks[j][1]]
                depth += text.count("(") - text.count(")")
            if depth <= 0:
                i = j + 1
                break
    if i > 1:
        out.append(sql[toks[i][0]:] if i < len(toks) else "")
    return out


def _refusal(con: duckdb.DuckDBPyConnection, stmt: duckdb.Statement) -> str | None:
    """Why ``stmt`` may not run (the kind of statement it would run), None for a query."""
    try:
        kind = stmt.type
    except ValueError:  # a type the Python enum lacks (UPDATE EXTENSIONS is number 29)
        return "UPDATE EXTENSIONS and other unnamed statements"
    if kind == _ST.SELECT:
        return None
    if kind == _ST.MULTI:
        return "PIVOT statements without an IN list (ON col IN (...))"
    if kind != _ST.EXPLAIN:
        return f"{_kind(kind)} statements"
    candidates = _explained(stmt.query)
    inner = []
    for text in candidates or ():
        try:
            parsed = con.extract_statements(text)
        except duckdb.Error:
            continue
        if len(parsed) > 1:
            return "EXPLAIN statements of several statements"
        if not parsed:  # nothing follows the options: they were the statement, in parentheses
            continue
        inner.append(parsed[0])
    if not inner:
        return "EXPLAIN statements whose statement cannot be told"
    for s in inner:
        why = _refusal(con, s)
        if why is not None:
            return f"EXPLAIN {why}"
    return None


def query_statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    """The statements of ``sql``, each a query; :class:`QueryRefused` otherwise."""
    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(one_line(exc)) from exc
    if not stmts:
        raise QueryRefused("no SQL statement given")
    for i, s in enumerate(stmts):
        why = _refusal(con, s)
        if why is not None:
            where = f"statement {i + 1}: " if len(stmts) > 1 else ""
            raise QueryRefused(f"read-only: {where}{why} are not allowed (only queries)")
    return stmts


def statement_text(stmt: duckdb.Statement) -> str:
    return stmt.query.strip().rstrip(";").strip()


# DuckDB types that Polars cannot take from Arrow (INTERVAL and UNION fail, nested in a list or
# struct with a panic) or holds as opaque bytes: DuckDB's own text for them
_AS_TEXT = re.compile(r"\b(INTERVAL|UNION|BIGNUM|VARINT|GEOMETRY|VARIANT|BIT)\b")
# Polars holds DuckDB's dates and timestamps but panics printing those past chrono's range
# (year 262143, 'infinity'): a printed table shows DuckDB's text for them
_TEMPORAL = re.compile(r"\b(DATE|TIMESTAMP\w*|TIME WITH TIME ZONE)\b")
_NESTED = ("list", "array", "struct", "map")
BATCH_ROWS = 65_536
MODES = ("frame", "table", "csv", "json")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _showable(rel: duckdb.DuckDBPyRelation, mode: str) -> duckdb.DuckDBPyRelation:
    """``rel`` as Polars can hold it for ``mode`` (:data:`MODES`), the values rendered by
    DuckDB wherever Polars cannot take or print them:

    - ``frame`` (a DataFrame to keep): unique column names (``a``, ``a_1``) and the types of
      ``_AS_TEXT`` as text; ``table``: also dates and timestamps as text;
    - ``csv``: every column as text, lists, structs and maps as their JSON;
    - ``json``: one column, each row as the JSON object DuckDB writes for it.
    """
    names: list[str] = []
    for c in rel.columns:
        name, k = c, 0
        while name in names:
            k += 1
            name = f"{c}_{k}"
        names.append(name)
    types = rel.types
    if mode == "json":
        fields = ", ".join("'" + n.replace("'", "''") + f"': #{i + 1}" for i, n in enumerate(names))
        return rel.project(f"CAST(to_json({{{fields}}}) AS VARCHAR) AS json")
    exprs: list[str] = []
    for i, (name, t) in enumerate(zip(names, types, strict=True)):
        text = str(t)
        if mode == "csv" and t.id in _NESTED:
            expr = f"CAST(to_json(#{i + 1}) AS VARCHAR)"
        elif ((mode == "csv" and text != "VARCHAR") or _AS_TEXT.search(text)
              or (mode == "table" and _TEMPORAL.search(text))):
            expr = f"CAST(#{i + 1} AS VARCHAR)"
        else:
            expr = f"#{i + 1}"
        exprs.append(f"{expr} AS {_quote(name)}")
    if names == rel.columns and all(e.startswith("#") for e in exprs):
        return rel
    return rel.project(", ".join(exprs))


def _frame(data: object) -> pl.DataFrame:
    import polars as pl

    try:
        return pl.from_arrow(data)  # type: ignore[return-value]
    except Exception as exc:  # noqa: BLE001 - any type Polars refuses is a result we cannot show
        raise QueryRefused(f"the result cannot be shown (cast the column to VARCHAR): {one_line(exc)}") from exc
    except BaseException as exc:  # a Rust panic in the conversion (pyo3's PanicException)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise QueryRefused(f"the result cannot be shown (cast the column to VARCHAR): {one_line(exc)}") from exc


def shown_relation(con: duckdb.DuckDBPyConnection, stmt: duckdb.Statement,
                   mode: str = "frame") -> duckdb.DuckDBPyRelation | None:
    """The result of ``stmt`` (already checked) with its columns as ``mode`` needs them
    (:func:`_showable`); None for a statement without a result."""
    rel = con.sql(stmt.query)
    return None if rel is None else _showable(rel, mode)


def result_frames(con: duckdb.DuckDBPyConnection, stmt: duckdb.Statement, rows: int = BATCH_ROWS,
                  mode: str = "frame") -> Iterator[pl.DataFrame]:
    """The result of ``stmt`` (already checked) as Polars frames (:func:`relation_frames`)."""
    return relation_frames(shown_relation(con, stmt, mode), rows)


def relation_frames(rel: duckdb.DuckDBPyRelation | None, rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """``rel`` as Polars frames of at most ``rows`` rows, streamed from DuckDB: first an empty
    frame with the result's columns, then one frame per batch.
    DuckDB's errors propagate (``duckdb.Error``); a result Polars cannot hold is
    :class:`QueryRefused`."""
    import polars as pl

    if rel is None:
        yield pl.DataFrame()
        return
    reader = rel.to_arrow_reader(rows)
    yield _frame(reader.schema.empty_table())
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except OSError as exc:  # DuckDB's error, past the first batch, as Arrow's stream carries it
            raise _duckdb_error(exc) from exc
        yield _frame(batch)


def relation_rows(con: duckdb.DuckDBPyConnection, rel: duckdb.DuckDBPyRelation,
                  rows: int = BATCH_ROWS) -> Iterator[list[tuple]]:
    """``rel``'s rows as DuckDB's Python values, streamed a batch of at most ``rows`` at a time
    on ``con`` (no Arrow, no Polars: ``polytrace query`` prints them). ``con`` is busy until the
    last batch; stopped early, the rest of the result is dropped."""
    con.execute(rel.sql_query())
    try:
        while batch := con.fetchmany(rows):
            yield batch
    finally:
        con.abort()


def _duckdb_error(exc: Exception) -> duckdb.Error:
    """The DuckDB exception whose message an Arrow stream passed on ("INTERRUPT Error: ...")."""
    msg = str(exc)
    for prefix, cls in (("INTERRUPT Error", duckdb.InterruptException), ("Out of Memory Error", duckdb.OutOfMemoryException)):
        if msg.startswith(prefix):
            return cls(msg)
    return duckdb.Error(msg)


def run_queries(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[str, pl.DataFrame]]:
    """Every statement of ``sql`` with its result, in order (all checked before any runs)."""
    import polars as pl

    out = []
    for s in query_statements(con, sql):
        try:
            df = pl.concat(list(result_frames(con, s)), how="vertical", rechunk=False)
        except duckdb.Error as exc:
            raise QueryRefused(one_line(exc)) from exc
        out.append((statement_text(s), df))
    return out
