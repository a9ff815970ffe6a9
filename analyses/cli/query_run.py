"""How ``polytrace query`` (:mod:`analyses.cli.query`) runs its statements: a scratch directory
of its own, Landlock on its own process, the sandboxed catalog connection, a deadline, and the
printers that stream each result (CSV, JSON, or a table of its first and last rows)."""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import duckdb

from analyses import catalog, landlock
from analyses.cli import row_text
from analyses.cli.common import EXIT_OK, UsageError
from analyses.duckdb_limits import ENV_MEMORY, ENV_TEMP, ResourceLimits, human_bytes, new_scratch_path
from analyses.landlock import ENV_LANDLOCK
from analyses.sandbox import (
    QueryRefused,
    one_line,
    query_statements,
    relation_frames,
    relation_rows,
    shown_relation,
    statement_text,
)
from analyses.views import all_views
from analyses.warehouse import reader_lease

if TYPE_CHECKING:  # Polars prints what DuckDB's rows cannot (analyses.cli.row_text): only then is it loaded
    import polars as pl

TABLE_ROWS = row_text.TABLE_ROWS


def _csv(frames: Iterator[pl.DataFrame], out: TextIO) -> None:
    """CSV, the header once (also for no rows); every value is DuckDB's text for it."""
    header = True
    for df in frames:
        if header or df.height:
            out.write(df.write_csv(include_header=header))
            header = False


def _table(frames: Iterator[pl.DataFrame], out: TextIO) -> None:
    """The first and last ``TABLE_ROWS // 2`` rows, as Polars prints a frame of any height (the
    rows between are never kept)."""
    import polars as pl

    half = TABLE_ROWS // 2
    head: list[pl.DataFrame] = []
    tail: collections.deque[pl.DataFrame] = collections.deque()
    head_rows = tail_rows = total = 0
    for df in frames:  # the first frame is the (empty) schema: head is never empty
        total += df.height
        if head_rows < half:
            head.append(df.head(half - head_rows))
            head_rows += head[-1].height
            df = df.slice(head[-1].height)
        if df.height:
            tail.append(df)
            tail_rows += df.height
            while tail_rows - tail[0].height >= half:
                tail_rows -= tail.popleft().height
    _print_table(pl.concat(head), pl.concat(list(tail)) if tail else pl.concat(head).clear(), total, out)


def _print_table(first: pl.DataFrame, last: pl.DataFrame, total: int, out: TextIO) -> None:
    """The table Polars prints for a frame of ``total`` rows whose first ``TABLE_ROWS // 2`` rows
    are ``first`` and whose rows after those are ``last`` (at least the last ``TABLE_ROWS // 2``)."""
    import polars as pl

    if total > TABLE_ROWS:
        # one row between head and tail makes the frame longer than TABLE_ROWS: Polars then
        # prints its first and last halves around its usual ellipsis row
        shown = pl.concat([first, first.head(1), last.tail(TABLE_ROWS // 2)])
    else:
        shown = pl.concat([first, last])
    with pl.Config(**row_text.TABLE_CONFIG):
        print(shown, file=out)


def _table_from_rows(con: duckdb.DuckDBPyConnection, rel: duckdb.DuckDBPyRelation, out: TextIO,
                     check: Callable[[], None]) -> None:
    """A table of integer, boolean and text columns from DuckDB's rows: drawn by
    :func:`analyses.cli.row_text.table_text`, or by Polars where that cannot match it."""
    names, types = rel.columns, [str(t) for t in rel.types]
    head, tail, total = row_text.head_and_tail(relation_rows(con, rel), check)
    text = row_text.table_text(names, types, head, tail, total)
    if text is not None:
        out.write(text)
        return
    import polars as pl

    schema = {n: getattr(pl, row_text.DRAWN_TYPES[t][1]) for n, t in zip(names, types, strict=True)}
    _print_table(pl.DataFrame(head, schema=schema, orient="row"), pl.DataFrame(tail, schema=schema, orient="row"),
                 total, out)


def _print_result(con: duckdb.DuckDBPyConnection, rel: duckdb.DuckDBPyRelation | None, fmt: str, out: TextIO,
                  check: Callable[[], None]) -> None:
    """One statement's result as ``fmt``: from DuckDB's rows (:mod:`analyses.cli.row_text`), a
    table whose column types those cannot draw through Polars."""
    if rel is None:  # no result (no statement the sandbox lets through): as an empty frame printed
        if fmt == "json":
            out.write("[]\n")
        else:
            (_csv if fmt == "csv" else _table)(relation_frames(None), out)
    elif fmt == "csv":
        row_text.write_csv(con, rel, out, check)
    elif fmt == "json":
        row_text.write_json(con, rel, out, check)
    elif row_text.drawn([str(t) for t in rel.types]):
        _table_from_rows(con, rel, out, check)
    else:
        _table(_checked(relation_frames(rel), check), out)


def _as_json(col: str) -> pl.Expr:
    """A nested column as its JSON text, columnar (wrapped in a struct, encoded, the value taken back out)."""
    import polars as pl

    return pl.struct(pl.col(col).alias("v")).struct.json_encode().str.json_path_match("$.v").alias(col)


def print_frame(df: pl.DataFrame, fmt: str, out: TextIO | None = None) -> None:
    """A frame computed outside DuckDB's text (e.g. ``trace-diff``) as the query command prints its
    results: a table, CSV (lists and structs as their JSON text) or a JSON array of objects."""
    import polars as pl

    out = out or sys.stdout
    if fmt == "csv":
        nested = [c for c, t in df.schema.items() if isinstance(t, pl.List | pl.Array | pl.Struct)]
        _csv(iter([df.with_columns(_as_json(c) for c in nested) if nested else df]), out)
    elif fmt == "json":
        out.write(json.dumps(df.to_dicts(), default=str) + "\n")
    else:
        _table(iter([df]), out)


class _Deadline:
    """Interrupts ``con`` once ``seconds`` have passed (none when 0)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, seconds: float) -> None:
        self.con, self.seconds, self.expired = con, seconds, False
        self._timer = threading.Timer(seconds, self._fire) if seconds > 0 else None

    def _fire(self) -> None:
        self.expired = True
        self.con.interrupt()

    def __enter__(self) -> _Deadline:
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def check(self) -> None:
        if self.expired:
            raise UsageError(self.message())

    def message(self) -> str:
        return f"the query ran longer than {self.seconds:g} s and was stopped (--timeout SECONDS, 0 for no limit)"


def _failure(exc: Exception, deadline: _Deadline, limits: ResourceLimits, spill: Path) -> str:
    """One line for a statement DuckDB could not finish."""
    if deadline.expired or isinstance(exc, duckdb.InterruptException):
        return deadline.message()
    msg = one_line(exc)
    if isinstance(exc, duckdb.OutOfMemoryException):
        if "max_temp_directory_size" in str(exc):
            return (f"the query needs more than its {human_bytes(limits.temp_for(spill))} of spill space "
                    f"(--temp-limit SIZE or ${ENV_TEMP}): {msg}")
        return (f"the query needs more memory than its {human_bytes(limits.memory_bytes)} limit "
                f"(--memory-limit SIZE or ${ENV_MEMORY}): {msg}")
    return msg


def execute(con: duckdb.DuckDBPyConnection, sql: str, fmt: str, timeout_s: float, limits: ResourceLimits,
            spill: Path, out: TextIO) -> int:
    """Check every statement of ``sql``, then run each and print its result to ``out``; any
    refusal or failure is a :class:`UsageError` with one line."""
    try:
        stmts = query_statements(con, sql)
    except QueryRefused as exc:
        raise UsageError(str(exc)) from exc
    with _Deadline(con, timeout_s) as deadline:
        for i, s in enumerate(stmts):
            deadline.check()
            if len(stmts) > 1 and fmt == "table":
                print(f"-- [{i + 1}/{len(stmts)}] {statement_text(s)}", file=out)
            try:
                _print_result(con, shown_relation(con, s, mode=fmt), fmt, out, deadline.check)
            except QueryRefused as exc:
                raise UsageError(str(exc)) from exc
            except duckdb.Error as exc:
                raise UsageError(_failure(exc, deadline, limits, spill)) from exc
            except MemoryError as exc:  # outside DuckDB's limit: converting or printing a batch
                raise UsageError(f"out of memory while printing the result: {exc}") from exc
    return EXIT_OK


def _checked(frames: Iterator[pl.DataFrame], check: Callable[[], None]) -> Iterator[pl.DataFrame]:
    for df in frames:
        check()  # an interrupt that arrived between two batches
        yield df


@contextmanager
def query_scratch(root: Path) -> Iterator[Path]:
    """A directory of its own in the warehouse's scratch area for the query to spill to, removed
    afterwards (DuckDB removes its files when the connection closes)."""
    try:
        path = new_scratch_path(root)
        path.mkdir(mode=0o700)
    except OSError as exc:
        raise UsageError(f"cannot create a scratch directory for the query: {exc}") from exc
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def confine(scratch: Path) -> int:
    """Landlock this process (see :mod:`analyses.landlock`) as ``$POLYTRACE_LANDLOCK`` says:
    ``auto`` where the kernel can, ``require`` or refuse to run, ``off``. The ABI enforced (0: none)."""
    mode = (os.environ.get(ENV_LANDLOCK) or "auto").lower()
    if mode not in ("auto", "require", "off"):
        raise UsageError(f"${ENV_LANDLOCK} must be auto, require or off, not {mode!r}")
    if mode == "off":
        return 0
    try:
        abi = landlock.confine(scratch)
    except landlock.LandlockError as exc:
        if mode == "require":
            raise UsageError(f"cannot confine the query process with Landlock: {exc}") from exc
        return 0
    if abi == 0 and mode == "require":
        raise UsageError(f"this kernel has no Landlock, and ${ENV_LANDLOCK}=require")
    return abi


@contextmanager
def sandbox_connection(root: Path, limits: ResourceLimits,
                       landlocked: bool) -> Iterator[tuple[duckdb.DuckDBPyConnection, Path, int]]:
    """The query connection, its spill directory and the Landlock ABI enforced (0: none), as the
    command opens them: a scratch directory of its own, a reader lease, Landlock on this process
    when ``landlocked`` (as ``$POLYTRACE_LANDLOCK`` says), then the sandboxed catalog connection
    within ``limits``, from a snapshot of the catalog file in the scratch directory when it is
    current (:func:`analyses.catalog.connect`)."""
    # the reader lease's lock file is opened for writing when it can be: take it before Landlock
    # (the connection's own lease then opens the same file read-only)
    with query_scratch(root) as spill, reader_lease(root):
        abi = confine(spill) if landlocked else 0  # before DuckDB starts a thread: they all inherit it
        try:
            con = catalog.connect(root, all_views(), sandbox=True, limits=limits, spill=spill, snapshot=spill)
        except duckdb.OutOfMemoryException as exc:
            raise UsageError(f"the warehouse's views do not fit the {human_bytes(limits.memory_bytes)} memory limit "
                             f"(--memory-limit SIZE or ${ENV_MEMORY}): {one_line(exc)}") from exc
        except duckdb.Error as exc:  # e.g. a published file gone while the views bind
            raise UsageError(f"cannot open the warehouse's views: {one_line(exc)}") from exc
        try:
            yield con, spill, abi
        finally:
            con.close()
