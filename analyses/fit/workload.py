"""Fit one run x task workload from warehouse-shaped frames into a spec entry (a plain dict).

Input frames have the columns of :mod:`analyses.schema` (``samples`` at least; ``turns``,
``tool_calls`` and ``rank_times`` when the run has them). Validation samples are left out:
they are not part of the training workload.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from analyses.fit.continuous import ContinuousFit, fit_continuous, infer_cap, json_safe
from analyses.fit.discrete import CategoricalFit, DiscreteFit, fit_categorical, fit_discrete, is_categorical
from analyses.fit.drift import DriftModel, fit_drift
from analyses.fit.empirical import EmpiricalTailFit, fit_empirical_tail
from analyses.fit.joint import (
    GaussianMixture,
    GroupCopula,
    fit_gmm_bic,
    fit_group_copula,
    joint_distance,
)
from analyses.fit.tails import BodyTailFit, fit_body_tail
from analyses.schema import TOOL_OK_STATUSES

Marginal = ContinuousFit | DiscreteFit | CategoricalFit | BodyTailFit | EmpiricalTailFit
RESPONSE_MODELS = ("parametric", "empirical_tail")
MIN_TAIL_N = 200  # below this, a GPD tail is not identifiable: fit the body family alone


def marginal(d: dict[str, Any]) -> Marginal:
    """The fitted-distribution object for a spec variable (anything with ``ppf(u)``)."""
    kind = d["kind"]
    if kind == "continuous":
        return ContinuousFit.from_dict(d)
    if kind == "discrete":
        return DiscreteFit.from_dict(d)
    if kind == "categorical":
        return CategoricalFit.from_dict(d)
    if kind == "body_tail":
        return BodyTailFit.from_dict(d)
    if kind == "empirical_tail":
        return EmpiricalTailFit.from_dict(d)
    raise ValueError(f"unknown variable kind {kind!r}")


def training_samples(samples: pl.DataFrame) -> pl.DataFrame:
    """Non-validation samples with lengths, and an integer group code per (step, prompt)."""
    s = samples.filter(pl.col("validate").fill_null(False).not_() & pl.col("response_tokens").is_not_null())
    grp = pl.coalesce(pl.col("group_id"), pl.col("sample_id"), pl.int_range(pl.len()).cast(pl.String))
    return s.with_columns(_g=pl.concat_str([pl.col("step").cast(pl.String), grp], separator="|")).with_columns(
        group=pl.col("_g").rank("dense").cast(pl.Int64) - 1
    ).drop("_g")


def batch_shape(s: pl.DataFrame) -> dict[str, Any]:
    """Prompts per step, samples per prompt, DP ranks and the rank of each (mode over steps)."""
    per_step = s.group_by("step").agg(prompts=pl.col("group").n_unique(), samples=pl.len())
    prompts = int(per_step["prompts"].mode().sort()[-1])
    per_group = s.group_by("group").len()["len"]
    n = int(per_group.mode().sort()[-1])
    dp = s.filter(pl.col("dp_rank").is_not_null()).group_by("dp_rank").agg(rank=pl.col("rank").min()).sort("dp_rank")
    dps = [int(v) for v in dp["dp_rank"]] or [0]
    ranks = [int(v) if v is not None else i for i, v in enumerate(dp["rank"])] if dp.height else [0]
    tp = int(ranks[1] - ranks[0]) if len(ranks) > 1 and ranks[1] > ranks[0] else 1
    steps = sorted(int(v) for v in per_step["step"])
    return {
        "prompts_per_step": prompts,
        "samples_per_prompt": n,
        "dp_ranks": dps,
        "rank_of_dp": ranks,
        "tp_size": tp,
        "has_ranks": bool(dp.height),
        "first_step": steps[0],
        "last_step": steps[-1],
        "n_steps": len(steps),
    }


def _fit_length(x: np.ndarray, cap: float | None, seed: int) -> dict[str, Any]:
    if is_categorical(x):
        d = fit_categorical(x).to_dict()
        if np.unique(x).size > 1:
            # a plain scipy family too, for consumers that only read scipy marginals (PolyTrace params)
            d["scipy_fallback"] = fit_continuous(x, censor_at=cap, seed=seed, integer=True,
                                                 families=("lognorm", "gamma", "weibull_min")).to_dict()
        return d
    return fit_continuous(x, censor_at=cap, seed=seed, integer=True).to_dict()


def _fit_latency(x: np.ndarray, seed: int) -> dict[str, Any]:
    x = x[np.isfinite(x) & (x > 0)]
    if x.size >= MIN_TAIL_N:
        try:
            return fit_body_tail(x, seed=seed).to_dict()
        except ValueError:
            pass
    return fit_continuous(x, seed=seed, integer=False, lower=0.0).to_dict()


def fit_response(
    steps: np.ndarray,
    resp: np.ndarray,
    cap: float | None,
    *,
    multi: bool = False,
    seed: int = 0,
    response_model: str = "parametric",
    response_steps: list[int] | None = None,
    response_tail_limit: float = 2.0,
) -> tuple[dict[str, Any], DriftModel]:
    """The response-length variable and its drift (see :func:`fit_workload` for the options)."""
    win = np.isin(steps, response_steps) if response_steps else np.ones(steps.size, bool)
    if not win.any():
        raise ValueError(f"no samples in the response window {response_steps}")
    steps_w, resp_w = steps[win], resp[win]
    drift = fit_drift(steps_w, resp_w) if not multi else DriftModel("none", 0.0, 0.0, 0.0, int(steps.min()), int(steps.max()), 0.0)
    if response_model == "empirical_tail":
        # de-trended like the parametric fit; values at the cap are the cap mass whatever the step
        f = np.exp(drift.log_factor(steps_w)) if drift.kind != "none" else np.ones(resp_w.size)
        at_cap = resp_w >= cap if cap is not None else np.zeros(resp_w.size, bool)
        rvar = fit_empirical_tail(np.where(at_cap, resp_w, resp_w / f), cap, tail_limit=response_tail_limit).to_dict()
    elif drift.kind != "none":
        # fit the shape on de-trended lengths; values at the cap become individual lower bounds
        f = np.exp(drift.log_factor(steps_w))
        cens = resp_w >= cap if cap is not None else np.zeros(resp_w.size, bool)
        rvar = fit_continuous(np.minimum(resp_w, cap or np.inf) / f, censor_at=cap, censored=cens, seed=seed, integer=True,
                              lower=1.0).to_dict()
    else:
        rvar = _fit_length(resp_w, cap, seed)
    rvar["censor_at"] = cap
    return rvar, drift


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
    select_joint: bool = True,
    response_model: str = "parametric",
    response_steps: list[int] | None = None,
    response_tail_limit: float = 2.0,
    raw_joint: bool = True,
    by_turns: bool = False,
) -> dict[str, Any]:
    """The spec entry for one run x task.

    ``response_model``: ``parametric`` (censored MLE families, AIC) or ``empirical_tail``
    (:mod:`analyses.fit.empirical`). ``response_steps``: fit the response marginal and its drift
    on these steps only (a recent window); everything else uses every step.
    ``response_tail_limit``: for ``empirical_tail`` with no cap known, the GPD tail is truncated
    at this multiple of the largest value seen. ``raw_joint``: also fit PolyTrace's raw-token
    mixture (only the params export reads it; validation fits skip it). ``by_turns`` (multi-turn):
    also fit turn completions and tool results per trajectory turn count (:func:`fit_by_turns`).
    """
    if response_model not in RESPONSE_MODELS:
        raise ValueError(f"response_model must be one of {RESPONSE_MODELS}, got {response_model!r}")
    s = training_samples(samples)
    if s.height < 2:
        raise ValueError(f"{run_id}: fewer than 2 training samples")
    multi = bool(s["n_turns"].drop_nulls().len() and (s["n_turns"].fill_null(1) > 1).any())
    batch = batch_shape(s)
    batch["multi_turn"] = multi
    resp = s["response_tokens"].cast(pl.Float64).to_numpy()
    trunc = s["truncated"].to_numpy() if s["truncated"].null_count() < s.height else None
    cap = infer_cap(resp, max_response_length, trunc)
    groups = s["group"].to_numpy()
    steps = s["step"].to_numpy()
    prompt = s["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy()
    first = s.unique("group", keep="first", maintain_order=True)
    variables: dict[str, Any] = {}
    variables["prompt_tokens"] = _fit_length(first["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy(), None, seed)

    rvar, drift = fit_response(steps, resp, cap, multi=multi, seed=seed, response_model=response_model,
                               response_steps=response_steps, response_tail_limit=response_tail_limit)
    variables["response_tokens"] = rvar

    if multi:
        variables.update(_fit_multiturn(s, turns, tool_calls, cap, seed))
        if by_turns:
            variables.update(fit_by_turns(s, turns, tool_calls))

    if rank_times is not None and rank_times.height:
        rw = rank_times.filter((pl.col("phase") == "reward") & (pl.col("seconds") > 0) & (pl.col("n_samples") > 0))
        if rw.height >= 2:
            per = (rw["seconds"] / rw["n_samples"]).to_numpy()
            variables["reward_time_per_sample_s"] = fit_continuous(per, seed=seed, integer=False, lower=0.0).to_dict()

    copula = fit_group_copula(prompt, resp, groups)
    joint: dict[str, Any] = {"selected": "gaussian_copula", "gaussian_copula": copula.to_dict()}
    if select_joint and not multi and response_model == "parametric" and response_steps is None:
        joint.update(_select_joint(s, variables, cap, seed))
    if raw_joint:
        joint.update(_raw_joint(prompt, resp, seed))

    return json_safe(
        {
            "run_id": run_id,
            "task": task or "unknown",
            "n_samples": int(s.height),
            "steps_fitted": sorted(int(v) for v in s["step"].unique()),
            "batch": batch,
            "variables": variables,
            "joint": joint,
            "drift": drift.to_dict(),
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


def _fit_multiturn(s: pl.DataFrame, turns: pl.DataFrame | None, tool_calls: pl.DataFrame | None, cap: float | None, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["n_turns"] = fit_discrete(s["n_turns"].fill_null(1).to_numpy()).to_dict()
    out["n_tool_calls"] = fit_discrete(s["n_tool_calls"].fill_null(0).to_numpy()).to_dict()
    ids = s.select("step", "sample_id")
    if turns is not None and turns.height:
        t = turns.join(ids, on=["step", "sample_id"], how="semi")
        comp = t["completion_tokens"].drop_nulls().cast(pl.Float64).to_numpy()
        if comp.size >= 2:
            out["turn_completion_tokens"] = fit_continuous(comp, censor_at=infer_cap(comp, None), seed=seed, integer=True, lower=1.0).to_dict()
        lat = t["engine_latency_s"].drop_nulls().to_numpy()
        if lat.size >= 2:
            out["engine_latency_s"] = fit_continuous(lat[lat > 0], seed=seed, integer=False, lower=0.0).to_dict()
    if tool_calls is not None and tool_calls.height:
        tc = tool_calls.join(ids, on=["step", "sample_id"], how="semi")
        # calls per non-final turn: a turn that ends in a tool call makes >= 1 call
        per_turn = tc.group_by("step", "sample_id", "turn").len()["len"].to_numpy()
        if per_turn.size:
            out["tool_calls_per_turn"] = fit_discrete(per_turn).to_dict()
        tools: dict[str, Any] = {}
        total = tc.height
        for name, g in tc.group_by("tool_name", maintain_order=True):
            tname = str(name[0]) if name[0] is not None else "tool"
            lat = g["latency_s"].drop_nulls().to_numpy()
            entry: dict[str, Any] = {"share": g.height / total, "n": g.height}
            if lat.size >= 2:
                entry["latency_s"] = _fit_latency(lat, seed)
            rt = g["response_tokens"].drop_nulls().cast(pl.Float64).to_numpy()
            if rt.size >= 2:
                entry["response_tokens"] = fit_continuous(rt, seed=seed, integer=True, lower=0.0).to_dict()
            ok = g["status"].drop_nulls()
            # the tool_latency view's definition: a known status that is not a success one
            entry["failure_rate"] = float((~ok.str.to_lowercase().is_in(TOOL_OK_STATUSES)).mean()) if ok.len() else 0.0
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
    return out


MIN_BY_TURNS = 30  # observations below which a turn count uses the pooled fit


def fit_by_turns(s: pl.DataFrame, turns: pl.DataFrame | None, tool_calls: pl.DataFrame | None) -> dict[str, Any]:
    """Turn completions and tool results conditional on the trajectory's turn count.

    Why: pooled over trajectories, a turn's completion and a tool's result do not depend on how
    many turns the trajectory has, but in real agent runs they do (Search-R1: the answer turn
    completes ~110 tokens, a tool-calling turn ~50-100; a 2-turn trajectory's search results are
    longer than a 4-turn one's), so the pooled composition gets the response per turn count wrong.
    Each piece is an :class:`~analyses.fit.empirical.EmpiricalTailFit` with no extrapolation
    beyond the largest value seen (tail_limit 1): ``completion_by_turns[<n>]`` has ``tool_turn``
    (turns that call a tool) and ``final`` (the last turn); ``tool_response_by_turns[<tool>][<n>]``
    the tool's result tokens. A turn count with fewer than ``MIN_BY_TURNS`` observations is left
    out (the sampler uses the pooled fit for it).
    """
    out: dict[str, Any] = {}
    nt = s.select("step", "sample_id", "n_turns")

    def emp(x: np.ndarray) -> dict[str, Any] | None:
        x = x[np.isfinite(x)]
        if x.size < MIN_BY_TURNS or np.unique(x).size < 2:
            return None
        return fit_empirical_tail(x, None, lower=0.0, tail_limit=1.0).to_dict()

    if turns is not None and turns.height:
        t = turns.join(nt, on=["step", "sample_id"]).filter(pl.col("completion_tokens").is_not_null())
        t = t.with_columns(final=pl.col("turn") == pl.col("n_turns") - 1)
        comp: dict[str, Any] = {}
        for (n, final), g in t.group_by("n_turns", "final"):
            f = emp(g["completion_tokens"].cast(pl.Float64).to_numpy())
            if f is not None:
                comp.setdefault(str(int(n)), {})["final" if final else "tool_turn"] = f
        if comp:
            out["completion_by_turns"] = dict(sorted(comp.items(), key=lambda kv: int(kv[0])))
    if tool_calls is not None and tool_calls.height:
        c = tool_calls.join(nt, on=["step", "sample_id"]).filter(pl.col("response_tokens").is_not_null())
        res: dict[str, Any] = {}
        for (name, n), g in c.group_by("tool_name", "n_turns"):
            f = emp(g["response_tokens"].cast(pl.Float64).to_numpy())
            if f is not None:
                res.setdefault(str(name) if name is not None else "tool", {})[str(int(n))] = f
        if res:
            out["tool_response_by_turns"] = {k: dict(sorted(v.items(), key=lambda kv: int(kv[0]))) for k, v in sorted(res.items())}
    return out


def _select_joint(s: pl.DataFrame, variables: dict[str, Any], cap: float | None, seed: int) -> dict[str, Any]:
    """Copula vs mixture on held-out prompt groups (every other group held out)."""
    ng = int(s["group"].max()) + 1
    if ng < 8:
        return {}
    fit_s = s.filter(pl.col("group") % 2 == 0)
    hold = s.filter(pl.col("group") % 2 == 1)
    rng = np.random.default_rng(seed)
    fp = fit_s["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy()
    fr = fit_s["response_tokens"].cast(pl.Float64).to_numpy()
    fg = fit_s["group"].to_numpy()
    hp = hold["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy()
    hr = hold["response_tokens"].cast(pl.Float64).to_numpy()
    hg = hold["group"].to_numpy()
    n_per = int(hold.group_by("group").len()["len"].mode().sort()[-1])
    n_groups = max(int(np.unique(hg).size), 1)
    # copula over marginals fitted on the fit half
    first = fit_s.unique("group", keep="first", maintain_order=True)
    mp = marginal(_fit_length(first["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy(), None, seed))
    mr = marginal(_fit_length(fr, cap, seed))
    cop = fit_group_copula(fp, fr, fg)
    up, ur = cop.latents(rng, n_groups, n_per)
    cp = np.repeat(mp.ppf(up), n_per)
    cr = mr.ppf(ur.ravel())
    cg = np.repeat(np.arange(n_groups), n_per)
    scores = {"gaussian_copula": joint_distance(cp, cr, cg, hp, hr, hg)}
    out: dict[str, Any] = {}
    try:
        gm = fit_gmm_bic(np.column_stack([np.log(np.maximum(fp, 1)), np.log(np.maximum(fr, 1))]), seed=seed)
        g = gm.sample(rng, n_groups * n_per)
        gp, gr = np.exp(g[:, 0]), np.exp(g[:, 1])
        if cap is not None:
            gr = np.minimum(gr, cap)
        scores["gaussian_mixture"] = joint_distance(np.rint(gp), np.rint(gr), cg, hp, hr, hg)
        # the mixture used for generation is refitted on all training samples
        full = fit_gmm_bic(
            np.column_stack([np.log(np.maximum(s["prompt_tokens"].cast(pl.Float64).fill_null(1).to_numpy(), 1)),
                             np.log(np.maximum(s["response_tokens"].cast(pl.Float64).to_numpy(), 1))]),
            seed=seed,
        )
        out["gaussian_mixture"] = full.to_dict()
    except (ValueError, np.linalg.LinAlgError):
        pass
    out["selection"] = scores
    out["selected"] = min(scores, key=lambda k: scores[k]["score"])
    return out


__all__ = ["fit_workload", "marginal", "training_samples", "batch_shape", "GroupCopula", "GaussianMixture"]
