"""The Parquet layout stays hive-partitioned (``parquet/<table>/run_id=<id>/``), so engines that
list directories (Spark, Trino, Athena, ``pyarrow.dataset``) read the same rows as DuckDB's
manifest-driven views, table by table."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from analyses import catalog
from analyses.cli import main
from analyses.schema import TABLES

REPO = Path(__file__).resolve().parents[1]


def hive_table(root: Path, table: str) -> pl.DataFrame:
    """``table`` as a directory-listing engine sees it: every file under its hive partitions,
    schemas unified across runs (a run without a column reads it as null)."""
    base = root / "parquet" / table
    part = ds.partitioning(pa.schema([("run_id", pa.string())]), flavor="hive")
    first = ds.dataset(base, format="parquet", partitioning=part)
    schema = pa.unify_schemas([f.physical_schema for f in first.get_fragments()] + [part.schema])
    return pl.from_arrow(ds.dataset(base, format="parquet", partitioning=part, schema=schema).to_table())


# one worker runs the module: its module fixture (sample_logs ingested) is built once, not on each worker
pytestmark = pytest.mark.xdist_group("hive_layout")


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wh = tmp_path_factory.mktemp("hive") / "wh"
    assert main(["ingest", "--root", str(REPO / "sample_logs"), "--warehouse", str(wh), "-q"]) == 0
    return wh


@pytest.mark.parametrize("table", list(TABLES))
def test_pyarrow_dataset_with_hive_partitioning_reads_duckdbs_rows(warehouse: Path, table: str) -> None:
    con = catalog.connect(warehouse)
    duck = con.sql(f'SELECT * FROM "{table}"').pl()
    con.close()
    if duck.height == 0:
        assert not (warehouse / "parquet" / table).exists() or hive_table(warehouse, table).height == 0
        return
    hive = hive_table(warehouse, table)
    cols = [c for c in duck.columns if c in hive.columns]
    assert set(duck.columns) - set(cols) <= {c for c in duck.columns if duck[c].null_count() == duck.height}
    a = duck.select(cols).sort(cols, nulls_last=True)
    b = hive.select(cols).cast(dict(a.schema)).sort(cols, nulls_last=True)
    assert a.height == b.height and a.equals(b)
