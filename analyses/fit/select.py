"""Choose the generator's options by rolling-origin scores inside the fitted steps.

The fitted steps ``t_0 < ... < t_{m-1}`` are themselves split by :func:`analyses.fit.rolling.origins`
(fit on a prefix, generate the next one or two steps, the last ``MAX_ORIGINS`` origins); every
candidate is scored there by the mean CRPS relative to the real value over the per-step statistics
(:func:`analyses.fit.rolling.relative_crps`, the fidelity criterion itself) and the lowest wins,
the default on ties. Nothing outside the fitted steps is seen. With fewer than 3 fitted steps
there is no origin and the default is used.

Candidates, single-turn runs: the response marginal and its level fitted on ``all`` steps or on
the ``recent`` half (a workload whose shape moves), and the tail fitted with the largest 10% of
exceedances trimmed (bounded influence of runaway responses) or untrimmed. Multi-turn runs:
turn completions and tool results ``pooled`` over trajectories or conditional on the
trajectory's turn count (``by_turns``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from analyses.fit.data import full_and_partial_steps, is_multi_turn, training_samples
from analyses.fit.empirical import TRIM
from analyses.fit.rolling import RealSteps, origins, score_draws
from analyses.fit.sampler import draw_steps
from analyses.fit.scores import relative_crps
from analyses.fit.summary_fit import fit_workload_from_summaries, runaway_variant
from analyses.fit.workload import fit_workload

CANDIDATES: dict[str, dict[str, Any]] = {
    "all/smooth": {"window": "all", "trim": TRIM, "heavy": False},
    "all/heavy": {"window": "all", "trim": TRIM, "heavy": True},
    "recent/smooth": {"window": "recent", "trim": TRIM, "heavy": False},
    "recent/heavy": {"window": "recent", "trim": TRIM, "heavy": True},
}
MT_CANDIDATES: dict[str, dict[str, Any]] = {"pooled": {"by_turns": False}, "by_turns": {"by_turns": True}}
# multi-turn default by_turns: with no origin to score (Search-R1 has one full step) the choice is the
# default's, and the pooled completion mixes answer turns (~100 tokens) with tool-calling turns (~50), so
# generated trajectories prefilled 3.1% more than the real one; by_turns falls back to the pooled fit for
# a turn count with fewer than MIN_BY_TURNS observations, so it is never less data than pooled
DEFAULT, MT_DEFAULT = "all/smooth", "by_turns"
# a fit from summaries: its runaways (the upper contamination) as none, heavy steps, or every step alike
SUMMARY_CANDIDATES: dict[str, dict[str, Any]] = {"smooth": {"runaways": "none"}, "heavy": {"runaways": "heavy"},
                                                 "iid": {"runaways": "iid"}}
SUMMARY_DEFAULT = "smooth"
SELECTION_SEEDS = tuple(range(40))
MAX_ORIGINS = 3  # the latest origins: what the next steps will most resemble, at a bounded cost


def without_heavy_steps(w: dict[str, Any]) -> dict[str, Any]:
    """``w`` with no heavy-tailed steps: what ``heavy=False`` fits, without fitting again."""
    r = {**w["variables"]["response_tokens"], "heavy_prob": 0.0}
    return {**w, "variables": {**w["variables"], "response_tokens": r}}


FitPrefix = Callable[[list[int], dict[str, Any]], dict[str, Any]]
# a validation's prefix fits and scores, by (fitted steps, options) and (fitted, predicted, candidate,
# seeds): a fidelity check's origins validate on overlapping prefixes (origin k on those ending at
# k-1..k-3, origin k+1 on k..k-2), each fitted and scored once when they share one of these
ValidationMemo = dict[tuple[Any, ...], Any]


def validate(fit_prefix: FitPrefix, steps: list[int], real: RealSteps, candidates: dict[str, dict[str, Any]],
             seeds: tuple[int, ...] = SELECTION_SEEDS, variant_key: str = "heavy",
             variant: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None,
             memo: ValidationMemo | None = None) -> dict[str, Any]:
    """Rolling-origin relative CRPS of every candidate inside ``steps`` (the fitted ones).

    ``fit_prefix(steps, options)`` fits the workload on a prefix of them (from samples or from
    summaries: whichever source the caller fits from; a ``ValueError`` makes the candidate
    ineligible); ``real`` holds the statistics it is scored against. Candidates that differ only in
    ``variant_key`` share a fit, turned into each by ``variant(workload, value)`` (default: the
    per-sample fit's ``heavy``, where ``heavy=False`` is the heavy fit without heavy steps).
    ``memo``: fits and scores of earlier validations with the same ``fit_prefix``, ``real``,
    ``candidates`` and ``variant`` (:data:`ValidationMemo`), added to as this one goes."""
    variant = variant or (lambda w, heavy: without_heavy_steps(w) if heavy is False else w)
    memo = {} if memo is None else memo
    used = origins(steps)[-MAX_ORIGINS:]
    scored: dict[str, list | None] = {c: [] for c in candidates}
    for fitted, predicted in used:
        for name, opts in candidates.items():
            base = {k: v for k, v in opts.items() if k != variant_key}
            fkey = ("fit", tuple(fitted), repr(sorted(base.items())))
            if fkey not in memo:
                try:
                    memo[fkey] = fit_prefix(fitted, base)
                except ValueError:  # this candidate cannot be fitted here: it is not eligible
                    memo[fkey] = None
            w = memo[fkey]
            if w is None or scored[name] is None:
                scored[name] = None
                continue
            skey = ("score", tuple(fitted), tuple(predicted), name, tuple(seeds))
            if skey not in memo:
                memo[skey] = score_draws(draw_steps(variant(w, opts.get(variant_key)), predicted, seeds), real, ks=False)
            scored[name].append(memo[skey])
    scores = {c: relative_crps(v) for c, v in scored.items() if v}
    return {"origins": [{"fitted_steps": f, "predicted_steps": p} for f, p in used], "seeds": len(seeds),
            "relative_crps": scores}


def choose(scores: dict[str, float], default: str) -> str:
    """The lowest relative CRPS; the default wins ties and is used when nothing was scored."""
    if not scores:
        return default
    return min(scores, key=lambda c: (scores[c], c != default))


def fit_workload_selected(samples: pl.DataFrame, real: RealSteps | None = None, memo: ValidationMemo | None = None,
                          **kw: Any) -> dict[str, Any]:
    """:func:`~analyses.fit.workload.fit_workload` with its options chosen by rolling-origin
    validation inside the fitted steps (recorded under ``selection``); ``real``: the run's steps
    already prepared for scoring (saves rebuilding them at every origin of a fidelity check);
    ``memo``: the validations of earlier calls with the same ``real`` and ``kw`` (but ``turns`` and
    ``tool_calls``, which a prefix fit takes from ``real``): a fidelity check's origins."""
    s = training_samples(samples)
    multi = is_multi_turn(s)
    candidates, default = (MT_CANDIDATES, MT_DEFAULT) if multi else (CANDIDATES, DEFAULT)
    full, _ = full_and_partial_steps(s)
    cv: dict[str, Any] = {"origins": [], "relative_crps": {}}
    if len(full) >= 3:
        if real is None:
            real = RealSteps.build(s.filter(pl.col("step").is_in(full)), kw.get("turns"), kw.get("tool_calls"), multi)

        def fit_prefix(steps: list[int], opts: dict[str, Any]) -> dict[str, Any]:
            fs, ft, fc = real.frames(steps)
            return fit_workload(fs, **{**kw, "turns": ft, "tool_calls": fc, "for_export": False, **opts, "heavy": True})

        cv = validate(fit_prefix, full, real, candidates, memo=memo)
    best = choose(cv["relative_crps"], default)
    wl = fit_workload(samples, **{**kw, **candidates[best]})
    wl["selection"] = {"selected": best, "default": default, **cv}
    return wl


# fits from summaries by (fitted steps, options): a fidelity check's origins share their prefixes
SummaryFits = dict[tuple[tuple[int, ...], str], dict[str, Any]]


def fit_summaries_selected(summ: pl.DataFrame, fits: SummaryFits | None = None, **kw: Any) -> dict[str, Any]:
    """:func:`~analyses.fit.summary_fit.fit_workload_from_summaries` with its options chosen as
    :func:`fit_workload_selected` chooses them, the fitted steps' logged statistics
    (:meth:`RealSteps.from_summaries`: total tokens, longest response; turns and tool time) standing
    for the samples it does not have. The candidates are how the runaways the fit found are
    generated (:func:`~analyses.fit.summary_fit.runaway_variant`); with no origin to choose by, the
    default is ``iid`` when every fitted step reached the cap (it is part of the workload, as on
    Search-R1 and rllm), else ``smooth``.

    ``fits``: fits already made from the same run's summaries with the same ``kw``, by fitted steps
    and options, added to as this one fits (a fit depends on nothing else: at origin k the
    choice fits the prefixes ending at k-1, k-2, k-3 that the origins before it fitted whole)."""
    steps = sorted(int(k) for k in summ["step"])
    cv: dict[str, Any] = {"origins": [], "relative_crps": {}}
    real = RealSteps.from_summaries(summ)
    memo: SummaryFits = {} if fits is None else fits

    def fit_prefix(prefix: list[int], opts: dict[str, Any]) -> dict[str, Any]:
        key = (tuple(prefix), repr(sorted(opts.items())))
        if key not in memo:
            part = summ if len(prefix) == len(steps) else summ.filter(pl.col("step").is_in(prefix))
            memo[key] = fit_workload_from_summaries(part, **{**kw, **opts})
        return memo[key]

    if len(steps) >= 3 and real.names:
        cv = validate(fit_prefix, steps, real, SUMMARY_CANDIDATES, variant_key="runaways", variant=runaway_variant)
    wl = fit_prefix(steps, {})
    clipped = summ["response_clip_ratio"].fill_null(0.0) * summ["n"].fill_null(0.0)
    default = "iid" if summ.height and bool((clipped >= 0.5).all()) else SUMMARY_DEFAULT
    best = choose(cv["relative_crps"], default)
    # a new top level, not the memo's fit
    return {**runaway_variant(wl, SUMMARY_CANDIDATES[best]["runaways"]),
            "selection": {"selected": best, "default": default, **cv}}
