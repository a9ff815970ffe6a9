"""How ``polytrace query`` prints a result from DuckDB's rows, without Polars or pyarrow.

Loading Polars and pyarrow took most of a query command's start-up (issue 29, target 1), for
text DuckDB can write itself. The output is byte for byte what printing the result through
Polars gave (:mod:`analyses.cli.query_run` still does where this module cannot match it):

- CSV: each line written by DuckDB (every value its text, quoted as Polars' ``write_csv``
  quotes: a null empty, an empty string ``""``, a value with a comma, a quote or a line break
  in quotes), the header once, also for no rows;
- JSON: an array of the objects DuckDB's ``to_json`` writes, one per row;
- table: Polars' table (``tbl_rows=200``, the first and last 100 rows around a ``…`` row) drawn
  here for integer, boolean and text columns (dates and times come as text in a table); a
  result with another column type, or values whose width this drawing cannot be sure of (long
  or wide text, line breaks, a table wider than 200 characters), is printed by Polars.
"""

from __future__ import annotations

import collections
import unicodedata
from collections.abc import Callable, Iterator
from typing import TextIO

import duckdb

from analyses.sandbox import relation_rows

TABLE_ROWS = 200  # a table shows this many rows: the first and the last half
# the table options Polars prints the query's tables with (analyses.cli.query_run)
TABLE_CONFIG = {"tbl_rows": TABLE_ROWS, "tbl_cols": 40, "fmt_str_lengths": 80, "tbl_width_chars": 200,
                "tbl_hide_dataframe_shape": True}
# the column types drawn here: DuckDB's type -> (the dtype Polars shows under the column name, its Polars class)
DRAWN_TYPES = {"TINYINT": ("i8", "Int8"), "SMALLINT": ("i16", "Int16"), "INTEGER": ("i32", "Int32"),
               "BIGINT": ("i64", "Int64"), "UTINYINT": ("u8", "UInt8"), "USMALLINT": ("u16", "UInt16"),
               "UINTEGER": ("u32", "UInt32"), "UBIGINT": ("u64", "UInt64"), "BOOLEAN": ("bool", "Boolean"),
               "VARCHAR": ("str", "String")}

Rows = Iterator[list[tuple]]


def _quoted_csv(sql: str) -> str:
    return (f"CASE WHEN {sql} IS NULL THEN '' WHEN {sql} = '' OR regexp_matches({sql}, '[,\"\\n\\r]') "
            f"THEN '\"' || replace({sql}, '\"', '\"\"') || '\"' ELSE {sql} END")


def csv_field(value: str | None) -> str:
    """One CSV field as Polars writes it (and :func:`_quoted_csv` in DuckDB)."""
    if value is None:
        return ""
    if value == "" or any(c in value for c in ',"\n\r'):
        return '"' + value.replace('"', '""') + '"'
    return value


def write_csv(con: duckdb.DuckDBPyConnection, rel: duckdb.DuckDBPyRelation, out: TextIO,
              check: Callable[[], None]) -> None:
    """``rel`` (every column text, :func:`analyses.sandbox.shown_relation` in ``csv`` mode) as CSV."""
    out.write(",".join(csv_field(c) for c in rel.columns) + "\n")
    if not rel.columns:
        return
    cells = " || ',' || ".join(_quoted_csv(f"#{i + 1}") for i in range(len(rel.columns)))
    for batch in relation_rows(con, rel.project(f"{cells} AS line")):
        check()
        out.write("".join(line + "\n" for (line,) in batch))


def write_json(con: duckdb.DuckDBPyConnection, rel: duckdb.DuckDBPyRelation, out: TextIO,
               check: Callable[[], None]) -> None:
    """``rel`` (one column of JSON objects, ``json`` mode) as one JSON array."""
    sep = "["
    for batch in relation_rows(con, rel):
        check()
        out.write(sep + ", ".join(obj for (obj,) in batch))
        sep = ", "
    out.write("[]\n" if sep == "[" else "]\n")


def head_and_tail(batches: Rows, check: Callable[[], None], half: int = TABLE_ROWS // 2) -> tuple[list, list, int]:
    """The first ``half`` rows, the last ``half`` rows after them, and the number of rows."""
    head: list[tuple] = []
    tail: collections.deque[tuple] = collections.deque(maxlen=half)
    total = 0
    for batch in batches:
        check()
        total += len(batch)
        rest = batch
        if len(head) < half:
            take = half - len(head)
            head.extend(batch[:take])
            rest = batch[take:]
        tail.extend(rest[-half:])
    return head, list(tail), total


def drawn(types: list[str]) -> bool:
    """Whether a result with these DuckDB column types is drawn from its rows."""
    return bool(types) and all(t in DRAWN_TYPES for t in types)


def _cell(value: object) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    return str(value)


def _plain(text: str) -> bool:
    """Text whose width is its length and that Polars shows whole: printable, one line, no
    wide or combining characters, at most ``fmt_str_lengths`` characters."""
    if len(text) > TABLE_CONFIG["fmt_str_lengths"]:
        return False
    if text.isascii():
        return text.isprintable()
    return all(c.isprintable() and unicodedata.category(c)[0] != "M" and unicodedata.east_asian_width(c) in ("N", "Na", "H")
               for c in text)


def table_text(names: list[str], types: list[str], head: list[tuple], tail: list[tuple],
               total: int) -> str | None:
    """The table Polars prints for these rows (``head`` then ``tail``, ``total`` rows in all), or
    None where this drawing cannot be sure to match it."""
    if not names or not drawn(types) or len(names) > TABLE_CONFIG["tbl_cols"]:
        return None
    dtypes = [DRAWN_TYPES[t][0] for t in types]
    rows = [[_cell(v) for v in r] for r in head]
    if total > TABLE_ROWS:
        rows.append(["…"] * len(names))
    rows += [[_cell(v) for v in r] for r in tail]
    if not all(_plain(c) for c in names) or not all(_plain(c) for r in rows for c in r if c != "…"):
        return None
    widths = [max(len(n), 3, len(d), *(len(r[i]) for r in rows)) for i, (n, d) in enumerate(zip(names, dtypes,
                                                                                               strict=True))]
    if sum(widths) + 3 * len(widths) + 1 > TABLE_CONFIG["tbl_width_chars"]:
        return None

    def line(cells: list[str]) -> str:
        return "│ " + " ┆ ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " │"

    def rule(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    out = [rule("┌", "─", "┬", "┐"), line(names), line(["---"] * len(names)), line(dtypes), rule("╞", "═", "╪", "╡")]
    out += [line(r) for r in rows]
    out.append(rule("└", "─", "┴", "┘"))
    return "\n".join(out) + "\n"
