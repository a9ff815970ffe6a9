"""Rolling-origin evaluation: fit on the steps up to an origin, generate the next ones, score.

One protocol serves both the choice of a model inside the training steps
(:mod:`analyses.fit.select`) and the fidelity check over a whole run
(:mod:`analyses.fit.fidelity`):

* the run's *full* steps (a step with fewer than half the median step's samples is a cut-off,
  partial step: never fitted, never scored) are taken in order ``t_0 < t_1 < ...``;
* every origin ``t_i`` with at least ``MIN_FITTED`` (2) full steps up to it is used: the
  generator is fitted on ``t_0..t_i`` and generates ``t_{i+1}`` and, when it exists, ``t_{i+2}``
  (``HORIZON``) with ``S`` seeds;
* each generated step is scored against the real one with :mod:`analyses.fit.scores`: the CRPS,
  the 90% interval and the ensemble mean of every per-step statistic, and the KS distance of the
  per-sample values (response lengths; turns and tool latency for multi-turn runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from analyses.fit.sampler import StepDraws
from analyses.fit.scores import (
    KS_VARIABLES,
    Scored,
    covered90,
    crps_ensemble,
    ks_rows,
    per_sample_tool_time,
    stat_matrix,
    statistic_names,
    step_statistics,
)

MIN_FITTED = 2
HORIZON = 2


def origins(steps: Sequence[int], min_fitted: int = MIN_FITTED, horizon: int = HORIZON) -> list[tuple[list[int], list[int]]]:
    """(fitted steps, predicted steps) per origin: every prefix of at least ``min_fitted`` steps
    that leaves a step to predict, predicting the next ``horizon`` steps (fewer at the end)."""
    steps = list(steps)
    return [(steps[: i + 1], steps[i + 1 : i + 1 + horizon]) for i in range(min_fitted - 1, len(steps) - 1)]


@dataclass
class RealSteps:
    """A run's real steps, ready to fit on and score against."""

    samples: pl.DataFrame  # training samples (full steps), with tool_time_s
    turns: pl.DataFrame | None
    tool_calls: pl.DataFrame | None
    multi: bool
    has_ranks: bool
    names: list[str] = field(default_factory=list)
    stats: dict[int, np.ndarray] = field(default_factory=dict)  # step -> statistics (order of names)
    values: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # step -> per-sample values

    @classmethod
    def build(cls, samples: pl.DataFrame, turns: pl.DataFrame | None, tool_calls: pl.DataFrame | None,
              multi: bool) -> RealSteps:
        s = per_sample_tool_time(samples, tool_calls, ("step", "sample_id"))
        has_ranks = bool(s["dp_rank"].drop_nulls().len())
        names = statistic_names(multi, has_ranks)
        st = step_statistics(s, multi, has_ranks)
        # a statistic that is 0 on every step (no tool time recorded) has no relative score
        names = [c for c in names if float(st[c].abs().sum()) > 0]
        out = cls(s, turns, tool_calls, multi, has_ranks, names)
        for row in st.iter_rows(named=True):
            out.stats[int(row["step"])] = np.array([float(row[c]) for c in names])
        for (k,), g in s.group_by("step"):
            v = {"response_tokens": g["response_tokens"].cast(pl.Float64).to_numpy()}
            if multi:
                v["turns"] = g["n_turns"].fill_null(1).cast(pl.Float64).to_numpy()
                if tool_calls is not None:
                    lat = tool_calls.filter(pl.col("step") == k).join(g.select("sample_id"), on="sample_id", how="semi")
                    v["tool_latency_s"] = lat["latency_s"].drop_nulls().to_numpy()
            out.values[int(k)] = v
        return out

    @classmethod
    def from_summaries(cls, summ: pl.DataFrame) -> RealSteps:
        """The per-step statistics a run's summaries give, for scoring inside its steps (a fit
        from summaries has no samples to compare with): total tokens, the longest response (a
        row that averages several steps has none), and for agentic runs the turns and tool time
        (``n`` x their means); no per-sample values, so no KS."""
        tot = pl.coalesce(pl.col("total_tokens"), pl.col("n") * (pl.col("prompt_mean") + pl.col("response_mean")))
        df = summ.select(
            "step",
            total_tokens=tot,
            longest_response=pl.when(pl.col("averaged_steps").fill_null(1) <= 1).then(pl.col("response_max")),
            turns=pl.col("n") * pl.col("turns_mean"),
            tool_time_s=pl.col("n") * pl.col("tool_time_mean"),
        ).sort("step")
        multi = df["turns"].null_count() < df.height
        want = ["total_tokens", "longest_response"] + (["turns", "tool_time_s"] if multi else [])
        names = [c for c in want if df[c].null_count() == 0 and float(df[c].abs().sum()) > 0]
        out = cls(pl.DataFrame(), None, None, multi, False, names)
        for row in df.iter_rows(named=True):
            out.stats[int(row["step"])] = np.array([float(row[c]) for c in names])
        return out

    def frames(self, steps: Sequence[int]) -> tuple[pl.DataFrame, pl.DataFrame | None, pl.DataFrame | None]:
        """(samples, turns, tool calls) of the given steps: what a generator is fitted on."""
        keep = pl.col("step").is_in(list(steps))

        def f(d: pl.DataFrame | None) -> pl.DataFrame | None:
            return None if d is None else d.filter(keep)

        return self.samples.filter(keep), f(self.turns), f(self.tool_calls)


def ensemble_statistics(d: StepDraws, names: list[str]) -> np.ndarray:
    """The per-step statistics of every generated (seed, step): ``[seeds, steps, statistics]``."""
    m = stat_matrix(d.prompt, d.response, d.dp_index, d.n_dp, names, d.n_turns, d.tool_time)
    return m.reshape(len(d.seeds), len(d.steps), len(names))


def _generated_values(d: StepDraws, j: int, variable: str) -> list[np.ndarray]:
    """Per seed, a generated step's per-sample values of ``variable``."""
    K = len(d.steps)
    rows = range(j, len(d.seeds) * K, K)
    if variable == "response_tokens":
        return [d.response[r] for r in rows]
    if variable == "turns":
        return [d.n_turns[r] for r in rows]
    return [d.call_latency(r) for r in rows]


def ks_scores(d: StepDraws, j: int, variable: str, real: np.ndarray) -> tuple[float, float]:
    """(KS of the seed-pooled generated values, mean KS of each seed's values) against ``real``."""
    gen = _generated_values(d, j, variable)
    if real.size == 0 or not gen or all(g.size == 0 for g in gen):
        return float("nan"), float("nan")
    pooled = float(ks_rows(np.concatenate(gen)[None, :], real)[0])
    if len({g.size for g in gen}) == 1 and gen[0].size:
        per_seed = float(np.mean(ks_rows(np.stack(gen), real)))
    else:
        per_seed = float(np.nanmean([ks_rows(g[None, :], real)[0] if g.size else np.nan for g in gen]))
    return pooled, per_seed


def score_draws(d: StepDraws, real: RealSteps, ks: bool = True) -> Scored:
    """One generator's scores on the steps of ``d`` (``ks=False``: the per-step statistics only)."""
    stats = ensemble_statistics(d, real.names)
    y = np.stack([real.stats[k] for k in d.steps])
    crps = np.stack([crps_ensemble(stats[:, j, :], y[j]) for j in range(len(d.steps))])
    cov = np.stack([covered90(stats[:, j, :], y[j]) for j in range(len(d.steps))])
    ks_pooled: dict[str, list[float]] = {}
    ks_seed: dict[str, list[float]] = {}
    for var in KS_VARIABLES if ks else ():
        for j, k in enumerate(d.steps):
            rv = real.values[k].get(var)
            if rv is None:
                continue
            p, s = ks_scores(d, j, var, rv)
            ks_pooled.setdefault(var, []).append(p)
            ks_seed.setdefault(var, []).append(s)
    return Scored(list(d.steps), real.names, y, crps, cov, stats.mean(axis=0), ks_pooled, ks_seed)
