"""RL stages named in a profiler trace: which span names mean which stage, and the stage of a moment.

An RL framework marks its stages in the trace with ``torch.profiler.record_function`` ranges
(Kineto writes them as ``user_annotation`` events, and their GPU-side mirrors as
``gpu_user_annotation``). verl does it twice:

* its workers' methods are wrapped by ``DistProfiler.annotate`` (``verl/utils/profiler``), whose
  range is named after the method: ``generate_sequences``, ``compute_log_prob`` (the actor's old
  log-prob), ``compute_ref_log_prob``, ``compute_values``, ``update_actor``, ``update_critic``,
  ``compute_rm_score``;
* the trainer times each stage with ``marked_timer(name, timing_raw)``, whose names are the
  ``timing_s/<name>`` keys of its console log: ``gen``, ``reward``, ``old_log_prob``, ``ref``,
  ``values``, ``adv``, ``update_critic``, ``update_actor``, ``testing``, ``save_checkpoint``
  (under nsys the same names are NVTX ranges).

A stage's canonical name is verl's timing key, so the profiler's stage breakdown sits beside the
console log's (``timing_s/<stage>``) by name. Span names are compared after stripping spaces, the
``#`` of HTA-style ``## name ##`` annotations, and case. ``ProfilerStep#N`` and verl's ``step``
span are not stages: they hold all of them.

The stage of a moment is the innermost stage span covering it (spans of one rank may nest:
``update_actor`` inside ``step``); a moment outside every stage span has no stage (NULL).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Polars (and numpy) where a timeline is built: the views read STAGES only
    import polars as pl


@dataclass(frozen=True)
class Stage:
    name: str  # canonical: verl's timing_s/<name> key
    what: str
    spans: tuple[str, ...]  # span names (normalized: see normalize) that mean this stage


STAGES: tuple[Stage, ...] = (
    Stage("gen", "rollout generation", ("gen", "generate_sequences", "gen_max", "generate", "rollout",
                                        "async_rollout", "generate_sequences_async")),
    Stage("reward", "reward computation", ("reward", "compute_rm_score", "reward_fn", "compute_reward")),
    Stage("old_log_prob", "old policy log-probs", ("old_log_prob", "compute_log_prob", "actor_compute_log_prob",
                                                   "old_log_prob_compute")),
    Stage("ref", "reference policy log-probs", ("ref", "compute_ref_log_prob", "ref_compute_log_prob")),
    Stage("values", "critic values", ("values", "compute_values")),
    Stage("adv", "advantage estimation", ("adv", "compute_advantage")),
    Stage("update_critic", "critic update", ("update_critic", "critic_update")),
    Stage("update_actor", "actor (policy) update", ("update_actor", "actor_update", "train_batch")),
    Stage("testing", "validation", ("testing", "validate")),
    Stage("save_checkpoint", "checkpoint saving", ("save_checkpoint",)),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
_SPAN_TO_STAGE: dict[str, str] = {span: s.name for s in STAGES for span in s.spans}


def normalize(name: pl.Expr) -> pl.Expr:
    """A span name as the registry spells it: lower case, without spaces and HTA's ``#`` fences."""
    import polars as pl

    return name.cast(pl.String).str.strip_chars(" #\t").str.to_lowercase()


def stage_of_name(name: pl.Expr) -> pl.Expr:
    """The stage a span name means, else null."""
    import polars as pl

    return normalize(name).replace_strict(_SPAN_TO_STAGE, default=None, return_dtype=pl.String)


def stage_timeline(spans: pl.DataFrame) -> pl.DataFrame:
    """Flatten stage spans (``ts``, ``end``, ``stage``; may nest or overlap) into consecutive
    segments ``start, stage``: each segment's stage is that of the innermost span covering it (the
    one that started last; at equal starts the shorter one) and null where no span covers.

    Spans are few (a handful per step), so their boundaries are walked in Python with a heap
    (O(S log S)); the events themselves are placed by :func:`stage_at`, vectorized.
    """
    import polars as pl

    schema = {"start": pl.Float64, "stage": pl.String}
    s = spans.filter(pl.col("end") > pl.col("ts")).sort(["ts", "end"], descending=[False, True])
    if s.height == 0:
        return pl.DataFrame(schema=schema)
    ts, end, stage = s["ts"].to_list(), s["end"].to_list(), s["stage"].to_list()
    bounds = sorted(set(ts) | set(end))
    open_: list[tuple[float, int, float]] = []  # (-start, -order, end): the innermost open span on top
    nxt, starts, stages = 0, [], []
    for t in bounds:
        while nxt < len(ts) and ts[nxt] <= t:
            heapq.heappush(open_, (-ts[nxt], -nxt, end[nxt]))
            nxt += 1
        while open_ and open_[0][2] <= t:  # the innermost has closed; an outer one may still be open
            heapq.heappop(open_)
        # a span that closed under a still-open inner one is dropped when it reaches the top
        cur = stage[-open_[0][1]] if open_ else None
        if not stages or stages[-1] != cur:
            starts.append(t)
            stages.append(cur)
    return pl.DataFrame({"start": starts, "stage": stages}, schema=schema)


def stage_at(frame: pl.DataFrame, at: str, timeline: pl.DataFrame, out: str = "stage") -> pl.DataFrame:
    """``frame`` with column ``out``: the stage of ``timeline`` at time column ``at`` (null when
    ``at`` is null or before every segment)."""
    import numpy as np
    import polars as pl

    if timeline.height == 0 or frame.height == 0:
        return frame.with_columns(pl.lit(None, pl.String).cast(pl.Categorical).alias(out))
    t = frame[at].cast(pl.Float64).fill_null(np.nan).to_numpy()
    idx = np.searchsorted(timeline["start"].to_numpy(), t, side="right") - 1
    ok = (idx >= 0) & ~np.isnan(t)
    # Categorical: a handful of stage names over millions of events
    picked = timeline["stage"].cast(pl.Categorical).gather(pl.Series(np.where(ok, idx, 0)))
    return frame.with_columns(pl.when(pl.Series(ok)).then(picked).otherwise(None).alias(out))
