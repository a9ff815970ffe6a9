"""Synthetic warehouse-shaped frames with known parameters, for the fit/sampler/export tests."""

from __future__ import annotations

import numpy as np
import polars as pl

from analyses.schema import conform


def synth_samples(
    steps: int = 6,
    prompts: int = 32,
    n: int = 8,
    dp: int = 2,
    tp: int = 4,
    mu: float = 6.0,
    sigma: float = 0.6,
    within: float = 0.5,
    cap: int | None = 4096,
    slope: float = 0.0,
    seed: int = 0,
    first_step: int = 0,
) -> pl.DataFrame:
    """Lognormal responses (log-sd ``sigma``) with a per-prompt shared effect (within-group
    correlation of log lengths = ``within``), a log-scale trend ``slope`` per step, capped."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(first_step, first_step + steps):
        zg = rng.standard_normal(prompts)
        z = np.sqrt(within) * zg[:, None] + np.sqrt(1 - within) * rng.standard_normal((prompts, n))
        resp = np.rint(np.exp(mu + slope * k + sigma * z))
        resp = np.maximum(resp, 1)
        if cap is not None:
            resp = np.minimum(resp, cap)
        prompt = np.rint(np.exp(5 + 0.3 * rng.standard_normal(prompts)))
        g = np.repeat(np.arange(prompts), n)
        dpi = g * dp // prompts
        rows.append(
            pl.DataFrame(
                {
                    "step": np.full(prompts * n, k),
                    "group_id": [f"{d}-{i}" for d, i in zip(dpi, g - (dpi * prompts + dp - 1) // dp, strict=True)],
                    "sample_id": [f"{d}-{i}-{j}" for d, i, j in zip(dpi, g, np.tile(np.arange(n), prompts), strict=True)],
                    "dp_rank": dpi,
                    "rank": dpi * tp,
                    "tp_rank": np.zeros(prompts * n, int),
                    "local_index": g - (dpi * prompts + dp - 1) // dp,
                    "prompt_tokens": np.repeat(prompt, n).astype(int),
                    "response_tokens": resp.ravel().astype(int),
                    "validate": np.zeros(prompts * n, bool),
                }
            )
        )
    return conform(pl.concat(rows).with_columns(run_id=pl.lit("synth")), "samples")


def synth_multiturn(steps: int = 2, prompts: int = 16, n: int = 4, seed: int = 0) -> dict[str, pl.DataFrame]:
    """Multi-turn trajectories: 1-4 turns, one search call per non-final turn, lognormal latency."""
    rng = np.random.default_rng(seed)
    s_rows, t_rows, c_rows = [], [], []
    for k in range(steps):
        for g in range(prompts):
            p = int(rng.integers(300, 330))
            for j in range(n):
                sid = f"{g}-{j}"
                nt = int(rng.integers(1, 5))
                comp = rng.integers(20, 200, nt)
                tool_tok = rng.integers(400, 600, nt - 1)
                lat = rng.lognormal(-1.5, 0.8, nt - 1)
                resp = int(comp.sum() + tool_tok.sum())
                s_rows.append({"step": k, "sample_id": sid, "group_id": str(g), "prompt_tokens": p, "response_tokens": resp,
                               "n_turns": nt, "n_tool_calls": nt - 1, "validate": False})
                ctx = p
                for t in range(nt):
                    t_rows.append({"step": k, "sample_id": sid, "turn": t, "prompt_tokens": ctx, "cached_tokens": 0,
                                   "completion_tokens": int(comp[t]), "engine_latency_s": float(rng.uniform(10, 100))})
                    ctx += int(comp[t])
                    if t < nt - 1:
                        c_rows.append({"step": k, "sample_id": sid, "turn": t, "call_index": 0, "tool_name": "search",
                                       "latency_s": float(lat[t]), "status": "success", "response_tokens": int(tool_tok[t])})
                        ctx += int(tool_tok[t])
    lit = pl.lit("synth-mt")
    return {
        "samples": conform(pl.DataFrame(s_rows).with_columns(run_id=lit), "samples"),
        "turns": conform(pl.DataFrame(t_rows).with_columns(run_id=lit), "turns"),
        "tool_calls": conform(pl.DataFrame(c_rows).with_columns(run_id=lit), "tool_calls"),
    }
