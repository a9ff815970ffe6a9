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

from analyses.fit.sampler import StepDraws, step_rng

N_BINS = 20
KEY = "baseline"


class Bins:
    """A recorded list cut into PolyTrace's bins once, for many draws of the same ``target`` size:
    each bin contributes ``int(share * target)`` values drawn with replacement from its own values,
    the remainder is drawn from the whole list, the result is shuffled."""

    def __init__(self, values: np.ndarray, target: int) -> None:
        self.vals = np.asarray(values, dtype=float)
        self.target = max(int(target), 0)
        self.mode = "bins"
        if self.vals.size == 0 or self.target == 0:
            self.mode = "empty"
            return
        if self.target >= self.vals.size:
            self.mode = "all"
            return
        lo, hi = float(self.vals.min()), float(self.vals.max())
        nb = min(N_BINS, int(np.unique(self.vals).size))
        size = (hi - lo) / nb if nb > 1 else 1.0
        if size == 0:
            self.mode = "constant"
            return
        idx = np.minimum(((self.vals - lo) / size).astype(np.int64), nb - 1)
        order = np.argsort(idx, kind="stable")
        self.pool = self.vals[order]
        counts = np.bincount(idx, minlength=nb)
        self.offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        need = np.minimum((counts / self.vals.size * self.target).astype(np.int64), counts)
        self.bin_of = np.repeat(np.arange(nb), need)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        t = self.target
        if self.mode == "empty":
            return np.zeros(t)
        if self.mode == "constant":
            return np.full(t, self.vals[0])
        if self.mode == "all":
            out = np.concatenate([rng.permutation(self.vals), self.vals[rng.integers(0, self.vals.size, t - self.vals.size)]])
            return rng.permutation(out)
        counts = np.diff(np.append(self.offsets, self.pool.size))
        pick = self.offsets[self.bin_of] + (rng.random(self.bin_of.size) * counts[self.bin_of]).astype(np.int64)
        out = self.pool[pick]
        if out.size < t:
            out = np.concatenate([out, self.vals[rng.integers(0, self.vals.size, t - out.size)]])
        return rng.permutation(out)


def histogram_resample(values: np.ndarray, target: int, rng: np.random.Generator) -> np.ndarray:
    """PolyTrace's ``sample_from_range_distribution``: ``target`` values from ``values`` (see :class:`Bins`)."""
    return Bins(values, target).draw(rng)


class HistogramBaseline:
    """Fitted from training frames (``train``: training samples with ``tool_time_s``);
    :meth:`draw` mirrors :func:`analyses.fit.sampler.draw_steps`, :meth:`generate` the frames."""

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
        N = self.G * self.n
        self._bins = {"prompt": Bins(self.prompts, self.G), "response": Bins(self.responses, N), "turns": Bins(self.turns, N),
                      "calls": Bins(self.calls, N), "tool_time": Bins(self.tool_time, N)}
        ndp = len(batch.get("dp_ranks") or [0])
        self.dp_index = np.repeat(np.arange(self.G), self.n) * ndp // self.G
        self.n_dp = ndp

    def draw(self, steps: Sequence[int], seeds: Sequence[int]) -> StepDraws:
        n = self.n
        multi = bool(self.batch.get("multi_turn"))
        P, R, T, C, TT, det = [], [], [], [], [], []
        for sd in seeds:
            for k in steps:
                rng = step_rng(int(sd), KEY, int(k))
                b = self._bins
                P.append(np.repeat(b["prompt"].draw(rng), n))
                R.append(b["response"].draw(rng))
                if multi:
                    T.append(b["turns"].draw(rng))
                    C.append(b["calls"].draw(rng))
                    TT.append(b["tool_time"].draw(rng))
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
