"""The fit from summaries' fast paths (issue 29: `make demo`'s fits) against the straightforward
arithmetic they replace, bit for bit: the demo's specs and exports must not change by a bit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from analyses.fit.stepshape import (
    FAMILIES,
    StepShape,
    WindowMean,
    _solve,
    capped_mean,
    mid_mean,
    solve_levels,
    std_cdf,
    std_cdf_sf,
    std_sf,
)
from analyses.fit.summary_fit import (
    LengthSummaries,
    MeanLoglik,
    RowsLoglik,
    _levels,
    _Rows,
    fit_body,
    fit_levels,
    loglik_rows,
    mean_parts,
    mean_terms,
    row_parts,
)


def _solve_reference(shape: StepShape, target: np.ndarray, center: np.ndarray,
                     mean_fn: Callable[[np.ndarray], np.ndarray], log_target: np.ndarray, tol: float, iters: int,
                     guess: np.ndarray | None) -> np.ndarray:
    """The level search as first written (regula falsi, Illinois rule with a side flag per row)."""

    def g(mu: np.ndarray) -> np.ndarray:
        out = np.log(mean_fn(mu)) - log_target
        return np.where(np.isfinite(out), out, np.where(mu < center, -50.0, 50.0))

    center_t = np.log(np.maximum(target, 1e-9)) if guess is None else np.asarray(guess, dtype=float)
    a = b = fa = fb = None
    found = np.zeros(target.shape, bool)
    for width in (4.0 * shape.s + 0.5, 12.0 * shape.s + 2.0, 30.0 * shape.s + 12.0):
        wa, wb = center_t - width, center_t + width
        fwa, fwb = g(wa), g(wb)
        ok = ~found & (fwa < 0) & (fwb > 0)
        if a is None:
            a, b, fa, fb = wa, wb, fwa, fwb
        a, b, fa, fb = np.where(ok, wa, a), np.where(ok, wb, b), np.where(ok, fwa, fa), np.where(ok, fwb, fb)
        found |= ok
        if found.all():
            break
    side = np.zeros(target.shape)
    x = 0.5 * (a + b)
    for _ in range(iters):
        x = np.where(fb != fa, (a * fb - b * fa) / (fb - fa), 0.5 * (a + b))
        x = np.where(np.isfinite(x) & (x > np.minimum(a, b)) & (x < np.maximum(a, b)), x, 0.5 * (a + b))
        fx = g(x)
        if ((np.abs(fx) < tol) | (np.abs(b - a) < tol)).all():
            break
        left = np.sign(fx) == np.sign(fa)
        fb = np.where(left & (side == 1), fb / 2, fb)
        fa = np.where(~left & (side == -1), fa / 2, fa)
        a, fa = np.where(left, x, a), np.where(left, fx, fa)
        b, fb = np.where(left, b, x), np.where(left, fb, fx)
        side = np.where(left, 1, -1)
    if found.all():
        return x
    fallback = np.log(np.maximum(target, 1e-300)) - float(shape.ppf(np.array([0.5]))[0])
    return np.where(found, x, fallback)


SHAPES = [StepShape("logistic", 0.4, 1e-3, 2e-3, 6.0, 3.0), StepShape("normal", 0.3, 0.0, 0.0, 5.0, 2.0),
          StepShape("gumbel_min", 0.5, 1e-4, 0.0, 6.0, 3.0), StepShape("glogistic", 0.35, 0.0, 5e-3, 6.0, 3.0, 4.0)]


@pytest.mark.parametrize("family", FAMILIES)
def test_cdf_and_sf_together_are_each_alone(family):
    z = np.concatenate([np.linspace(-40.0, 12.0, 53), [-np.inf, np.inf, 800.0]])
    c, s = std_cdf_sf(family, z, 3.0)
    assert np.array_equal(c, std_cdf(family, z, 3.0)) and np.array_equal(s, std_sf(family, z, 3.0))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.family)
def test_window_mean_is_mid_mean(shape):
    mu = np.array([5.8, 6.1, 6.0, 2.0, 9.0])
    lo = np.array([3.0, 400.0, 1.0, 0.5, 3.0])
    hi = np.array([3000.0, np.inf, 2.0, 40.0, 3.5])
    assert np.array_equal(WindowMean(shape, lo, hi)(mu), mid_mean(shape, mu, lo, hi), equal_nan=True)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.family)
def test_the_level_search_is_the_first_one(shape):
    """Windows wide and narrow, one no level reaches (the fallback), with and without a guess."""
    lo = np.array([3.0, 50.0, 10.0, 100.0, 1.0, 20.0])
    hi = np.array([3000.0, 900.0, 12.0, 101.0, 1e6, 4000.0])
    target = np.array([400.0, 200.0, 11.0, 100.9, 30.0, 25.0])
    for guess in (None, np.log(target) + 0.3):
        with np.errstate(divide="ignore", invalid="ignore"):
            center = 0.5 * (np.log(lo) + np.log(hi))
            args = (shape, target, center, WindowMean(shape, lo, hi), np.log(target), 1e-7, 80, guess)
            ref = _solve_reference(*args)
            assert np.array_equal(_solve(*args), ref, equal_nan=True)  # under solve_levels' errstate, as it runs
        assert np.array_equal(solve_levels(shape, target, lo, hi, guess=guess), ref, equal_nan=True)


def test_levels_of_rows_with_and_without_a_window_are_each_rows_own():
    """A row with no window (a mean only) is solved from its capped mean, the others from their
    window's: each row's mean computed on its own is what computing both for every row and choosing gives."""

    n = np.array([256.0, 256.0, 4.0, 256.0])
    d = LengthSummaries("response", np.arange(4), n, np.array([400.0, 380.0, 350.0, 420.0]),
                        np.array([12.0, 15.0, np.nan, 9.0]), np.array([2000.0, 4000.0, np.nan, 3100.0]),
                        np.array([0.0, 3.0, 0.0, 0.0]), np.ones(4), 4000.0)
    r = _Rows(d)
    windowed = r.mid | r.use_term
    assert windowed.any() and not windowed.all()
    sh = SHAPES[0]
    window = WindowMean(sh, r.win_lo, r.win_hi)

    def both(mu: np.ndarray) -> np.ndarray:
        return np.where(windowed, window(mu), capped_mean(sh, mu, r.cap))

    hi = np.where(np.isfinite(r.win_hi), r.win_hi, r.target * 1e3)
    assert np.array_equal(_levels(sh, r), solve_levels(sh, r.target, r.win_lo, hi, mean_fn=both))
    plain = replace(sh, eps_lo=0.0, eps_hi=0.0)
    assert np.array_equal(_levels(plain, r, np.log(d.mean)),
                          solve_levels(plain, r.target, r.win_lo, hi, mean_fn=lambda m: np.where(
                              windowed, WindowMean(plain, r.win_lo, r.win_hi)(m), capped_mean(plain, m, r.cap)),
                              guess=np.log(d.mean)))


def test_the_body_kept_has_the_spread_fit_levels_gives_it():
    """fit_body computes the spread's standard error of the body it keeps only: that body is
    fit_levels' own, field for field."""
    rng = np.random.default_rng(3)
    x = np.minimum(np.rint(np.exp(6.0 + 0.35 * rng.logistic(size=(4, 128)))), 4000.0)
    n = np.full(4, 128.0)
    d = LengthSummaries("response", np.arange(4), n, x.mean(axis=1), x.min(axis=1), x.max(axis=1),
                        (x >= 4000.0).sum(axis=1).astype(float), np.ones(4), 4000.0)
    kept = fit_body(d)
    alone = fit_levels(d, kept.shape.family, skew=kept.shape.skew)
    assert kept.spread_se > 0 and kept.spread_se == alone.spread_se and kept.loglik == alone.loglik
    assert kept.shape == alone.shape and np.array_equal(kept.mu, alone.mu) and np.array_equal(kept.mu_var, alone.mu_var)


def _mixed_rows() -> LengthSummaries:
    """One batch's extremes with and without a cut, a row whose draws are all one length, a max
    alone, a mean alone: every branch of the rows' likelihood."""
    n = np.array([256.0, 256.0, 64.0, 256.0, 4.0, 128.0])
    return LengthSummaries("response", np.arange(6), n, np.array([400.0, 900.0, 300.0, 420.0, 350.0, 200.0]),
                           np.array([12.0, 15.0, 300.0, np.nan, np.nan, 180.0]),
                           np.array([2000.0, 4000.0, 300.0, 3100.0, np.nan, 260.0]),
                           np.array([0.0, 9.0, 0.0, 0.0, 0.0, 0.0]), np.ones(6), 4000.0)


@pytest.mark.parametrize("shift", [0.0, 3.0, -6.0], ids=["mixed", "levels_low", "levels_high"])
def test_weights_only_likelihoods_with_every_kind_of_row(shift):
    """RowsLoglik / MeanLoglik (their choices made once where every row makes them alike) are
    loglik_rows / mean_terms bit for bit, whichever side of the median the endpoints fall."""
    d = _mixed_rows()
    r = _Rows(d)
    assert r.cut.any() and r.maxonly.any() and (d.lo >= d.hi).any()
    sh = SHAPES[0]
    mu = np.log(d.mean) - 0.1 + shift
    for other in (replace(sh, eps_lo=0.013, eps_hi=0.002), replace(sh, eps_lo=1e-7, eps_hi=0.04)):
        assert np.array_equal(RowsLoglik(r, mu, row_parts(sh, r, mu))(other), loglik_rows(other, r, mu))
        assert np.array_equal(MeanLoglik(r, mu, mean_parts(sh, r, mu))(other), mean_terms(other, r, mu))
    plain = LengthSummaries("response", np.arange(3), np.full(3, 100.0), np.array([400.0, 420.0, 380.0]),
                            np.array([20.0, 25.0, 15.0]), np.array([2000.0, 1900.0, 2500.0]), np.zeros(3), np.ones(3), None)
    r = _Rows(plain)
    mu = np.log(plain.mean) + shift
    assert np.array_equal(RowsLoglik(r, mu, row_parts(sh, r, mu))(sh), loglik_rows(sh, r, mu))


def test_nelder_mead_remembering_clipped_points_fits_the_same(monkeypatch):
    """The weights' Nelder-Mead (a shared level: prompts) with each clipped point evaluated once
    (OnBox) fits exactly what evaluating every point again fits, and does revisit points."""
    import analyses.fit.summary_fit as sf

    rng = np.random.default_rng(5)
    x = np.rint(np.exp(5.0 + 0.3 * rng.logistic(size=(5, 64))))
    d = LengthSummaries("prompt", np.arange(5), np.full(5, 64.0), x.mean(axis=1), x.min(axis=1), x.max(axis=1),
                        np.zeros(5), np.ones(5), None)
    hits = []

    class Counting(sf.OnBox):
        def __call__(self, x: np.ndarray) -> float:
            n = len(self.seen)
            out = super().__call__(x)
            hits.append(len(self.seen) == n)
            return out

    class Forgetful(sf.OnBox):
        def __call__(self, x: np.ndarray) -> float:
            return self.f(np.clip(x, *sf.LOG_EPS))

    monkeypatch.setattr(sf, "OnBox", Counting)
    kept = fit_levels(d, shared=True)
    assert any(hits)
    monkeypatch.setattr(sf, "OnBox", Forgetful)
    again = fit_levels(d, shared=True)
    assert kept.shape == again.shape and kept.loglik == again.loglik and kept.spread_se == again.spread_se
    assert np.array_equal(kept.mu, again.mu) and np.array_equal(kept.mu_var, again.mu_var)


def test_nbinom_logpmf_is_scipys():
    from scipy import stats

    from analyses.fit.discrete import nbinom_logpmf

    y = np.array([0, 1, 1, 2, 3, 5, 8, 13, 40, 0, 7], np.int64)
    for r, p in ((0.7, 0.2), (3.0, 0.5), (25.0, 0.9999), (1e-3, 1.0), (5.0, 1e-9), (0.0, 0.5)):
        assert np.array_equal(nbinom_logpmf(y, r, p), stats.nbinom.logpmf(y, r, p), equal_nan=True)
