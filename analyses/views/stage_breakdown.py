"""The stage-time breakdown per step: rollout, inference, training and the rest, from ``steps``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.views.group import ReadView, View, ViewGroup
from analyses.views.sql import ratio

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

# Stage groups of verl's timing keys. adv (advantage computation) is CPU-side and cheap; it is
# counted in `other` with whatever the step time does not explain.
_INFER = "coalesce(reward_time_s, 0) + coalesce(old_log_prob_time_s, 0) + coalesce(ref_time_s, 0) + coalesce(values_time_s, 0)"
_TRAIN = "coalesce(update_actor_time_s, 0) + coalesce(update_critic_time_s, 0)"

STAGE_BREAKDOWN = View(
    "stage_breakdown",
    f"""
WITH t AS (
    SELECT run_id, step, step_time_s, step_time_source,
           coalesce(gen_time_s, 0) AS rollout_s, {_INFER} AS inference_s, {_TRAIN} AS training_s
    FROM steps
    WHERE gen_time_s IS NOT NULL OR reward_time_s IS NOT NULL OR old_log_prob_time_s IS NOT NULL
       OR ref_time_s IS NOT NULL OR values_time_s IS NOT NULL OR update_actor_time_s IS NOT NULL
       OR update_critic_time_s IS NOT NULL
), d AS (
    SELECT *, greatest(coalesce(step_time_s, 0), rollout_s + inference_s + training_s) AS denom_s FROM t
)
SELECT run_id, step, step_time_s, step_time_source, rollout_s, inference_s, training_s,
       denom_s - rollout_s - inference_s - training_s AS other_s,
       {ratio("rollout_s", "denom_s")} AS rollout_share,
       {ratio("inference_s", "denom_s")} AS inference_share,
       {ratio("training_s", "denom_s")} AS training_share,
       {ratio("denom_s - rollout_s - inference_s - training_s", "denom_s")} AS other_share
FROM d
""",
    "Per run x step: seconds and share of rollout (gen), inference (reward + old_log_prob + ref + values) and "
    "training (update_actor + update_critic); other = step time not explained by those (adv, checkpointing, "
    "overheads). Shares are of max(step_time_s, sum of stages), so they sum to 1 even when stages overlap.",
)


def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    return F.per_run(read("stage_breakdown"), runs, "stage_breakdown__shares", F.stage_share_figure, True)


_SUM = "sum(rollout_s + inference_s + training_s + other_s)"

GROUP = ViewGroup(
    name="stage_breakdown",
    order=30,
    title="Stage-time breakdown",
    question="Where does a step's time go: rollout, inference or training?",
    needs="steps (timing_s/* keys of the trainer log)",
    main=STAGE_BREAKDOWN,
    views=(STAGE_BREAKDOWN,),
    headline_sql=f"""
        SELECT run_id, count(*) AS steps, round(sum(rollout_s) / nullif({_SUM}, 0), 3) AS rollout_share,
               round(sum(inference_s) / nullif({_SUM}, 0), 3) AS inference_share,
               round(sum(training_s) / nullif({_SUM}, 0), 3) AS training_share,
               round(sum(other_s) / nullif({_SUM}, 0), 3) AS other_share
        FROM stage_breakdown GROUP BY run_id ORDER BY run_id""",
    figures=_figures,
)
