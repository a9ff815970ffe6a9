"""Where each name of a Polars ``Categorical`` column first occurs, without hashing a row.

A categorical holds one code per row; the codes come from categories shared by the process, so a
chunk uses a few of them, spread over a range. The Parquet staging writer needs a chunk's names
in the order they first occur (its dictionary, :mod:`analyses.parquet_parts`) and the steps
summary needs an id per row, equal for equal names (:func:`analyses.steps.metric_ids`). Both were
``arg_unique`` (a hash per row, ~2.5 ms of a 290k-row chunk of a verl log) or a scatter over all
rows; a chunk of log lines meets all its names within its first lines, so these are found there
and every row is mapped through an array indexed by code (all rows are looked at only when a
later row holds a name the first ones lack).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

# arrays indexed by code unless the largest code exceeds this many per row (plus a slack): a long
# process's categories may hold far more names than one chunk uses
DENSE_CODES_PER_ROW = 4
DENSE_CODES_SLACK = 1 << 16
HEAD_ROWS = 4096  # rows looked at first


def first_occurrences(codes: pl.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """Of a categorical's physical codes (``Series.to_physical()``): the rows where each name first
    occurs, in row order, and each row's index into those (``len(rows)`` for a null); None when
    the column is empty or its codes are too sparse for arrays indexed by code."""
    import numpy as np

    n, nulls = len(codes), codes.null_count()
    if n == 0:
        return None
    # a null becomes the code after the largest
    c = codes.fill_null(0 if nulls == n else (codes.max() or 0) + 1).to_numpy() if nulls else codes.to_numpy()
    top = int(c.max()) + 1
    if top > DENSE_CODES_PER_ROW * n + DENSE_CODES_SLACK:
        return None
    k = min(n, HEAD_ROWS)
    while True:
        first = np.full(top, -1, dtype=np.int64)
        # the first row of each code (np.unique says so; a scatter with repeated indices would
        # rely on an assignment order numpy does not promise)
        met, at = np.unique(c[:k], return_index=True)
        first[met] = at
        if nulls:
            first[top - 1] = -1
        rows = np.sort(first[first >= 0])
        lut = np.full(top, -1, dtype=np.int32)
        lut[c[rows]] = np.arange(len(rows), dtype=np.int32)
        if nulls:
            lut[top - 1] = len(rows)
        indices = np.take(lut, c)
        if k == n or indices.min() >= 0:  # every row's code was met in the first k rows
            return rows, indices
        k = n
