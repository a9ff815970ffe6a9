"""analyses.parquet_parts: a part written with categorical columns is byte for byte the file pyarrow
writes from the same rows as plain strings (as RunStaging wrote every part before)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analyses import categorical_codes, parquet_parts
from analyses.parquet_parts import PartWriter, arrow_table

META = {"polytrace.table": "t", "polytrace.description": "a test table", "polytrace.columns": "{}"}


def _batch(names: list[str | None], step0: int, categorical: bool = True) -> pl.DataFrame:
    name = pl.Series("name", names, dtype=pl.String)
    return pl.DataFrame({
        "step": pl.int_range(step0, step0 + len(names), eager=True, dtype=pl.Int64),
        "name": name.cast(pl.Categorical) if categorical else name,
        "value": [float(i % 7) for i in range(len(names))],
        "path": pl.Series(["logs/a.log"] * len(names)).cast(pl.Categorical if categorical else pl.String),
    })


def _reference(path: Path, batches: list[pl.DataFrame]) -> bytes:
    """What RunStaging wrote before: plain strings, pyarrow's own ARROW:schema."""
    tables = [b.with_columns(pl.col("name", "path").cast(pl.String)).to_arrow(compat_level=pl.CompatLevel.oldest())
              for b in batches]
    schema = tables[0].schema
    stats = [f.name for f in schema if not pa.types.is_large_string(f.type)]
    with pq.ParquetWriter(path, schema.with_metadata(META), compression="zstd", write_statistics=stats) as w:
        for t in tables:
            w.write_table(t)
    return path.read_bytes()


def _written(path: Path, batches: list[pl.DataFrame]) -> bytes:
    w = PartWriter(path, arrow_table(batches[0]), META)
    for b in batches[1:]:
        w.write(arrow_table(b))
    w.close()
    return path.read_bytes()


def test_categorical_columns_give_the_same_bytes(tmp_path: Path) -> None:
    # the categories' codes are made in another order than the rows meet them ("z" first), and the
    # second batch holds a null and a value the first lacks: each row group's dictionary is its
    # own values in the order they first occur
    pl.Series(["z", "y", "x"]).cast(pl.Categorical)
    batches = [_batch(["x", "y", "x", "z"] * 50, 0), _batch(["w", None, "z", "x"] * 50, 200)]
    table = arrow_table(batches[1])
    assert pa.types.is_dictionary(table.schema.field("name").type)
    assert table.column("name").chunk(0).dictionary.to_pylist() == ["w", "z", "x"]
    assert _written(tmp_path / "a.parquet", batches) == _reference(tmp_path / "b.parquet", batches)
    back = pl.read_parquet(tmp_path / "a.parquet")
    assert back.schema["name"] == pl.String
    assert back.get_column("name").to_list()[200:204] == ["w", None, "z", "x"]


def test_plain_batch_after_categorical_ones_rewrites_the_part_plain(tmp_path: Path) -> None:
    batches = [_batch(["x", "y"] * 30, 0), _batch(["y", "q"] * 30, 60), _batch(["q", "x"] * 30, 120, categorical=False)]
    assert _written(tmp_path / "a.parquet", batches) == _reference(tmp_path / "b.parquet", batches)
    assert not (tmp_path / "a.parquet.dict").exists()


def test_large_dictionary_is_passed_as_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet_parts, "DICTIONARY_MAX_BYTES", 64)
    batches = [_batch(["a", "b"] * 10, 0), _batch([f"name-{i:04d}" for i in range(40)], 20)]
    assert not pa.types.is_dictionary(arrow_table(batches[1]).schema.field("name").type)
    assert pa.types.is_dictionary(arrow_table(batches[1]).schema.field("path").type)
    assert _written(tmp_path / "a.parquet", batches) == _reference(tmp_path / "b.parquet", batches)


def test_name_first_met_past_the_head_rows(tmp_path: Path) -> None:
    # the first occurrences are looked for in the first rows, then in all rows when a later row's
    # name was not among them (here "late", and a null, past the head)
    n = categorical_codes.HEAD_ROWS + 10
    batches = [_batch(["x", "y"] * (n // 2), 0), _batch(["y"] * n + ["late", None, "x"], n)]
    assert arrow_table(batches[1]).column("name").chunk(0).dictionary.to_pylist() == ["y", "late", "x"]
    assert _written(tmp_path / "a.parquet", batches) == _reference(tmp_path / "b.parquet", batches)


def test_sparse_codes_are_ranked_by_hashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # codes far wider than the rows (a long process's categories) take the hashing path, same bytes
    monkeypatch.setattr(categorical_codes, "DENSE_CODES_PER_ROW", 0)
    monkeypatch.setattr(categorical_codes, "DENSE_CODES_SLACK", 0)
    batches = [_batch(["b", None, "a", "b"] * 20, 0), _batch([None, "c", "a"] * 20, 80)]
    assert arrow_table(batches[1]).column("name").chunk(0).dictionary.to_pylist() == ["c", "a"]
    assert _written(tmp_path / "a.parquet", batches) == _reference(tmp_path / "b.parquet", batches)
