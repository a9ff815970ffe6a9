"""Frames between DuckDB and Polars without pyarrow, for small batches.

DuckDB's ``.pl()`` and ``.to_arrow_table()`` and its scan of a registered Polars frame all go
through pyarrow, whose import (with numpy's) costs ~0.2-0.3 s: as much as a whole ingest of a
few hundred small step files. Both directions have a way round it:

* into DuckDB: :class:`ArrowStream` hands a frame over through the Arrow PyCapsule interface
  (``__arrow_c_stream__``), which DuckDB scans without pyarrow; DuckDB asks a registered stream
  for it four times a query, and each export turns Polars' string views into Arrow strings (a
  copy of every string), so a large frame goes as an Arrow table of string views instead
  (:func:`duck_source`: exported once, without a copy);
* out of DuckDB: a small result is written by DuckDB as an uncompressed Parquet file and read
  back by Polars (a few ms for thousands of rows; the types are the ones Arrow gives: BIGINT,
  DOUBLE, VARCHAR, BOOLEAN, lists and structs). Polars reading DuckDB's own capsule would be
  direct, but it leaves DuckDB's stream unreleased: nanobind prints a page of "leaked instance"
  warnings when the process exits. A large result (:data:`ARROW_FROM_BYTES` of input text and
  more) still goes through Arrow, where the copy would cost more than the import.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import duckdb
import polars as pl

ARROW_FROM_BYTES = 16 << 20  # input text from which a result is handed over through pyarrow


class ArrowStream:
    """A Polars frame DuckDB can register and scan (possibly several times) without pyarrow."""

    def __init__(self, df: pl.DataFrame) -> None:
        self.df = df

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self.df.__arrow_c_stream__(requested_schema)


def duck_source(df: pl.DataFrame, large: bool) -> object:
    """``df`` as DuckDB registers it: ``large``, an Arrow table of string views (no copy, and
    scanned as often as DuckDB likes); else an :class:`ArrowStream` (no pyarrow)."""
    if large:
        return df.to_arrow(compat_level=pl.CompatLevel.newest())
    return ArrowStream(df)


def to_polars(rel: duckdb.DuckDBPyRelation, large: bool) -> pl.DataFrame:
    """The result of ``rel`` as a Polars frame, in its order; ``large``: through Arrow."""
    if large:
        df = pl.from_arrow(rel.to_arrow_table())
        assert isinstance(df, pl.DataFrame)
        return df
    path = os.path.join(tempfile.gettempdir(), f"polytrace-{os.getpid()}-{uuid.uuid4().hex}.parquet")
    try:
        rel.write_parquet(path, compression="uncompressed")
        return pl.read_parquet(path)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
