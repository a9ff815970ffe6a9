"""analyses.warehouse._staged_frame: what the staging writer encodes, as conform() gives it."""

from __future__ import annotations

import polars as pl
from polars.testing import assert_frame_equal

from analyses.schema import TABLES, conform
from analyses.warehouse import _staged_frame

T = TABLES["step_metrics"]


def _chunk() -> pl.DataFrame:
    return pl.DataFrame({
        "line_no": pl.Series([3, 3, 5], dtype=pl.Int32),  # cast to the contract's Int64
        "step": [1, 1, 2],
        "metric": pl.Series(["a", "b", "a"], dtype=pl.Categorical),  # kept categorical
        "value": [0.5, None, 2.0],
        "raw_metric": pl.Series(["a", "b", "a"], dtype=pl.Categorical),
        "is_validation": [False, False, True],
        "path": pl.Series(["x.log"] * 3, dtype=pl.Categorical),
        "extra": [1, 2, 3],  # not in the contract: dropped
    })


def test_every_stored_column_present_is_selected_in_contract_order_with_casts() -> None:
    got = _staged_frame(_chunk(), T)
    assert got.columns == list(T.stored_columns)
    assert got.schema["line_no"] == pl.Int64 and got.schema["metric"] == pl.Categorical
    plain = got.with_columns(pl.col(pl.Categorical).cast(pl.String))
    assert_frame_equal(plain, conform(_chunk(), T).select(list(T.stored_columns)))


def test_a_missing_column_is_a_null_column_as_conform_makes_it() -> None:
    got = _staged_frame(_chunk().drop("raw_metric"), T)
    assert got.columns == list(T.stored_columns)
    assert got.get_column("raw_metric").null_count() == 3 and got.schema["metric"] == pl.Categorical
