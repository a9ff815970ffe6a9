"""The fit from summaries' shortcuts and its skewed body (issue 23): the contamination weights'
optimisation reuses what the weights do not change, bit for bit; a fidelity check fits each prefix
once; the glogistic body is scipy's burr12 and spans the log-logistic and the Weibull."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from scipy import optimize, special, stats

from analyses.fit.select import fit_summaries_selected
from analyses.fit.stepshape import (
    StepShape,
    WindowMean,
    capped_mean,
    capped_parts,
    mid_mean,
    mid_var,
    window_parts,
    window_var,
)
from analyses.fit.summaries import conform_summaries
from analyses.fit.summary_fit import (
    LOG_EPS,
    SPELLINGS,
    LengthSummaries,
    MeanLoglik,
    RowsLoglik,
    _Rows,
    fit_body,
    loglik_rows,
    max_weights,
    mean_parts,
    mean_terms,
    row_parts,
    weight_terms,
)


def _rows(seed: int, skew: float = 1.0, steps: int = 6, n: int = 256, cap: float = 4000.0, s: float = 0.35,
          averaged: float = 1.0) -> pl.DataFrame:
    """Summaries as verl prints them of lengths exp(mu_k + s Z), Z standard glogistic(skew)
    (logistic at 1), capped."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(steps):
        u = rng.random(n)
        z = np.log(np.expm1(-np.log1p(-u) / skew))
        x = np.minimum(np.rint(np.exp(6.0 + 0.02 * k + s * z)), cap)
        out.append({"step": k, "n": float(n), "response_mean": x.mean(), "response_min": x.min(),
                    "response_max": x.max(), "response_clip_ratio": float(np.mean(x >= cap)), "averaged_steps": averaged,
                    "prompt_mean": 100.0, "prompt_min": 100.0, "prompt_max": 100.0})
    return pl.DataFrame(out)


@pytest.mark.parametrize("family,skew", [("logistic", 1.0), ("glogistic", 3.0), ("gumbel_min", 1.0)])
def test_the_weights_move_only_the_weights_terms(family, skew):
    """What a fit that varies only eps_lo / eps_hi computes once (its parts, at the first
    weights) gives, at other weights, exactly what computing everything again gives."""
    sh = StepShape(family, 0.4, 1e-4, 1e-4, 6.0, 3.0, skew)
    other = replace(sh, eps_lo=0.013, eps_hi=0.002)
    t = np.linspace(-8.0, 4.0, 41)
    assert all(np.array_equal(a, b) for a, b in zip(other.mix(sh.parts(t)), other.cdf_sf(t), strict=True))
    assert np.array_equal(other.mix_pdf(sh.parts(t, density=True)), other.pdf(t))
    assert np.array_equal(other.mix_exp(sh.exp_parts(t[:-1], t[1:], 2)), other.partial_exp(t[:-1], t[1:], 2))
    mu = np.array([5.8, 6.1, 6.0])
    lo, hi = np.full(3, 3.0), np.full(3, 3000.0)
    assert np.array_equal(window_var(other, mu, window_parts(sh, mu, lo, hi, var=True)), mid_var(other, mu, lo, hi))
    assert np.array_equal(capped_mean(other, mu, 2000.0, capped_parts(sh, mu, 2000.0)), capped_mean(other, mu, 2000.0))
    # every kind of row: one batch's extremes with and without a cut, averaged extremes, seconds
    frames = [(_rows(1, cap=600.0), 600.0, 0.5), (_rows(2, averaged=10.0), 4000.0, 0.5), (_rows(3), None, 0.0)]
    for df, cap, half in frames:
        d = replace(LengthSummaries.from_frame(df, "response", "n", cap, SPELLINGS), half=half)
        r = _Rows(d)
        m = np.log(d.mean) - 0.1
        assert np.array_equal(loglik_rows(other, r, m, row_parts(sh, r, m)), loglik_rows(other, r, m))
        assert np.array_equal(RowsLoglik(r, m, row_parts(sh, r, m))(other), loglik_rows(other, r, m))
        assert np.array_equal(mean_terms(other, r, m, mean_parts(sh, r, m)), mean_terms(other, r, m))
        assert np.array_equal(MeanLoglik(r, m, mean_parts(sh, r, m))(other), mean_terms(other, r, m))
    for window in ((lo, hi), (np.array([3.0, 400.0, 1.0]), np.array([3000.0, np.inf, 2.0]))):
        # the level solve's fused mean (WindowMean) is mid_mean's arithmetic: equal bit for bit
        assert np.array_equal(WindowMean(other, *window)(mu), mid_mean(other, mu, *window), equal_nan=True)
    with pytest.raises(ValueError, match="parts of"):
        replace(sh, s=0.5).mix(sh.parts(t))


def test_the_glogistic_is_burr12_between_the_logistic_and_the_weibull():
    sh = StepShape("glogistic", 0.4, 0.0, 0.0, 1.0, 1.0, 3.0)
    x = np.array([10.0, 100.0, 500.0, 1000.0, 3000.0])
    ref = stats.burr12(1 / 0.4, 3.0, 0, 800.0)
    assert sh.cdf(np.log(x / 800.0)) == pytest.approx(ref.cdf(x), rel=1e-12)
    assert 800.0 * sh.partial_exp(np.array([-np.inf]), np.array([np.inf]))[0] == pytest.approx(ref.mean(), rel=1e-6)
    z = np.linspace(-6.0, 4.0, 21)
    # a = 1: 1 - 1/(1 + e^z) = expit(z); a -> inf, shifted by log a: 1 - exp(-e^z), the Gumbel-min
    one = StepShape("glogistic", 1.0, 0.0, 0.0, 1.0, 1.0, 1.0)
    assert one.cdf(z) == pytest.approx(special.expit(z), abs=1e-12)
    big = StepShape("glogistic", 1.0, 0.0, 0.0, 1.0, 1.0, 1e5)
    assert big.cdf(z - math.log(1e5)) == pytest.approx(-np.expm1(-np.exp(z)), abs=1e-4)


def test_the_body_is_the_least_skewed_the_summaries_allow():
    """Left-skewed trajectory lengths (glogistic a = 4 on the log axis, as multi-turn trajectories
    are) take a skewed body; log-logistic lengths keep the log-logistic."""
    skewed = fit_body(LengthSummaries.from_frame(_rows(5, skew=4.0, steps=4), "response", "n", 4000.0, SPELLINGS),
                      multi_turn=True)
    assert skewed.shape.family != "logistic"
    plain = fit_body(LengthSummaries.from_frame(_rows(6, steps=4), "response", "n", 4000.0, SPELLINGS), multi_turn=True)
    assert plain.shape.family == "logistic"
    assert plain.body()["family"] == "fisk" and "skew" not in plain.body()


def test_origins_share_their_prefix_fits():
    """A fidelity check's origin k chooses on the prefixes ending at k-1..k-3, which the origins
    before it fitted whole: with the fits passed along, one new fit per origin, the same result."""
    summ = conform_summaries(_rows(8, steps=6, n=128))
    fits: dict = {}
    fit_summaries_selected(summ.filter(pl.col("step") <= 4), fits, run_id="r", max_response_length=4000.0)
    assert sorted(len(k[0]) for k in fits) == [2, 3, 4, 5]
    shared = fit_summaries_selected(summ, fits, run_id="r", max_response_length=4000.0)
    assert sorted(len(k[0]) for k in fits) == [2, 3, 4, 5, 6]
    alone = fit_summaries_selected(summ, run_id="r", max_response_length=4000.0)
    assert json.dumps(shared, sort_keys=True) == json.dumps(alone, sort_keys=True)


def test_newton_reaches_at_least_the_nelder_mead_optimum_of_the_weights():
    """The weights' likelihood at fixed scale and levels is a sum of logs of affine functions of
    them (weight_terms equals loglik_rows up to a constant); its projected-Newton maximum is never
    below what Nelder-Mead (the optimiser it replaced) finds, within 1e-9."""
    for df, cap in ((_rows(11, s=0.3), 4000.0), (_rows(12, cap=700.0), 700.0)):
        _newton_against_nelder_mead(LengthSummaries.from_frame(df, "response", "n", cap, SPELLINGS))


def _newton_against_nelder_mead(d: LengthSummaries) -> None:
    r = _Rows(d)
    sh = StepShape("glogistic", 0.3, 1e-4, 1e-4, 6.0, 3.0, 2.0)
    mu = np.log(d.mean) - 0.05
    parts = row_parts(sh, r, mu)
    terms = weight_terms(sh, r, parts)

    def neg(le: np.ndarray) -> float:
        le = np.clip(le, *LOG_EPS)
        return -float(np.sum(loglik_rows(replace(sh, eps_lo=math.exp(le[0]), eps_hi=math.exp(le[1])), r, mu, parts)))

    c, b, p, q = terms
    const = [neg(le) + float(np.sum(c * np.log(b + np.exp(le[0]) * p + np.exp(le[1]) * q)))
             for le in (np.log([1e-6, 1e-3]), np.log([0.02, 1e-7]))]
    assert const[0] == pytest.approx(const[1], rel=1e-9)
    start = np.full(2, math.log(1e-4))
    nm = optimize.minimize(neg, start, method="Nelder-Mead", options={"xatol": 0.05, "fatol": 1e-3, "maxiter": 60})
    assert neg(max_weights(terms, start)) <= nm.fun + 1e-9
