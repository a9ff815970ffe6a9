"""A staging part file written row group by row group, with categorical columns handed to the
Parquet encoder as dictionaries, so that it never hashes their strings again.

Parquet dictionary-encodes every string column; from plain strings the encoder hashes each row to
find its dictionary entry (on a 290k-row chunk of ``step_metrics`` its three name columns, whose
values repeat row after row, cost a third of the encoding). A Polars ``Categorical`` column already
holds one code per row: it is given to the encoder as an Arrow dictionary array whose values are
the chunk's distinct strings *in the order they first occur*, which is exactly the dictionary the
encoder builds from plain strings, so the file is the same byte for byte:

* the same dictionary page and data pages (the dictionary lists only values that occur, in
  first-occurrence order, one array per row group);
* the same key-value metadata: ``ARROW:schema`` is the schema of the plain-string columns
  (written here instead of by pyarrow, which would record the dictionary type), after the
  table's own keys, as pyarrow orders them.

A dictionary of :data:`DICTIONARY_MAX_BYTES` or more is not passed (the encoder falls back to plain
encoding at its page limit at a different row than from plain strings): such a column, or a row
group whose columns do not match the file's, is written from plain strings; when the file was
opened with dictionary columns, what it holds is first rewritten with plain ones (read back row
group by row group: the same bytes as if it had been written so from the start).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING

from analyses.categorical_codes import first_occurrences

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

# well below Arrow's dictionary page limit (1 MiB of plain-encoded values), so that neither way of
# writing falls back to plain encoding
DICTIONARY_MAX_BYTES = 256 << 10
ROW_GROUP_MAX_ROWS = 1 << 20  # pyarrow's default row group size


def categorical_columns(df: pl.DataFrame) -> list[str]:
    """The columns of ``df`` this writer passes as dictionaries (cast them to strings for any
    other writer)."""
    import polars as pl

    return [name for name, dtype in df.schema.items() if isinstance(dtype, pl.Categorical)]


def arrow_table(df: pl.DataFrame) -> pa.Table:
    """``df`` as Arrow (``CompatLevel.oldest``: large strings); a small categorical column as a
    first-occurrence dictionary array, a large one as strings."""
    import polars as pl
    import pyarrow as pa

    cats = categorical_columns(df)
    table = df.drop(cats).to_arrow(compat_level=pl.CompatLevel.oldest()) if cats else \
        df.to_arrow(compat_level=pl.CompatLevel.oldest())
    if not cats:
        return table
    arrays = {name: table.column(name) for name in table.column_names}
    for name in cats:
        s = df.get_column(name)
        arrays[name] = _dictionary(s) or s.cast(pl.String).to_arrow(compat_level=pl.CompatLevel.oldest())
    return pa.table([arrays[name] for name in df.columns], names=df.columns)


def _dictionary(s: pl.Series) -> pa.DictionaryArray | None:
    """A categorical series as an Arrow dictionary of the values it holds, in the order they first
    occur (None when those take :data:`DICTIONARY_MAX_BYTES` or more)."""
    import numpy as np
    import polars as pl
    import pyarrow as pa

    codes = s.to_physical()
    got = first_occurrences(codes)
    if got is None:  # codes spread far wider than the rows: hashed
        first = np.sort(codes.arg_unique().to_numpy())
        if codes.null_count():
            first = first[codes.gather(first).is_not_null().to_numpy()]
        c = codes.fill_null(0).to_numpy()
        lut = np.zeros(int(codes.max() or 0) + 1, dtype=np.int32)
        lut[c[first]] = np.arange(len(first), dtype=np.int32)
        indices = np.take(lut, c)
    else:
        first, indices = got
    values = s.gather(pl.Series(first, dtype=pl.Int64)).cast(pl.String)
    if (values.str.len_bytes().sum() or 0) + 4 * len(values) >= DICTIONARY_MAX_BYTES:
        return None
    mask = None
    if codes.null_count():
        mask = codes.is_null().to_numpy()
        indices[mask] = 0
    # the indices are in range by construction: no check of each row
    return pa.DictionaryArray.from_arrays(pa.array(indices, mask=mask),
                                          values.to_arrow(compat_level=pl.CompatLevel.oldest()), safe=False)


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema])


def _plain(table: pa.Table) -> pa.Table:
    import pyarrow as pa

    if not any(pa.types.is_dictionary(f.type) for f in table.schema):
        return table
    return table.cast(_plain_schema(table.schema))


class PartWriter:
    """``pq.ParquetWriter(path, compression="zstd")`` of a table with key-value ``metadata``, string
    columns without min/max statistics, one row group per :meth:`write`; the file is the one that
    writer gives from the plain-string tables (see the module docs)."""

    def __init__(self, path: Path, first: pa.Table, metadata: dict[str, str]) -> None:
        import pyarrow as pa

        self.path = path
        plain = _plain_schema(first.schema)
        # min/max of a string column cost a third of the encoding and prune nothing here (a row
        # group is one reader chunk: it holds that chunk's whole mix of names and paths); numbers
        # keep theirs
        self._stats = [f.name for f in plain if not pa.types.is_large_string(f.type)]
        # what pyarrow writes itself with store_schema: the table's keys, then the Arrow schema
        # (of plain strings) with those keys in it
        with_meta = plain.with_metadata(metadata)
        self._kv = {**metadata, "ARROW:schema": base64.b64encode(with_meta.serialize().to_pybytes()).decode()}
        self._open(first.schema)
        self.write(first)

    def _open(self, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self.schema = schema
        self._w: pq.ParquetWriter = pq.ParquetWriter(self.path, schema, compression="zstd",
                                                     write_statistics=self._stats, store_schema=False)
        self._w.add_key_value_metadata(self._kv)

    def write(self, table: pa.Table) -> None:
        """One row group."""
        if table.num_rows > ROW_GROUP_MAX_ROWS:  # pyarrow slices it: a slice's dictionary would list values it lacks
            table = _plain(table)
        if not table.schema.equals(self.schema):
            table = _plain(table)
            if not table.schema.equals(self.schema):  # the file has dictionary columns: make them plain
                self._rewrite_plain()
        self._w.write_table(table)

    def _rewrite_plain(self) -> None:
        """Go on with plain-string columns: the row groups written so far are written again so."""
        import pyarrow.parquet as pq

        self._w.close()
        old = self.path.with_name(self.path.name + ".dict")
        os.replace(self.path, old)
        try:
            self._open(_plain_schema(self.schema))
            with pq.ParquetFile(old) as f:  # its ARROW:schema gives the columns back as plain strings
                for i in range(f.num_row_groups):
                    self._w.write_table(f.read_row_group(i))
        finally:
            old.unlink(missing_ok=True)

    def close(self) -> None:
        self._w.close()
