"""Fit one run x task workload from warehouse-shaped frames into a spec entry (a plain dict).

Input frames have the columns of :mod:`analyses.schema` (``samples`` at least; ``turns``,
``tool_calls`` and ``rank_times`` when the run has them). Validation samples are left out:
they are not part of the training workload.

The generator's pieces, each chosen to reproduce what real steps look like:

* **sample shape** -- every length and latency is an
  :class:`~analyses.fit.empirical.EmpiricalTailFit` (the data's own body, a censored GPD tail;
  prompts and atoms-only variables keep the data's own values), so the generated samples have
  the recorded distribution's shape, as PolyTrace's histogram resampler has by construction;
* **step-to-step level** -- :mod:`analyses.fit.drift`: a shrunk trend, a step-level random effect
  and the level's own uncertainty, estimated from the training steps; the response marginal is
  fitted to de-levelled lengths so that variation is not counted twice;
* **within a step** -- the group copula (:mod:`analyses.fit.joint`): the responses of one prompt
  are alike, and a prompt's length goes with its responses';
* **multi-turn** -- turns, tool calls per turn, completions, tool results and latencies, tool
  failures with their status; the trajectory's turn count follows the group latent.

``for_export`` adds what only the exports read: plain scipy families beside empirical marginals
(PolyTrace's parameter file samples scipy families) and PolyTrace's raw-token Gaussian mixture.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from analyses.fit.continuous import fit_continuous, infer_cap, json_safe
from analyses.fit.data import batch_shape, full_and_partial_steps, is_multi_turn, training_samples
from analyses.fit.discrete import fit_categorical, fit_discrete, is_categorical
from analyses.fit.drift import DriftModel, fit_drift
from analyses.fit.empirical import (
    TRIM,
    EmpiricalTailFit,
    fit_empirical_tail,
    heavy_chain,
    heavy_step_share,
    heavy_steps,
    step_maxima,
    tail_scale_sd,
)
from analyses.fit.joint import GaussianMixture, GroupCopula, fit_gmm_bic, fit_group_copula
from analyses.schema import TOOL_OK_STATUSES

WINDOWS = ("all", "recent")
FALLBACK_FAMILIES = ("lognorm", "gamma", "weibull_min")


def recent_window(steps: list[int]) -> list[int]:
    """The later half of the steps (at least 2, rounded up)."""
    k = max(2, (len(steps) + 1) // 2)
    return list(steps[-k:])


def _fallback(x: np.ndarray, cap: float | None, seed: int, integer: bool) -> dict[str, Any]:
    """A plain scipy family for consumers that only read those (PolyTrace's parameter file)."""
    return fit_continuous(x, censor_at=cap, seed=seed, integer=integer, families=FALLBACK_FAMILIES).to_dict()


def fit_values(x: np.ndarray, *, cap: float | None = None, integer: bool = True, lower: float = 1.0, tail: bool = True,
               trim: float = TRIM, for_export: bool = False, seed: int = 0) -> dict[str, Any]:
    """A variable's marginal: atoms when it takes few values, else the empirical body with a
    censored GPD tail (``tail=False``: the data's own range, no extrapolation)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        raise ValueError(f"need at least 2 values to fit, got {x.size}")
    if is_categorical(x):
        d = fit_categorical(x).to_dict()
    else:
        d = fit_empirical_tail(x, cap, integer=integer, lower=lower, tail_prob=None if tail else 0.0, trim=trim).to_dict()
    if for_export and np.unique(x).size > 1 and np.any(x > 0):
        d["scipy_fallback"] = _fallback(np.maximum(x, 1e-9) if not integer else x, cap, seed, integer)
    return d


def fit_response(steps: np.ndarray, groups: np.ndarray, resp: np.ndarray, cap: float | None, *,
                 window: str = "all", trim: float = TRIM, heavy: bool = True, step_tails: bool = True,
                 for_export: bool = False, seed: int = 0) -> tuple[dict[str, Any], DriftModel, dict[int, float]]:
    """The response-length variable, its level model and each step's latent log offset.

    The marginal is fitted to lengths divided by their step's offset (the step's level relative
    to the model's reference): a cut response says "at least cap / offset" there.
    ``window="recent"``: the later half of the steps only (for workloads whose shape moves).
    Multi-turn responses are composed from turns by the sampler: their marginal is a record, and
    the level scales the turn completions and tool results (``step_tails=False``: no step-to-step
    tail model, :func:`fit_step_tails`).
    """
    uniq = sorted(int(v) for v in np.unique(steps))
    keep = np.isin(steps, recent_window(uniq)) if window == "recent" else np.ones(steps.size, bool)
    st, gr, r = steps[keep], groups[keep], resp[keep]
    drift, offsets = fit_drift(st, r, gr, cap)
    off = np.exp(np.array([offsets.get(int(k), 0.0) for k in st])) if offsets else np.ones(r.size)
    cens = r >= cap if cap is not None else np.zeros(r.size, bool)
    m = fit_empirical_tail(r / off, cap, censored=cens, trim=trim)
    if step_tails and trim > 0 and m.extremes:
        fit_step_tails(m, st, r / off, cens, heavy)
    d = m.to_dict()
    if for_export:
        d["scipy_fallback"] = _fallback(r, cap, seed, True)
    return d, drift, offsets


def fit_step_tails(m: EmpiricalTailFit, steps: np.ndarray, x: np.ndarray, censored: np.ndarray, heavy: bool) -> None:
    """How the tail of ``m`` (fitted to the de-levelled lengths ``x``) differs from step to step,
    set on ``m``: the quiet steps' tail-scale effect (:func:`~analyses.fit.empirical.tail_scale_sd`),
    and with ``heavy`` the heavy steps (their share and persistence,
    :func:`~analyses.fit.empirical.heavy_chain`). Heavy steps are told by the *untrimmed* fit."""
    untrimmed = fit_empirical_tail(x, m.censor_at, censored=censored, trim=0.0)
    ks, flags = heavy_steps(untrimmed, steps, x, censored)
    _, n_k, top = step_maxima(steps, x, censored)
    m.tail_sd = tail_scale_sd(m, n_k, top, ~flags)
    if heavy:
        m.heavy_prob = heavy_step_share(untrimmed, steps, x, censored)
        m.heavy_persistence, m.heavy_last, m.last_step = heavy_chain(flags), bool(flags[-1]), int(ks[-1])


def fit_workload(
    samples: pl.DataFrame,
    *,
    turns: pl.DataFrame | None = None,
    tool_calls: pl.DataFrame | None = None,
    rank_times: pl.DataFrame | None = None,
    run_id: str = "run",
    task: str | None = None,
    max_response_length: float | None = None,
    seed: int = 0,
    window: str = "all",
    trim: float = TRIM,
    heavy: bool = True,
    by_turns: bool = False,
    for_export: bool = True,
) -> dict[str, Any]:
    """The spec entry for one run x task.

    ``window``: fit the response marginal and its level on ``all`` steps or the ``recent`` half.
    ``trim``: the share of the largest tail exceedances that enter the GPD fit only as "at
    least this large" (bounded influence of a few runaway responses, :mod:`analyses.fit.empirical`).
    ``by_turns`` (multi-turn): also fit turn completions and tool results per trajectory turn
    count (:func:`fit_by_turns`). ``for_export``: add the scipy fallbacks and the raw-token
    mixture only the exports read (selection and fidelity fits skip them).
    """
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, got {window!r}")
    s = training_samples(samples)
    full, partial = full_and_partial_steps(s)
    s = s.filter(pl.col("step").is_in(full))
    if s.height < 2:
        raise ValueError(f"{run_id}: fewer than 2 training samples")
    multi = is_multi_turn(s)
    batch = batch_shape(s)
    batch["multi_turn"] = multi
    resp = s["response_tokens"].cast(pl.Float64).to_numpy()
    trunc = s["truncated"].to_numpy() if s["truncated"].null_count() < s.height else None
    cap = infer_cap(resp, max_response_length, trunc)
    groups = s["group"].to_numpy()
    steps = s["step"].to_numpy()
    first = s.unique("group", keep="first", maintain_order=True)
    variables: dict[str, Any] = {}
    prompt_first = first["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy()
    variables["prompt_tokens"] = fit_values(prompt_first, tail=False, for_export=for_export, seed=seed)

    rvar, drift, offsets = fit_response(steps, groups, resp, cap, window=window, trim=trim, heavy=heavy, step_tails=not multi,
                                        for_export=for_export, seed=seed)
    rvar["censor_at"] = cap
    variables["response_tokens"] = rvar

    extra: dict[str, Any] = {}
    if multi:
        mt, lat_drift = _fit_multiturn(s, turns, tool_calls, cap, trim, offsets)
        variables.update(mt)
        if by_turns:
            variables.update(fit_by_turns(s, turns, tool_calls, offsets))
        if lat_drift is not None:
            extra["tool_latency_drift"] = lat_drift.to_dict()

    if rank_times is not None and rank_times.height:
        rw = rank_times.filter((pl.col("phase") == "reward") & (pl.col("seconds") > 0) & (pl.col("n_samples") > 0))
        if rw.height >= 2:
            per = (rw["seconds"] / rw["n_samples"]).to_numpy()
            variables["reward_time_per_sample_s"] = fit_values(per, integer=False, lower=0.0, tail=False, trim=0.0)

    # the copula sees de-levelled responses: within-step dependence, not step-to-step level
    delev = resp / np.exp(np.array([offsets.get(int(k), 0.0) for k in steps])) if offsets else resp
    prompt = s["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy()
    copula = fit_group_copula(prompt, delev, groups)
    joint: dict[str, Any] = {"selected": "gaussian_copula", "gaussian_copula": copula.to_dict()}
    if for_export:
        joint.update(_raw_joint(prompt, resp, seed))

    return json_safe(
        {
            "run_id": run_id,
            "task": task or "unknown",
            "n_samples": int(s.height),
            "steps_fitted": sorted(int(v) for v in s["step"].unique()),
            **({"steps_excluded": partial} if partial else {}),
            "batch": batch,
            "variables": variables,
            "joint": joint,
            "drift": drift.to_dict(),
            **extra,
        }
    )


def _raw_joint(prompt: np.ndarray, resp: np.ndarray, seed: int) -> dict[str, Any]:
    """PolyTrace's own joint: a mixture in raw token space, for the params export."""
    try:
        raw = fit_gmm_bic(np.column_stack([prompt, resp]), seed=seed, space="raw")
    except (ValueError, np.linalg.LinAlgError):
        return {}
    raw_d = raw.to_dict()
    raw_d["correlation"] = float(np.corrcoef(prompt, resp)[0, 1]) if np.std(prompt) > 0 and np.std(resp) > 0 else 0.0
    raw_d["mean_vector"] = [float(prompt.mean()), float(resp.mean())]
    raw_d["covariance_matrix"] = np.cov(np.column_stack([prompt, resp]).T).tolist()
    return {"raw_gaussian_mixture": raw_d}


def failure_statuses(status: pl.Series) -> tuple[float, dict[str, float]]:
    """(failure rate, share of each failure status among failures): a failure is a known status
    that is not a success one (the ``tool_latency`` view's definition)."""
    st = status.drop_nulls()
    if not st.len():
        return 0.0, {}
    failed = st.filter(~st.str.to_lowercase().is_in(TOOL_OK_STATUSES))
    if not failed.len():
        return 0.0, {}
    counts = failed.value_counts(sort=True)
    shares = {str(v): int(c) / failed.len() for v, c in zip(counts[failed.name], counts["count"], strict=True)}
    return failed.len() / st.len(), dict(sorted(shares.items()))


def delevel(df: pl.DataFrame, col: str, offsets: dict[int, float]) -> np.ndarray:
    """``df[col]`` divided by the level factor of each row's step (nulls dropped)."""
    d = df.filter(pl.col(col).is_not_null())
    x = d[col].cast(pl.Float64).to_numpy()
    if not offsets:
        return x
    return x / np.exp(np.array([offsets.get(int(k), 0.0) for k in d["step"]]))


def _fit_multiturn(s: pl.DataFrame, turns: pl.DataFrame | None, tool_calls: pl.DataFrame | None, cap: float | None,
                   trim: float, offsets: dict[int, float]) -> tuple[dict[str, Any], DriftModel | None]:
    """The multi-turn pieces (completions and tool results de-levelled by the response level's
    step offsets) and the level model of tool latency (its own step effect: a tool server's
    latency moves with its load, not with the policy)."""
    out: dict[str, Any] = {}
    lat_drift = None
    out["n_turns"] = fit_discrete(s["n_turns"].fill_null(1).to_numpy()).to_dict()
    out["n_tool_calls"] = fit_discrete(s["n_tool_calls"].fill_null(0).to_numpy()).to_dict()
    ids = s.select("step", "sample_id")
    if turns is not None and turns.height:
        t = turns.join(ids, on=["step", "sample_id"], how="semi")
        comp = delevel(t, "completion_tokens", offsets)
        if comp.size >= 2:
            out["turn_completion_tokens"] = fit_values(comp, cap=infer_cap(comp, None), trim=trim)
        lat = t["engine_latency_s"].drop_nulls().to_numpy()
        lat = lat[lat > 0]
        if lat.size >= 2:
            out["engine_latency_s"] = fit_values(lat, integer=False, lower=0.0, trim=trim)
    if tool_calls is not None and tool_calls.height:
        tc = tool_calls.join(s.select("step", "sample_id", "group"), on=["step", "sample_id"])
        lat_all = tc.filter(pl.col("latency_s").is_not_null() & (pl.col("latency_s") > 0))
        lat_offsets: dict[int, float] = {}
        if lat_all.height >= 2:
            lat_drift, lat_offsets = fit_drift(lat_all["step"].to_numpy(), lat_all["latency_s"].to_numpy(),
                                               lat_all["group"].to_numpy())
        # calls per non-final turn: a turn that ends in a tool call makes >= 1 call
        per_turn = tc.group_by("step", "sample_id", "turn").len()["len"].to_numpy()
        if per_turn.size:
            out["tool_calls_per_turn"] = fit_discrete(per_turn).to_dict()
        tools: dict[str, Any] = {}
        total = tc.height
        for name, g in tc.group_by("tool_name", maintain_order=True):
            tname = str(name[0]) if name[0] is not None else "tool"
            lat = delevel(g.filter(pl.col("latency_s") > 0), "latency_s", lat_offsets)
            lat = lat[np.isfinite(lat)]
            entry: dict[str, Any] = {"share": g.height / total, "n": g.height}
            if lat.size >= 2:
                entry["latency_s"] = fit_values(lat, integer=False, lower=0.0, trim=trim)
            rt = delevel(g, "response_tokens", offsets)
            if rt.size >= 2:
                entry["response_tokens"] = fit_values(rt, lower=0.0, trim=trim)
            entry["failure_rate"], entry["failure_statuses"] = failure_statuses(g["status"])
            tools[tname] = entry
        out["tools"] = tools
        # tokens a tool call adds to the trajectory beyond its response (templates, tags)
        if turns is not None and turns.height:
            comp_sum = turns.group_by("step", "sample_id").agg(c=pl.col("completion_tokens").sum())
            tool_sum = tc.group_by("step", "sample_id").agg(t=pl.col("response_tokens").sum(), k=pl.len())
            j = s.join(comp_sum, on=["step", "sample_id"]).join(tool_sum, on=["step", "sample_id"], how="left").filter(
                pl.col("k").fill_null(0) > 0
            )
            if cap is not None:
                j = j.filter(pl.col("response_tokens") < cap)
            if j.height:
                extra = (j["response_tokens"] - j["c"] - j["t"].fill_null(0)).sum() / j["k"].sum()
                out["tool_overhead_tokens"] = {"kind": "constant", "value": float(max(extra, 0.0))}
    return out, lat_drift


MIN_BY_TURNS = 30  # observations below which a turn count uses the pooled fit


def fit_by_turns(s: pl.DataFrame, turns: pl.DataFrame | None, tool_calls: pl.DataFrame | None,
                 offsets: dict[int, float] | None = None) -> dict[str, Any]:
    """Turn completions and tool results conditional on the trajectory's turn count.

    Why: pooled over trajectories, a turn's completion and a tool's result do not depend on how
    many turns the trajectory has, but in real agent runs they do (Search-R1: the answer turn
    completes ~110 tokens, a tool-calling turn ~50-100; a 2-turn trajectory's search results are
    longer than a 4-turn one's), so the pooled composition gets the response per turn count wrong.
    Each piece is an :class:`~analyses.fit.empirical.EmpiricalTailFit` with no extrapolation
    beyond the data's range: ``completion_by_turns[<n>]`` has ``tool_turn`` (turns that call a
    tool) and ``final`` (the last turn); ``tool_response_by_turns[<tool>][<n>]`` the tool's result
    tokens. A turn count with fewer than ``MIN_BY_TURNS`` observations is left out (the sampler
    uses the pooled fit for it).
    """
    out: dict[str, Any] = {}
    nt = s.select("step", "sample_id", "n_turns")
    offsets = offsets or {}

    def emp(x: np.ndarray) -> dict[str, Any] | None:
        x = x[np.isfinite(x)]
        if x.size < MIN_BY_TURNS or np.unique(x).size < 2:
            return None
        return fit_empirical_tail(x, None, lower=0.0, tail_prob=0.0).to_dict()

    if turns is not None and turns.height:
        t = turns.join(nt, on=["step", "sample_id"]).filter(pl.col("completion_tokens").is_not_null())
        t = t.with_columns(final=pl.col("turn") == pl.col("n_turns") - 1)
        comp: dict[str, Any] = {}
        for (n, final), g in t.group_by("n_turns", "final"):
            f = emp(delevel(g, "completion_tokens", offsets))
            if f is not None:
                comp.setdefault(str(int(n)), {})["final" if final else "tool_turn"] = f
        if comp:
            # sorted at both levels: group_by's order varies from run to run, and a spec's bytes must not
            out["completion_by_turns"] = {k: dict(sorted(v.items())) for k, v in sorted(comp.items(), key=lambda kv: int(kv[0]))}
    if tool_calls is not None and tool_calls.height:
        c = tool_calls.join(nt, on=["step", "sample_id"]).filter(pl.col("response_tokens").is_not_null())
        res: dict[str, Any] = {}
        for (name, n), g in c.group_by("tool_name", "n_turns"):
            f = emp(delevel(g, "response_tokens", offsets))
            if f is not None:
                res.setdefault(str(name) if name is not None else "tool", {})[str(int(n))] = f
        if res:
            out["tool_response_by_turns"] = {k: dict(sorted(v.items(), key=lambda kv: int(kv[0]))) for k, v in sorted(res.items())}
    return out


__all__ = ["fit_workload", "GroupCopula", "GaussianMixture"]
