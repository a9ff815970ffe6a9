"""PolyTrace's own generator, as the fidelity baseline.

A port of ``Generator.sample_from_range_distribution`` in PolyTrace's ``generate.py``: the
recorded values are cut into at most 20 equal-width bins; each bin contributes
``int(share * target)`` values drawn (with replacement) from the recorded values inside it;
the remainder is drawn from the whole list; the result is shuffled. Prompt and response lengths
are resampled independently (as PolyTrace does). For multi-turn runs the same procedure is
applied to the per-trajectory turn count, tool-call count and tool time, so that the baseline
is scored on every statistic ours is.

The recorded values are the *training* steps' values pooled (the held-out steps are never seen).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import polars as pl

from analyses.export.sampler import step_rng

N_BINS = 20


def histogram_resample(values: np.ndarray, target: int, rng: np.random.Generator) -> np.ndarray:
    vals = np.asarray(values, dtype=float)
    if vals.size == 0 or target <= 0:
        return np.zeros(max(target, 0))
    if target >= vals.size:
        out = np.concatenate([rng.permutation(vals), rng.choice(vals, size=target - vals.size)])
        return rng.permutation(out)
    lo, hi = float(vals.min()), float(vals.max())
    nb = min(N_BINS, int(np.unique(vals).size))
    size = (hi - lo) / nb if nb > 1 else 1.0
    if size == 0:
        return np.full(target, vals[0])
    idx = np.minimum(((vals - lo) / size).astype(np.int64), nb - 1)
    parts = []
    for b in range(nb):
        inb = vals[idx == b]
        if inb.size == 0:
            continue
        need = int(inb.size / vals.size * target)
        if need > 0:
            parts.append(rng.choice(inb, size=min(need, inb.size)))
    out = np.concatenate(parts) if parts else np.zeros(0)
    if out.size < target:
        out = np.concatenate([out, rng.choice(vals, size=target - out.size)])
    if out.size > target:
        out = rng.choice(out, size=target, replace=False)
    return rng.permutation(out)


class HistogramBaseline:
    """Fitted from training frames; ``generate`` mirrors :func:`analyses.export.sampler.generate`."""

    def __init__(self, train: pl.DataFrame, batch: dict[str, Any], per_sample_tool_time: pl.DataFrame | None = None):
        self.batch = batch
        first = train.unique("group", keep="first", maintain_order=True)
        self.prompts = first["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy()
        self.responses = train["response_tokens"].cast(pl.Float64).to_numpy()
        self.turns = train["n_turns"].fill_null(1).cast(pl.Float64).to_numpy()
        self.calls = train["n_tool_calls"].fill_null(0).cast(pl.Float64).to_numpy()
        if per_sample_tool_time is not None and "tool_time_s" in train.columns:
            self.tool_time = train["tool_time_s"].fill_null(0).to_numpy()
        else:
            self.tool_time = np.zeros(train.height)

    def generate(self, steps: Iterable[int], seed: int) -> pl.DataFrame:
        b = self.batch
        G, n = int(b["prompts_per_step"]), int(b["samples_per_prompt"])
        ndp = len(b.get("dp_ranks") or [0])
        out = []
        for k in steps:
            rng = step_rng(seed, "baseline", int(k))
            prompt = histogram_resample(self.prompts, G, rng)
            resp = histogram_resample(self.responses, G * n, rng)
            g = np.repeat(np.arange(G), n)
            dp_idx = g * ndp // G
            frame = {
                "step": np.full(G * n, int(k), np.int64),
                "group": g,
                "dp_rank": np.asarray(b.get("dp_ranks") or [0])[dp_idx],
                "prompt_tokens": np.repeat(prompt, n).astype(np.int64),
                "response_tokens": resp.astype(np.int64),
            }
            if b.get("multi_turn"):
                frame["n_turns"] = histogram_resample(self.turns, G * n, rng).astype(np.int64)
                frame["n_tool_calls"] = histogram_resample(self.calls, G * n, rng).astype(np.int64)
                frame["tool_time_s"] = histogram_resample(self.tool_time, G * n, rng)
            out.append(pl.DataFrame(frame))
        return pl.concat(out)
