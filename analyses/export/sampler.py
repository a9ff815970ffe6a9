"""The seeded sampler: regenerate a workload (per-step samples, turns, tool calls, reward
timings) from a spec entry.

Determinism: step ``k`` of workload ``w`` draws from ``SeedSequence([seed, crc32(w), k])``, so
a step's numbers depend only on (seed, workload, step) -- not on how many steps are asked for
or in what order -- and the same seed gives the same numbers on every machine (numpy's PCG64
stream is stable across platforms).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from analyses.fit.continuous import ContinuousFit, apply_bounds
from analyses.fit.drift import DriftModel
from analyses.fit.empirical import EmpiricalTailFit
from analyses.fit.joint import GaussianMixture, GroupCopula
from analyses.fit.workload import marginal


@dataclass
class Generated:
    """A generated workload, in warehouse-like frames (one row per sample / turn / call / rank)."""

    samples: pl.DataFrame
    turns: pl.DataFrame | None = None
    tool_calls: pl.DataFrame | None = None
    rewards: pl.DataFrame | None = None


def step_rng(seed: int, key: str, step: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(key.encode()), int(step)]))


def steps_for(workload: dict[str, Any], n_steps: int) -> list[int]:
    """``n_steps`` consecutive step indices starting at the run's first step."""
    first = int(workload["batch"].get("first_step", 0))
    return list(range(first, first + int(n_steps)))


def scaled_ppf(m: Any, u: np.ndarray, factor: float, cap: float | None = None) -> np.ndarray:
    if isinstance(m, ContinuousFit):
        return apply_bounds(m.dist().ppf(u) * factor, m.lower, m.censor_at, m.integer)
    if isinstance(m, EmpiricalTailFit):
        # the cap mass stays at the cap whatever the drift factor: only the uncensored part scales
        v = np.asarray(m.ppf(u), dtype=float)
        at_cap = u >= 1 - m.p_cap
        return apply_bounds(np.where(at_cap, v, v * factor), m.lower, m.censor_at, m.integer)
    v = np.rint(np.asarray(m.ppf(u), dtype=float) * factor)
    return np.minimum(v, cap) if cap is not None else v


def generate(workload: dict[str, Any], steps: Iterable[int], seed: int, key: str | None = None) -> Generated:
    """Generate the given steps of one workload."""
    key = key or f"{workload.get('run_id')}/{workload.get('task')}"
    parts = [_gen_step(workload, int(k), step_rng(seed, key, int(k))) for k in steps]
    samples = pl.concat([p[0] for p in parts]) if parts else pl.DataFrame()
    turns = pl.concat([p[1] for p in parts]) if parts and parts[0][1] is not None else None
    calls = pl.concat([p[2] for p in parts]) if parts and parts[0][2] is not None else None
    rewards = pl.concat([p[3] for p in parts]) if parts and parts[0][3] is not None else None
    return Generated(samples, turns, calls, rewards)


def _gen_step(w: dict[str, Any], step: int, rng: np.random.Generator) -> tuple[pl.DataFrame, pl.DataFrame | None, pl.DataFrame | None, pl.DataFrame | None]:
    b = w["batch"]
    G, n = int(b["prompts_per_step"]), int(b["samples_per_prompt"])
    v = w["variables"]
    mp, mr = marginal(v["prompt_tokens"]), marginal(v["response_tokens"])
    drift = DriftModel.from_dict(w.get("drift"))
    f = drift.factor(step)
    joint = w.get("joint") or {}
    sel = joint.get("selected", "gaussian_copula")
    if sel == "gaussian_mixture" and "gaussian_mixture" in joint:
        gm = GaussianMixture.from_dict(joint["gaussian_mixture"])
        x = gm.sample(rng, G * n)
        prompt = np.maximum(np.rint(np.exp(x[::n, 0])), 1.0)
        resp = np.exp(x[:, 1]) * f
        cap = v["response_tokens"].get("censor_at")
        resp = apply_bounds(resp, 1.0, cap, True)
    else:
        cop = GroupCopula.from_dict(joint.get("gaussian_copula") or {})
        up, ur = cop.latents(rng, G, n)
        prompt = np.maximum(np.rint(mp.ppf(up)), 1.0)
        resp = scaled_ppf(mr, ur.ravel(), f, v["response_tokens"].get("censor_at"))
    g = np.repeat(np.arange(G), n)
    ndp = len(b.get("dp_ranks") or [0])
    dp_idx = g * ndp // G
    block_start = (np.arange(ndp) * G + ndp - 1) // ndp
    dp_ranks = np.asarray(b.get("dp_ranks") or [0])[dp_idx]
    ranks = np.asarray(b.get("rank_of_dp") or [0])[dp_idx]
    local = g - block_start[dp_idx]
    n_turns = np.ones(G * n, dtype=np.int64)
    n_calls = np.zeros(G * n, dtype=np.int64)
    turns = calls = None
    cap = v["response_tokens"].get("censor_at")
    if b.get("multi_turn") and "n_turns" in v:
        resp, n_turns, n_calls, turns, calls = _gen_multiturn(v, rng, np.repeat(prompt, n), cap, step, G, n)
    samples = pl.DataFrame(
        {
            "step": np.full(G * n, step, dtype=np.int64),
            "group": g.astype(np.int64),
            "sample_index": np.tile(np.arange(n), G).astype(np.int64),
            "dp_rank": dp_ranks.astype(np.int64),
            "rank": ranks.astype(np.int64),
            "tp_rank": np.zeros(G * n, dtype=np.int64),
            "local_index": local.astype(np.int64),
            "prompt_tokens": np.repeat(prompt, n).astype(np.int64),
            "response_tokens": resp.astype(np.int64),
            "n_turns": n_turns,
            "n_tool_calls": n_calls,
            "truncated": (resp >= cap) if cap is not None else np.zeros(G * n, bool),
        }
    )
    rewards = None
    if "reward_time_per_sample_s" in v:
        mrw = marginal(v["reward_time_per_sample_s"])
        per_rank = samples.group_by("dp_rank", "rank", maintain_order=True).agg(
            batch_size=pl.len(), response_sum=pl.col("response_tokens").sum(), response_mean=pl.col("response_tokens").mean(),
            response_max=pl.col("response_tokens").max(),
        ).sort("dp_rank")
        per = mrw.ppf(rng.random(per_rank.height))
        rewards = per_rank.with_columns(step=pl.lit(step, pl.Int64), reward_time_s=pl.Series(per) * pl.col("batch_size"))
    return samples, turns, calls, rewards


def _gen_multiturn(v: dict[str, Any], rng: np.random.Generator, prompt: np.ndarray, cap: float | None, step: int, G: int, n: int):
    N = prompt.size
    n_turns = marginal(v["n_turns"]).ppf(rng.random(N)).astype(np.int64)
    n_turns = np.maximum(n_turns, 1)
    T = int(n_turns.sum())
    traj = np.repeat(np.arange(N), n_turns)
    starts = np.cumsum(n_turns) - n_turns
    tidx = np.arange(T) - np.repeat(starts, n_turns)
    final = tidx == np.repeat(n_turns, n_turns) - 1
    per_turn = marginal(v["tool_calls_per_turn"]).ppf(rng.random(T)).astype(np.int64) if "tool_calls_per_turn" in v else np.ones(T, np.int64)
    per_turn = np.where(final, 0, np.maximum(per_turn, 1))
    comp_m = marginal(v["turn_completion_tokens"]) if "turn_completion_tokens" in v else None
    u_comp = rng.random(T)
    comp = comp_m.ppf(u_comp) if comp_m is not None else np.full(T, 50.0)
    turn_nt = np.repeat(n_turns, n_turns)
    # conditional on the trajectory's turn count where fitted (one pass per (count, turn kind))
    for k_turns, kinds in (v.get("completion_by_turns") or {}).items():
        for kind, d in kinds.items():
            m = (turn_nt == int(k_turns)) & (final if kind == "final" else ~final)
            if m.any():
                comp[m] = marginal(d).ppf(u_comp[m])
    lat_m = marginal(v["engine_latency_s"]) if "engine_latency_s" in v else None
    eng = lat_m.ppf(rng.random(T)) if lat_m is not None else np.zeros(T)
    C = int(per_turn.sum())
    call_turn = np.repeat(np.arange(T), per_turn)
    call_nt = turn_nt[call_turn]
    tools = v.get("tools") or {}
    names = list(tools) or ["tool"]
    shares = np.array([float(tools[t].get("share", 1.0)) for t in names]) if tools else np.array([1.0])
    which = rng.choice(len(names), size=C, p=shares / shares.sum())
    lat = np.zeros(C)
    rtok = np.zeros(C)
    u_lat, u_tok = rng.random(C), rng.random(C)
    for i, t in enumerate(names):
        m = which == i
        e = tools.get(t, {})
        if m.any() and "latency_s" in e:
            lat[m] = marginal(e["latency_s"]).ppf(u_lat[m])
        if m.any() and "response_tokens" in e:
            rtok[m] = marginal(e["response_tokens"]).ppf(u_tok[m])
        for k_turns, d in ((v.get("tool_response_by_turns") or {}).get(t) or {}).items():
            mn = m & (call_nt == int(k_turns))
            if mn.any():
                rtok[mn] = marginal(d).ppf(u_tok[mn])
    overhead = float((v.get("tool_overhead_tokens") or {}).get("value", 0.0))
    tool_add = np.bincount(call_turn, weights=rtok + overhead, minlength=T)
    inc = comp + tool_add
    resp = np.bincount(traj, weights=inc, minlength=N)
    resp = apply_bounds(resp, 1.0, cap, True)
    # prompt of turn t = trajectory prompt + everything appended before it
    csum = np.cumsum(inc) - inc
    before = csum - np.repeat(csum[starts], n_turns)
    turn_prompt = np.repeat(prompt, n_turns) + before
    cached = np.where(tidx == 0, 0.0, np.maximum(turn_prompt - tool_add[np.maximum(np.arange(T) - 1, 0)], 0))
    g = traj // n
    si = traj % n
    finish = np.where(final, "stop", "tool_calls")
    turns = pl.DataFrame(
        {
            "step": np.full(T, step, np.int64), "group": g.astype(np.int64), "sample_index": si.astype(np.int64),
            "turn": tidx.astype(np.int64), "prompt_tokens": np.rint(turn_prompt).astype(np.int64),
            "cached_tokens": np.rint(cached).astype(np.int64), "completion_tokens": np.rint(comp).astype(np.int64),
            "engine_latency_s": eng, "finish_reason": finish, "tool_call_count": per_turn,
        }
    )
    ct = call_turn
    call_idx = np.arange(C) - np.repeat(np.cumsum(per_turn) - per_turn, per_turn) if C else np.zeros(0, np.int64)
    calls = pl.DataFrame(
        {
            "step": np.full(C, step, np.int64), "group": g[ct].astype(np.int64), "sample_index": si[ct].astype(np.int64),
            "turn": tidx[ct].astype(np.int64), "call_index": call_idx.astype(np.int64),
            "tool_name": np.asarray(names, dtype=object)[which].astype(str) if C else np.zeros(0, dtype=str),
            "latency_s": lat, "response_tokens": np.rint(rtok).astype(np.int64), "status": np.full(C, "success"),
        },
        schema_overrides={"tool_name": pl.String, "status": pl.String},
    )
    n_calls = np.bincount(traj, weights=per_turn, minlength=N).astype(np.int64)
    return resp, n_turns, n_calls, turns, calls
