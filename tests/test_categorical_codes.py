"""analyses.categorical_codes: first occurrences of a categorical's names, found from the codes."""

from __future__ import annotations

import polars as pl
import pytest

from analyses import categorical_codes
from analyses.categorical_codes import first_occurrences


def _codes(names: list[str | None]) -> pl.Series:
    pl.Series(["c", "b", "a"]).cast(pl.Categorical)  # codes made in another order than the rows meet them
    return pl.Series(names).cast(pl.Categorical).to_physical()


def test_rows_in_first_occurrence_order_and_null_is_one_more_index() -> None:
    rows, idx = first_occurrences(_codes(["a", None, "c", "a", "b", None]))
    assert rows.tolist() == [0, 2, 4]  # a, c, b
    assert idx.tolist() == [0, 3, 1, 0, 2, 3]


def test_a_name_first_met_past_the_head_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(categorical_codes, "HEAD_ROWS", 2)
    rows, idx = first_occurrences(_codes(["b", "b", "b", "a", None, "b"]))
    assert rows.tolist() == [0, 3]
    assert idx.tolist() == [0, 0, 0, 1, 2, 0]


def test_all_null_empty_and_sparse() -> None:
    rows, idx = first_occurrences(_codes([None, None]))
    assert rows.tolist() == [] and idx.tolist() == [0, 0]
    assert first_occurrences(_codes([])) is None


def test_codes_far_wider_than_the_rows_are_left_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(categorical_codes, "DENSE_CODES_PER_ROW", 0)
    monkeypatch.setattr(categorical_codes, "DENSE_CODES_SLACK", 0)
    assert first_occurrences(_codes(["a", "b"])) is None
