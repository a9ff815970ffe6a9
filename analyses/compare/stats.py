"""The test every measured difference of a comparison goes through, and its arithmetic.

**Units.** Samples within a training step are not independent (one policy, one batch, one
prompt group), so the unit of variation is the *step*: a run's value of a quantity (a median step
time, a response-length p99) is a statistic over its steps, and its uncertainty is what resampling
steps does to it. A run with fewer than :data:`MIN_UNITS` steps has no step-to-step variation to
judge by; per-sample variables then fall back to prompt groups as units (the samples of one prompt
are one unit), and a run with neither is *not judged* (``credible`` false, with the reason).

**Test of a quantity** (medians, means, quantiles): a moving-block bootstrap over each side's units
in step order (blocks of ``round(n ** (1/3))`` consecutive steps, so neighbouring steps that drift
together stay together), :data:`N_BOOT` replicates per side, independently. Each side's replicates
give its 95% percentile interval; the replicates of ``b - a`` give the p-value: twice the smaller
share of them on either side of 0 (with the +1 correction, so never below ``2 / (N_BOOT + 1)``). A
percentile test, not a z-test: a run whose steps fall into two clusters (a few steps with a 16k-token
response take 20x longer) has a skewed, two-humped bootstrap median whose standard error would hide a
difference every replicate agrees on. Assumption: within each side the step sequence is stationary
apart from dependence shorter than a block; a run whose level trends makes its own spread larger,
which makes the test more cautious, not less.

**Test of a distribution** (KS and CRPS distances between the pooled samples of the two sides): the
observed distance is compared with the distance between two independent block-bootstrap resamples
*of the same side*, i.e. what the side's own step-to-step variation produces; p is the larger of
the two sides' shares of within-side distances at least the observed one.

**Multiple quantities.** A comparison tests tens of quantities at once; their p-values are adjusted
by Holm's step-down method (valid under any dependence between them) and a difference is
*credible* when its adjusted p-value is below :data:`ALPHA`. The same log ingested twice gives
identical sides: every bootstrap difference is centred on 0 and no quantity is credible.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# bootstrap replicates per side: the smallest p-value is 2 / (N_BOOT + 1) ~ 0.0005, below Holm's first
# threshold ALPHA / m for up to ~100 quantities compared at once
N_BOOT = 4000
ALPHA = 0.05  # family-wise level of a comparison (Holm)
MIN_UNITS = 5  # units (steps) a side needs for its variation to be judged
INTERVAL = 0.95  # the percentile intervals reported with each value
SEED = 20250127  # the comparison is deterministic: same warehouse, same answer


def rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def block_length(n: int) -> int:
    """Moving-block length for ``n`` ordered units: ``round(n ** (1/3))``, at least 1."""
    return max(1, round(n ** (1 / 3)))


def block_indices(n: int, reps: int, gen: np.random.Generator) -> np.ndarray:
    """``[reps, n]`` unit indices of moving-block bootstrap resamples of ``n`` ordered units."""
    if n <= 0:
        return np.zeros((reps, 0), dtype=np.int64)
    length = block_length(n)
    k = math.ceil(n / length)
    starts = gen.integers(0, n - length + 1, size=(reps, k))
    return (starts[:, :, None] + np.arange(length)).reshape(reps, k * length)[:, :n]


def index_weights(idx: np.ndarray, n: int) -> np.ndarray:
    """``[reps, n]`` how often each unit was drawn in each resample of :func:`block_indices`."""
    reps = idx.shape[0]
    flat = (np.arange(reps)[:, None] * n + idx).ravel()
    return np.bincount(flat, minlength=reps * n).reshape(reps, n).astype(float)


@dataclass(frozen=True)
class Boot:
    """One quantity tested: the observed values, each side's interval, and the test of ``b - a``."""

    a: float
    b: float
    a_lo: float
    a_hi: float
    b_lo: float
    b_hi: float
    diff_lo: float
    diff_hi: float
    p: float


def interval(x: np.ndarray) -> tuple[float, float]:
    q = (1 - INTERVAL) / 2
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    return float(np.quantile(x, q)), float(np.quantile(x, 1 - q))


def two_sided_p(d: np.ndarray) -> float:
    """Two-sided bootstrap p-value of ``d`` (replicates of a difference) against 0: twice the
    smaller share at or beyond 0 on either side, with the +1 correction (never exactly 0). Replicates
    all exactly 0 (two identical sides) give 1."""
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan")
    lo = (np.sum(d <= 0) + 1) / (d.size + 1)
    hi = (np.sum(d >= 0) + 1) / (d.size + 1)
    return float(min(1.0, 2 * min(lo, hi)))


def boot_test(a: float, b: float, ra: np.ndarray, rb: np.ndarray) -> Boot:
    """:class:`Boot` from the observed values and each side's replicates (same length)."""
    d = rb - ra
    a_lo, a_hi = interval(ra)
    b_lo, b_hi = interval(rb)
    d_lo, d_hi = interval(d)
    return Boot(a, b, a_lo, a_hi, b_lo, b_hi, d_lo, d_hi, two_sided_p(d))


# ----------------------------------------------------------------------------- per-step series

Statistic = Callable[[np.ndarray], np.ndarray]  # [reps, n] values -> [reps] statistic


def median_rows(x: np.ndarray) -> np.ndarray:
    return np.median(x, axis=-1)


def mean_rows(x: np.ndarray) -> np.ndarray:
    return np.mean(x, axis=-1)


STATISTICS: dict[str, Statistic] = {"median": median_rows, "mean": mean_rows}


def series_replicates(values: np.ndarray, stat: Statistic, gen: np.random.Generator, reps: int = N_BOOT) -> np.ndarray:
    """``reps`` block-bootstrap replicates of ``stat`` over ``values`` (one per unit, in order)."""
    idx = block_indices(values.size, reps, gen)
    return stat(values[idx])


# ----------------------------------------------------------------------------- pooled samples


@dataclass(frozen=True)
class UnitHistogram:
    """Per-sample values of one side grouped by unit: ``counts[u, v]`` samples of unit ``u`` at
    ``values[v]`` (the distinct values of both sides, sorted). A resample's pooled distribution is
    ``weights @ counts``: no sample is copied, whatever the run's size."""

    values: np.ndarray  # [V] sorted distinct values (shared by the two sides of a comparison)
    counts: object  # scipy.sparse CSR [units, V]

    @property
    def n_units(self) -> int:
        return int(self.counts.shape[0])  # type: ignore[attr-defined]

    def pooled(self, weights: np.ndarray | None = None) -> np.ndarray:
        """``[reps, V]`` pooled counts for ``weights`` ``[reps, units]`` (all units once when None);
        callers keep ``reps`` to :func:`chunk_rows` rows at a time."""
        c = self.counts
        if weights is None:
            return np.asarray(c.sum(axis=0)).reshape(1, -1)  # type: ignore[attr-defined]
        return np.asarray((c.T @ weights.T).T)  # type: ignore[attr-defined]


def chunk_rows(n_values: int) -> int:
    """Replicates pooled at once: ``[rows, V]`` float arrays of at most ~32 MB."""
    return max(1, int(4_000_000 // max(1, n_values)))


def unit_histograms(units_a: np.ndarray, values_a: np.ndarray, units_b: np.ndarray,
                    values_b: np.ndarray) -> tuple[UnitHistogram, UnitHistogram]:
    """The two sides' :class:`UnitHistogram` on one grid of distinct values. ``units_*`` are unit
    positions 0..n-1 in step order, one per sample."""
    from scipy import sparse

    grid = np.unique(np.concatenate([values_a, values_b]))

    def one(units: np.ndarray, values: np.ndarray) -> UnitHistogram:
        n_units = int(units.max()) + 1 if units.size else 0
        col = np.searchsorted(grid, values)
        m = sparse.csr_matrix((np.ones(values.size), (units, col)), shape=(n_units, grid.size))
        m.sum_duplicates()
        return UnitHistogram(grid, m)

    return one(units_a, values_a), one(units_b, values_b)


def hist_quantile(values: np.ndarray, counts: np.ndarray, q: float, cum: np.ndarray | None = None) -> np.ndarray:
    """``quantile_disc`` of each row of ``counts`` ``[reps, V]``: the ``ceil(n q)``-th smallest value
    (the views' definition, :data:`analyses.views.sql.QUANTILE_DEFINITION`); NaN for an empty row.
    ``cum``: the rows' cumulative sums, when the caller has them already."""
    cum = np.cumsum(counts, axis=1) if cum is None else cum
    total = cum[:, -1]
    target = np.maximum(np.ceil(total * q - 1e-9), 1)
    # every row's first position with cum >= target, by one binary search over the rows laid end to
    # end (each row shifted above the one before it: the rows stay sorted as one array)
    shift = (np.arange(cum.shape[0]) * (float(total.max(initial=0)) + 1.0))[:, None]
    flat = (cum + shift).ravel()
    pos = np.searchsorted(flat, target + shift[:, 0], side="left") - np.arange(cum.shape[0]) * cum.shape[1]
    pos = np.minimum(pos, values.size - 1)
    out = values[pos].astype(float)
    out[total <= 0] = np.nan
    return out


def hist_stats(values: np.ndarray, counts: np.ndarray, stats: tuple[tuple[str, float | None], ...]
               ) -> dict[str, np.ndarray]:
    """Each (name, q) of ``stats`` over the rows of ``counts``: the mean for ``q`` None, else
    :func:`hist_quantile` (one cumulative sum for all of them)."""
    cum = np.cumsum(counts, axis=1)
    return {name: hist_mean(values, counts) if q is None else hist_quantile(values, counts, q, cum)
            for name, q in stats}


def hist_mean(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    total = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (counts @ values.astype(float)) / total


def hist_distances(values: np.ndarray, ca: np.ndarray, cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise KS and CRPS distances between pooled counts ``ca`` and ``cb`` ``[reps, V]``.

    KS is ``max |F_a - F_b|``; the CRPS distance is ``integral (F_a - F_b)^2 dx`` (the ECDFs are
    steps between distinct values), which equals the mean CRPS of ``a``'s samples as a forecast of
    ``b``'s minus that of ``b``'s own (:func:`analyses.fit.scores.crps_distance`)."""
    fa = np.cumsum(ca, axis=1) / np.maximum(ca.sum(axis=1, keepdims=True), 1e-300)
    fb = np.cumsum(cb, axis=1) / np.maximum(cb.sum(axis=1, keepdims=True), 1e-300)
    diff = fa - fb
    ks = np.abs(diff).max(axis=1)
    widths = np.diff(values.astype(float))
    crps = (diff[:, :-1] ** 2 * widths).sum(axis=1) if values.size > 1 else np.zeros(ca.shape[0])
    return ks, crps


def within_side_distances(h: UnitHistogram, gen: np.random.Generator, reps: int) -> tuple[np.ndarray, np.ndarray]:
    """KS and CRPS distances between pairs of independent block-bootstrap resamples of one side:
    the distances its own step-to-step variation produces."""
    w1 = index_weights(block_indices(h.n_units, reps, gen), h.n_units)
    w2 = index_weights(block_indices(h.n_units, reps, gen), h.n_units)
    step = chunk_rows(h.values.size)
    parts = [hist_distances(h.values, h.pooled(w1[i:i + step]), h.pooled(w2[i:i + step])) for i in range(0, reps, step)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def exceed_share(null: np.ndarray, observed: float) -> float:
    """Share of ``null`` at least ``observed`` (with the +1 correction)."""
    null = null[np.isfinite(null)]
    return float((np.sum(null >= observed - 1e-12) + 1) / (null.size + 1))


# ----------------------------------------------------------------------------- many tests at once


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted as a test)."""
    idx = [i for i, x in enumerate(p) if x == x]
    order = sorted(idx, key=lambda i: p[i])
    m = len(order)
    out = [float("nan")] * len(p)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        out[i] = running
    return out
