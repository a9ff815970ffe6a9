"""PolyTrace's own generator, as the fidelity baseline.

A port of ``Generator.sample_from_range_distribution`` in PolyTrace's ``generate.py``: the
recorded values are cut into at most 20 equal-width bins; each bin contributes
``int(share * target)`` values drawn (with replacement) from the recorded values inside it;
the remainder is drawn from the whole list; the result is shuffled. Prompt and response lengths
are resampled independently (as PolyTrace does). For multi-turn runs the same procedure is
applied to the per-trajectory turn count, tool-call count and tool time, and to the per-call tool
latency (as many calls as the drawn tool-call counts add up to), so that the baseline is scored
on every statistic and sample variable ours is.

The recorded values are the *training* steps' values pooled (the scored steps are never seen).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from analyses.export.sampler import StepDraws, step_rng

N_BINS = 20
KEY = "baseline"


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
    """Fitted from training frames (``train``: training samples with ``tool_time_s``);
    :meth:`draw` mirrors :func:`analyses.export.sampler.draw_steps`, :meth:`generate` the frames."""

    def __init__(self, train: pl.DataFrame, batch: dict[str, Any], call_latency: np.ndarray | None = None):
        self.batch = batch
        first = train.unique("group", keep="first", maintain_order=True)
        self.prompts = first["prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy()
        self.responses = train["response_tokens"].cast(pl.Float64).to_numpy()
        self.turns = train["n_turns"].fill_null(1).cast(pl.Float64).to_numpy()
        self.calls = train["n_tool_calls"].fill_null(0).cast(pl.Float64).to_numpy()
        self.tool_time = train["tool_time_s"].fill_null(0).to_numpy() if "tool_time_s" in train.columns else np.zeros(train.height)
        self.call_latency = np.zeros(0) if call_latency is None else np.asarray(call_latency, dtype=float)
        self.G, self.n = int(batch["prompts_per_step"]), int(batch["samples_per_prompt"])
        ndp = len(batch.get("dp_ranks") or [0])
        self.dp_index = np.repeat(np.arange(self.G), self.n) * ndp // self.G
        self.n_dp = ndp

    def draw(self, steps: Sequence[int], seeds: Sequence[int]) -> StepDraws:
        G, n = self.G, self.n
        multi = bool(self.batch.get("multi_turn"))
        P, R, T, C, TT, det = [], [], [], [], [], []
        for sd in seeds:
            for k in steps:
                rng = step_rng(int(sd), KEY, int(k))
                P.append(np.repeat(histogram_resample(self.prompts, G, rng), n))
                R.append(histogram_resample(self.responses, G * n, rng))
                if multi:
                    T.append(histogram_resample(self.turns, G * n, rng))
                    C.append(histogram_resample(self.calls, G * n, rng))
                    TT.append(histogram_resample(self.tool_time, G * n, rng))
                    n_calls = int(C[-1].sum())
                    det.append({"calls": {"latency_s": histogram_resample(self.call_latency, n_calls, rng)}})
        out = StepDraws([int(s) for s in seeds], [int(k) for k in steps], np.stack(P), np.stack(R), self.dp_index, self.n_dp)
        if multi:
            out.n_turns, out.n_calls, out.tool_time, out.detail = np.stack(T), np.stack(C), np.stack(TT), det
        return out

    def generate(self, steps: Sequence[int], seed: int) -> pl.DataFrame:
        """One seed's steps as a samples frame (the columns :func:`~analyses.fit.scores.step_statistics` reads)."""
        d = self.draw(steps, [seed])
        b = self.batch
        out = []
        for r, k in enumerate(d.steps):
            g = np.repeat(np.arange(self.G), self.n)
            frame = {
                "step": np.full(self.G * self.n, int(k), np.int64),
                "group": g,
                "dp_rank": np.asarray(b.get("dp_ranks") or [0])[self.dp_index],
                "prompt_tokens": d.prompt[r].astype(np.int64),
                "response_tokens": d.response[r].astype(np.int64),
            }
            if d.n_turns is not None:
                frame["n_turns"] = d.n_turns[r].astype(np.int64)
                frame["n_tool_calls"] = d.n_calls[r].astype(np.int64)
                frame["tool_time_s"] = d.tool_time[r]
            out.append(pl.DataFrame(frame))
        return pl.concat(out)
