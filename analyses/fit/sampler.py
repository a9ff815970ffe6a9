"""The seeded sampler: regenerate a workload (per-step samples, turns, tool calls, reward
timings) from a spec entry.

Determinism: step ``k`` of workload ``w`` draws from ``SeedSequence([seed, crc32(w), k])``, and
the once-per-replay draws (the uncertainty of the workload's level) from ``SeedSequence([seed,
crc32(w), 0, 1])``, so a step's numbers depend only on (seed, workload, step) -- not on how many
steps are asked for, in what order, or how many seeds are drawn beside it -- and the same seed
gives the same bytes on every machine (numpy's PCG64 stream is stable across platforms).

Two entry points share every draw: :func:`generate` (one seed, warehouse-like frames, what the
exports write) and :func:`draw_steps` (many seeds at once, plain arrays, what model selection
and the fidelity check score). The random numbers of each (seed, step) are drawn in a fixed
order from that step's stream; the mapping from uniforms to lengths is vectorised over all
(seed, step) rows at once, element by element, so a row of :func:`draw_steps` equals what
:func:`generate` gives for its seed.

Per step: two level effects (response lengths, tool latency; both always drawn), whether the
step is a heavy-tailed one (draws its extremes from the recorded ones; in a forecast, past the
fitted steps, with the heavy-step chain's probability), the step's tail-scale effect (only when the
workload has one, so other workloads keep their streams), the group copula's latents, then
(multi-turn) turn counts, tool calls, completions, latencies, results and failures, then reward
times. Per replay: the two levels' own uncertainty.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy import special

from analyses.fit.continuous import ContinuousFit, apply_bounds
from analyses.fit.drift import DriftModel
from analyses.fit.empirical import EmpiricalTailFit
from analyses.fit.joint import GaussianMixture, GroupCopula
from analyses.fit.marginals import DEFAULT_FAILURE_STATUS, marginal

SUCCESS_STATUS = "success"


@dataclass
class Generated:
    """A generated workload, in warehouse-like frames (one row per sample / turn / call / rank)."""

    samples: pl.DataFrame
    turns: pl.DataFrame | None = None
    tool_calls: pl.DataFrame | None = None
    rewards: pl.DataFrame | None = None

    def renumbered(self, first: int) -> Generated:
        """The same workload with steps counted from 0 (``step - first``)."""
        def shift(df: pl.DataFrame | None) -> pl.DataFrame | None:
            return None if df is None or "step" not in df.columns else df.with_columns(pl.col("step") - first)

        return Generated(shift(self.samples), shift(self.turns), shift(self.tool_calls), shift(self.rewards))


def step_rng(seed: int, key: str, step: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(key.encode()), int(step)]))


def replay_rng(seed: int, key: str) -> np.random.Generator:
    """The stream of the draws made once per replay (four entropy words: never a step's stream)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(key.encode()), 0, 1]))


def workload_key(w: dict[str, Any]) -> str:
    return f"{w.get('run_id')}/{w.get('task')}"


def steps_for(workload: dict[str, Any], n_steps: int) -> list[int]:
    """``n_steps`` consecutive step indices starting at the run's first step."""
    first = int(workload["batch"].get("first_step", 0))
    return list(range(first, first + int(n_steps)))


def scaled_ppf(m: Any, u: np.ndarray, factor: np.ndarray | float, cap: float | None = None,
               heavy: np.ndarray | bool = False, tail_scale: np.ndarray | float = 1.0,
               spread: np.ndarray | float = 1.0) -> np.ndarray:
    """Quantiles of marginal ``m`` at ``u``, scaled by a step's level ``factor`` and cut at the cap
    (``heavy``: the steps that draw their extremes from the recorded ones; ``spread``: a replay's
    spread of an :class:`EmpiricalTailFit` fitted from summaries)."""
    if isinstance(m, ContinuousFit):
        return apply_bounds(m.ppf_raw(u) * factor, m.lower, m.censor_at, m.integer)
    if isinstance(m, EmpiricalTailFit):
        return m.ppf(u, factor, heavy, tail_scale, spread)
    v = np.rint(np.asarray(m.ppf(u), dtype=float) * factor)
    return np.minimum(v, cap) if cap is not None else v


class Compiled:
    """A spec entry's fitted objects, built once per call (marginals, copula, level model)."""

    def __init__(self, w: dict[str, Any]) -> None:
        self.w = w
        b = w["batch"]
        self.G, self.n = int(b["prompts_per_step"]), int(b["samples_per_prompt"])
        self.N = self.G * self.n
        v = w["variables"]
        self.v = v
        self.mp, self.mr = marginal(v["prompt_tokens"]), marginal(v["response_tokens"])
        self.cap = v["response_tokens"].get("censor_at")
        self.drift = DriftModel.from_dict(w.get("drift"))
        self.lat_drift = DriftModel.from_dict(w.get("tool_latency_drift"))
        joint = w.get("joint") or {}
        # spec 1.0 could select a mixture on (log prompt, log response); new fits use the copula
        mixture = joint.get("selected") == "gaussian_mixture" and "gaussian_mixture" in joint
        self.gm = GaussianMixture.from_dict(joint["gaussian_mixture"]) if mixture else None
        self.cop = GroupCopula.from_dict(joint.get("gaussian_copula") or {})
        self.multi = bool(b.get("multi_turn"))
        # a fit from summaries knows each trajectory's whole response, not its turns' parts: the response
        # is drawn as a single-turn one and its turns share it (tool results add no tokens of their own)
        self.whole_response = b.get("trajectory_response") == "marginal"
        if self.multi and "n_turns" not in v:  # a multi-turn workload without its turns is not one to guess
            raise KeyError("variables.n_turns")
        ndp = len(b.get("dp_ranks") or [0])
        g = np.repeat(np.arange(self.G), self.n)
        self.dp_index = g * ndp // self.G
        self.n_dp = ndp
        self.reward = marginal(v["reward_time_per_sample_s"]) if "reward_time_per_sample_s" in v else None
        if self.multi:
            self.mt = _MultiTurn(v)


@dataclass
class StepDraws:
    """Many generated steps of one workload as arrays; row ``r`` is seed ``seeds[r // len(steps)]``
    at step ``steps[r % len(steps)]``."""

    seeds: list[int]
    steps: list[int]
    prompt: np.ndarray  # [rows, samples]: each sample's prompt length
    response: np.ndarray  # [rows, samples]
    dp_index: np.ndarray  # [samples]: position of each sample's DP rank
    n_dp: int
    n_turns: np.ndarray | None = None  # [rows, samples] (multi-turn)
    n_calls: np.ndarray | None = None
    tool_time: np.ndarray | None = None  # [rows, samples]: summed tool latency per sample
    detail: list[dict[str, Any]] = field(default_factory=list)  # per row: turn/call arrays (multi-turn), rewards

    def call_latency(self, row: int) -> np.ndarray:
        return self.detail[row]["calls"]["latency_s"] if self.detail and "calls" in self.detail[row] else np.zeros(0)


def replay_level(c: Compiled, seed: int, key: str, level_uncertainty: bool = True) -> tuple[tuple[float, float], tuple[float, float]]:
    """Per level model (responses, tool latency): this replay's level offset and step sd; without
    ``level_uncertainty`` the fitted level and step sd themselves (no offset, no posterior draw)."""
    if not level_uncertainty:
        return (0.0, c.drift.step_sd), (0.0, c.lat_drift.step_sd)
    rng = replay_rng(seed, key)
    z, chi = rng.standard_normal(2), rng.random(2)
    out = []
    for i, m in enumerate((c.drift, c.lat_drift)):
        nu = m.posterior_dof
        x2 = float(special.chdtri(nu, 1.0 - chi[i])) if nu > 0 else 0.0  # the chi2(nu) quantile at chi[i]
        step_sd, level_se = m.replay(x2)
        out.append((float(z[i]) * level_se, step_sd))
    return out[0], out[1]


def replay_spread(c: Compiled, seed: int, key: str, level_uncertainty: bool = True) -> float:
    """This replay's spread of the response marginal (1: as fitted): ``exp(spread_se * z)`` for a
    marginal fitted from summaries, whose spread is known only that well; drawn from the replay's
    stream after the levels' draws, and only by such a workload, so others keep their streams."""
    se = float(getattr(c.mr, "spread_se", 0.0))
    if not level_uncertainty or se <= 0:
        return 1.0
    rng = replay_rng(seed, key)
    rng.standard_normal(2), rng.random(2)  # the levels' draws (replay_level)
    return float(np.exp(se * rng.standard_normal()))


def _heavy_prob(m: Any, step: int, forecast: bool) -> float:
    """P(a generated step is heavy-tailed): the chain's forecast for a forecast ensemble, the
    share of heavy steps for an export (:meth:`EmpiricalTailFit.heavy_prob_at`)."""
    return m.heavy_prob_at(step, forecast) if isinstance(m, EmpiricalTailFit) else float(getattr(m, "heavy_prob", 0.0))


def draw_steps(workload: dict[str, Any], steps: Sequence[int], seeds: Sequence[int], key: str | None = None,
               compiled: Compiled | None = None, level_uncertainty: bool = True) -> StepDraws:
    """Every (seed, step) of ``seeds x steps`` at once (see the module text). ``level_uncertainty``:
    each seed also draws how well the level is known (a forecast's ensemble); without it every seed
    is the workload at its fitted level, with the fitted step-to-step variation (an export)."""
    c = compiled or Compiled(workload)
    key = key or workload_key(workload)
    steps, seeds = [int(k) for k in steps], [int(s) for s in seeds]
    rows = [(sd, k) for sd in seeds for k in steps]
    replays = {sd: replay_level(c, sd, key, level_uncertainty) for sd in seeds}
    spreads = {sd: replay_spread(c, sd, key, level_uncertainty) for sd in seeds}
    log_f, log_lat, heavy = np.empty(len(rows)), np.empty(len(rows)), np.zeros(len(rows), bool)
    heavy_prob = {k: _heavy_prob(c.mr, k, level_uncertainty) for k in steps}
    tail_sd, log_tail = float(getattr(c.mr, "tail_sd", 0.0)), np.zeros(len(rows))
    ups, urs, gms, rngs = [], [], [], []
    for r, (sd, k) in enumerate(rows):
        rng = step_rng(sd, key, k)
        eta = rng.standard_normal(2)
        heavy[r] = rng.random() < heavy_prob[k]
        if tail_sd > 0:  # drawn only by a workload with a tail-scale effect: others keep their streams
            log_tail[r] = tail_sd * rng.standard_normal()
        (d0, sd0), (d1, sd1) = replays[sd]
        log_f[r] = float(c.drift.log_factor(k)) + d0 + eta[0] * sd0
        log_lat[r] = float(c.lat_drift.log_factor(k)) + d1 + eta[1] * sd1
        if c.gm is not None:
            gms.append(c.gm.sample(rng, c.N))
        else:
            up, ur = c.cop.latents(rng, c.G, c.n)
            ups.append(up)
            urs.append(ur.ravel())
        rngs.append(rng)
    factor = np.exp(log_f)[:, None]
    if c.gm is not None:
        x = np.stack(gms)  # [rows, N, 2] in log space
        prompt_g = np.maximum(np.rint(np.exp(x[:, :: c.n, 0])), 1.0)
        resp = apply_bounds(np.exp(x[:, :, 1]) * factor, 1.0, c.cap, True)
        ur_all = None
    else:
        up_all, ur_all = np.stack(ups), np.stack(urs)
        prompt_g = np.maximum(np.rint(c.mp.ppf(up_all)), 1.0)
        spread = np.array([spreads[sd] for sd, _ in rows])[:, None]
        resp = scaled_ppf(c.mr, ur_all, factor, c.cap, heavy[:, None], np.exp(log_tail)[:, None], spread)
    out = StepDraws(seeds, steps, np.repeat(prompt_g, c.n, axis=1), resp, c.dp_index, c.n_dp)
    details: list[dict[str, Any]] = [{} for _ in rows]
    if c.multi:
        u_turns = ur_all if ur_all is not None else np.stack([rng.random(c.N) for rng in rngs])
        rows_mt = c.mt.draw_many(rngs, u_turns, out.prompt, c.cap, np.exp(log_f), np.exp(log_lat),
                                 response=resp if c.whole_response else None)
        for r, d in enumerate(rows_mt):
            details[r].update(d)
        out.response = np.stack([d["response"] for d in rows_mt])
        out.n_turns = np.stack([d["n_turns"] for d in rows_mt])
        out.n_calls = np.stack([d["n_calls"] for d in rows_mt])
        out.tool_time = np.stack([d["tool_time"] for d in rows_mt])
    if c.reward is not None:
        for r, rng in enumerate(rngs):
            details[r]["reward_per_sample"] = c.reward.ppf(rng.random(c.n_dp))
    out.detail = details
    return out


def generate(workload: dict[str, Any], steps: Iterable[int], seed: int, key: str | None = None) -> Generated:
    """Generate the given steps of one workload (one seed) as warehouse-like frames: the workload
    at its fitted level with its step-to-step variation. The uncertainty of the level itself is the
    fidelity forecast's business (:func:`draw_steps`), not a benchmark input's: drawn per seed, it
    moved Search-R1's exported prefill per trajectory by 6.7% (one fitted step, a wide posterior)."""
    c = Compiled(workload)
    steps = [int(k) for k in steps]
    if not steps:
        return Generated(pl.DataFrame())
    d = draw_steps(workload, steps, [seed], key, c, level_uncertainty=False)
    parts = [_frames(c, d, r, k) for r, k in enumerate(steps)]
    samples = pl.concat([p[0] for p in parts])
    turns = pl.concat([p[1] for p in parts]) if parts[0][1] is not None else None
    calls = pl.concat([p[2] for p in parts]) if parts[0][2] is not None else None
    rewards = pl.concat([p[3] for p in parts]) if parts[0][3] is not None else None
    return Generated(samples, turns, calls, rewards)


def _frames(c: Compiled, d: StepDraws, r: int, step: int) -> tuple[pl.DataFrame, pl.DataFrame | None, pl.DataFrame | None, pl.DataFrame | None]:
    b = c.w["batch"]
    G, n, N = c.G, c.n, c.N
    g = np.repeat(np.arange(G), n)
    ndp = c.n_dp
    block_start = (np.arange(ndp) * G + ndp - 1) // ndp
    dp_idx = c.dp_index
    dp_ranks = np.asarray(b.get("dp_ranks") or [0])[dp_idx]
    ranks = np.asarray(b.get("rank_of_dp") or [0])[dp_idx]
    resp = d.response[r]
    samples = pl.DataFrame(
        {
            "step": np.full(N, step, dtype=np.int64),
            "group": g.astype(np.int64),
            "sample_index": np.tile(np.arange(n), G).astype(np.int64),
            "dp_rank": dp_ranks.astype(np.int64),
            "rank": ranks.astype(np.int64),
            "tp_rank": np.zeros(N, dtype=np.int64),
            "local_index": (g - block_start[dp_idx]).astype(np.int64),
            "prompt_tokens": d.prompt[r].astype(np.int64),
            "response_tokens": resp.astype(np.int64),
            "n_turns": d.n_turns[r].astype(np.int64) if d.n_turns is not None else np.ones(N, dtype=np.int64),
            "n_tool_calls": d.n_calls[r].astype(np.int64) if d.n_calls is not None else np.zeros(N, dtype=np.int64),
            "truncated": (resp >= c.cap) if c.cap is not None else np.zeros(N, bool),
        }
    )
    turns = calls = rewards = None
    det = d.detail[r]
    if c.multi:
        turns, calls = _turn_frames(det, step, n)
    if "reward_per_sample" in det:
        per_rank = samples.group_by("dp_rank", "rank", maintain_order=True).agg(
            batch_size=pl.len(), response_sum=pl.col("response_tokens").sum(), response_mean=pl.col("response_tokens").mean(),
            response_max=pl.col("response_tokens").max(),
        ).sort("dp_rank")
        per = det["reward_per_sample"][: per_rank.height]
        rewards = per_rank.with_columns(step=pl.lit(step, pl.Int64), reward_time_s=pl.Series(per) * pl.col("batch_size"))
    return samples, turns, calls, rewards


def _turn_frames(det: dict[str, Any], step: int, n: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    t, cl = det["turns"], det["calls"]
    T, C = t["traj"].size, cl["turn"].size
    g, si = t["traj"] // n, t["traj"] % n
    turns = pl.DataFrame(
        {
            "step": np.full(T, step, np.int64), "group": g.astype(np.int64), "sample_index": si.astype(np.int64),
            "turn": t["turn"].astype(np.int64), "prompt_tokens": np.rint(t["prompt_tokens"]).astype(np.int64),
            "cached_tokens": np.rint(t["cached_tokens"]).astype(np.int64), "completion_tokens": np.rint(t["completion_tokens"]).astype(np.int64),
            "engine_latency_s": t["engine_latency_s"], "finish_reason": np.where(t["final"], "stop", "tool_calls"),
            "tool_call_count": t["tool_call_count"],
        }
    )
    ct = cl["turn"]
    calls = pl.DataFrame(
        {
            "step": np.full(C, step, np.int64), "group": g[ct].astype(np.int64), "sample_index": si[ct].astype(np.int64),
            "turn": t["turn"][ct].astype(np.int64), "call_index": cl["call_index"].astype(np.int64),
            "tool_name": cl["tool_name"], "latency_s": cl["latency_s"], "response_tokens": np.rint(cl["response_tokens"]).astype(np.int64),
            "status": cl["status"],
        },
        schema_overrides={"tool_name": pl.String, "status": pl.String},
    )
    return turns, calls


class _MultiTurn:
    """The multi-turn composition of one workload: its marginals, built once."""

    def __init__(self, v: dict[str, Any]) -> None:
        self.turns = marginal(v["n_turns"])
        self.per_turn = marginal(v["tool_calls_per_turn"]) if "tool_calls_per_turn" in v else None
        self.comp = marginal(v["turn_completion_tokens"]) if "turn_completion_tokens" in v else None
        self.comp_by = {(int(k), kind): marginal(d) for k, kinds in (v.get("completion_by_turns") or {}).items()
                        for kind, d in kinds.items()}
        self.eng = marginal(v["engine_latency_s"]) if "engine_latency_s" in v else None
        tools = v.get("tools") or {}
        self.names = list(tools) or ["tool"]
        shares = np.array([float(tools[t].get("share", 1.0)) for t in self.names]) if tools else np.array([1.0])
        self.shares = shares / shares.sum()
        self.lat = [marginal(tools[t]["latency_s"]) if "latency_s" in tools.get(t, {}) else None for t in self.names]
        self.tok = [marginal(tools[t]["response_tokens"]) if "response_tokens" in tools.get(t, {}) else None for t in self.names]
        self.tok_by = [{int(k): marginal(d) for k, d in ((v.get("tool_response_by_turns") or {}).get(t) or {}).items()}
                       for t in self.names]
        self.fail = np.array([float(tools.get(t, {}).get("failure_rate") or 0.0) for t in self.names])
        self.fail_status = []
        for t in self.names:
            st = tools.get(t, {}).get("failure_statuses") or {DEFAULT_FAILURE_STATUS: 1.0}
            names = list(st)
            cum = np.cumsum([float(st[s]) for s in names])
            self.fail_status.append((np.asarray(names, dtype=object), cum / cum[-1]))
        self.overhead = float((v.get("tool_overhead_tokens") or {}).get("value", 0.0))

    def draw_many(self, rngs: Sequence[np.random.Generator], u_turns: np.ndarray, prompt: np.ndarray, cap: float | None,
                  level: np.ndarray, lat_level: np.ndarray, response: np.ndarray | None = None) -> list[dict[str, Any]]:
        """Every row's trajectories (a row: one seed's step, with its own stream ``rngs[r]``).

        Each row draws its uniforms from its own stream in a fixed order (calls per turn,
        completions, engine latency, then per call the tool, latency, result and failure); the
        uniforms of all rows are then mapped to values at once, the rows' trajectories side by
        side as one long list. ``u_turns[r]`` (the group latent) sets the turn counts; ``level``
        scales completions and tool results, ``lat_level`` tool latency. ``response`` (``[rows,
        samples]``, a fit from summaries): each trajectory's whole response, shared by its turns'
        completions (the last turn takes the remainder), tool results adding no tokens.
        """
        R, N = u_turns.shape
        n_turns_all = np.maximum(np.asarray(self.turns.ppf(u_turns.ravel())).astype(np.int64), 1).reshape(R, N)
        draws = []
        for r, rng in enumerate(rngs):
            nt = n_turns_all[r]
            T = int(nt.sum())
            final = (np.arange(T) - np.repeat(np.cumsum(nt) - nt, nt)) == np.repeat(nt, nt) - 1
            per_turn = self.per_turn.ppf(rng.random(T)).astype(np.int64) if self.per_turn is not None else np.ones(T, np.int64)
            per_turn = np.where(final, 0, np.maximum(per_turn, 1))
            u_comp, u_eng = rng.random(T), rng.random(T)
            C = int(per_turn.sum())
            which = rng.choice(len(self.names), size=C, p=self.shares)
            draws.append((per_turn, u_comp, u_eng, which, rng.random(C), rng.random(C), rng.random(C)))
        per_turn, u_comp, u_eng, which, u_lat, u_tok, u_fail = (np.concatenate([d[i] for d in draws]) for i in range(7))
        # all rows' trajectories as one list: trajectory g = r * N + j
        nt = n_turns_all.ravel()
        T_r = n_turns_all.sum(axis=1)
        C_r = np.array([d[0].sum() for d in draws], dtype=np.int64)
        n_all = nt.size
        traj = np.repeat(np.arange(n_all), nt)
        starts = np.cumsum(nt) - nt
        tidx = np.arange(traj.size) - np.repeat(starts, nt)
        final = tidx == np.repeat(nt, nt) - 1
        turn_nt = np.repeat(nt, nt)
        row_of_turn = np.repeat(np.arange(R), T_r)
        comp = np.asarray(self.comp.ppf(u_comp), dtype=float) if self.comp is not None else np.full(traj.size, 50.0)
        for (k_turns, kind), m in self.comp_by.items():  # conditional on the turn count where fitted
            sel = (turn_nt == k_turns) & (final if kind == "final" else ~final)
            if sel.any():
                comp[sel] = m.ppf(u_comp[sel])
        comp = np.rint(comp * level[row_of_turn])
        if response is not None:
            whole = np.asarray(response, dtype=float).ravel()[traj]
            share = np.floor(whole / turn_nt)
            comp = np.where(final, whole - share * (turn_nt - 1), share)
        eng = np.asarray(self.eng.ppf(u_eng), dtype=float) if self.eng is not None else np.zeros(traj.size)
        call_turn = np.repeat(np.arange(traj.size), per_turn)
        call_nt = turn_nt[call_turn]
        row_of_call = np.repeat(np.arange(R), C_r)
        C = call_turn.size
        lat, rtok = np.zeros(C), np.zeros(C)
        status = np.full(C, SUCCESS_STATUS, dtype=object)
        for i in range(len(self.names)):
            m = which == i
            if not m.any():
                continue
            if self.lat[i] is not None:
                lat[m] = self.lat[i].ppf(u_lat[m])
            if self.tok[i] is not None:
                rtok[m] = self.tok[i].ppf(u_tok[m])
            for k_turns, mk in self.tok_by[i].items():
                mn = m & (call_nt == k_turns)
                if mn.any():
                    rtok[mn] = mk.ppf(u_tok[mn])
            # a failure at the fitted rate; which failure status, by its share among failures
            failed = m & (u_fail < self.fail[i])
            if failed.any():
                names, cum = self.fail_status[i]
                pick = np.searchsorted(cum, u_fail[failed] / self.fail[i], side="right")
                status[failed] = names[np.minimum(pick, names.size - 1)]
        lat, rtok = lat * lat_level[row_of_call], np.rint(rtok * level[row_of_call])
        if response is not None:
            rtok = np.zeros(C)
        overhead = 0.0 if response is not None else self.overhead
        tool_add = np.bincount(call_turn, weights=rtok + overhead, minlength=traj.size)
        inc = comp + tool_add
        resp = (np.asarray(response, dtype=float).reshape(R, N) if response is not None
                else apply_bounds(np.bincount(traj, weights=inc, minlength=n_all), 1.0, cap, True).reshape(R, N))
        # prompt of turn t = trajectory prompt + everything appended before it
        csum = np.cumsum(inc) - inc
        before = csum - np.repeat(csum[starts], nt)
        turn_prompt = np.repeat(prompt.ravel(), nt) + before
        prev_add = tool_add[np.maximum(np.arange(traj.size) - 1, 0)]
        cached = np.where(tidx == 0, 0.0, np.maximum(turn_prompt - prev_add, 0))
        call_idx = np.arange(C) - np.repeat(np.cumsum(per_turn) - per_turn, per_turn) if C else np.zeros(0, np.int64)
        n_calls = np.bincount(traj, weights=per_turn, minlength=n_all).astype(np.int64).reshape(R, N)
        tool_time = np.bincount(traj[call_turn], weights=lat, minlength=n_all).reshape(R, N)
        names = np.asarray(self.names, dtype=object)
        t_off = np.concatenate([[0], np.cumsum(T_r)])
        c_off = np.concatenate([[0], np.cumsum(C_r)])
        out = []
        for r in range(R):
            ts, cs = slice(t_off[r], t_off[r + 1]), slice(c_off[r], c_off[r + 1])
            out.append({
                "response": resp[r], "n_turns": n_turns_all[r], "n_calls": n_calls[r], "tool_time": tool_time[r],
                "turns": {"traj": traj[ts] - r * N, "turn": tidx[ts], "final": final[ts], "prompt_tokens": turn_prompt[ts],
                          "cached_tokens": cached[ts], "completion_tokens": comp[ts], "engine_latency_s": eng[ts],
                          "tool_call_count": per_turn[ts]},
                "calls": {"turn": call_turn[cs] - t_off[r], "call_index": call_idx[cs], "latency_s": lat[cs],
                          "response_tokens": rtok[cs], "tool_name": names[which[cs]].astype(str) if c_off[r + 1] > c_off[r] else np.zeros(0, dtype=str),
                          "status": status[cs].astype(str) if c_off[r + 1] > c_off[r] else np.zeros(0, dtype=str)},
            })
        return out
