"""DAPO-style filtering waste: generation batches per trainer step and discarded samples.

Per generation batch, ``kept`` passed the filter (e.g. non-zero reward variance) and ``used``
went into the training batch; kept beyond the batch size are surplus. Sample counts fall back
to prompts x n when a reader recorded only prompts (not possible here: no n), so a NULL sample
count means unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyses.views.group import ReadView, View, ViewGroup
from analyses.views.sql import ratio

if TYPE_CHECKING:
    from analyses.figures import FigureSpec

_sums = """
count(*) AS gen_batches, CAST(sum(prompts_generated) AS BIGINT) AS prompts_generated, CAST(sum(prompts_kept) AS BIGINT) AS prompts_kept,
CAST(sum(prompts_used) AS BIGINT) AS prompts_used, CAST(sum(samples_generated) AS BIGINT) AS samples_generated,
CAST(sum(samples_kept) AS BIGINT) AS samples_kept
"""
_shares = f"""
{ratio("prompts_generated - prompts_kept", "prompts_generated")} AS filtered_share,
{ratio("prompts_generated - prompts_used", "prompts_generated")} AS unused_share,
{ratio("samples_generated - samples_kept", "samples_generated")} AS filtered_sample_share
"""

FILTER_WASTE = View(
    "filter_waste",
    f"SELECT *, {_shares} FROM (SELECT run_id, trainer_step, {_sums} FROM filter_batches GROUP BY ALL)",
    "Per run x trainer step: gen_batches, prompts generated/kept/used, samples generated/kept; filtered_share "
    "= share of generated prompts the filter discarded; unused_share = share of generated prompts not "
    "trained on (filtered + surplus kept beyond the batch); filtered_sample_share the same in samples.",
)

FILTER_WASTE_RUN = View(
    "filter_waste_run",
    f"""
SELECT *, {_shares}, {ratio("gen_batches", "trainer_steps")} AS gen_batches_per_step
FROM (SELECT run_id, count(DISTINCT trainer_step) AS trainer_steps, {_sums} FROM filter_batches GROUP BY ALL)
""",
    "Per run: trainer_steps, gen_batches, gen_batches_per_step, the sums and shares of filter_waste over the run.",
)

def _figures(read: ReadView, runs: list[str]) -> list[FigureSpec]:
    from analyses import figures as F  # plotly: only when a report draws

    return F.per_run(read("filter_waste"), runs, "filter_waste__per_step", F.filter_waste_figure, True)


GROUP = ViewGroup(
    name="filter_waste",
    order=80,
    title="Filtering waste",
    question="How many generation batches per step, and how much generation is discarded?",
    needs="filter_batches (DAPO filter logs)",
    main=FILTER_WASTE,
    views=(FILTER_WASTE, FILTER_WASTE_RUN),
    headline_sql="""
        SELECT run_id, trainer_steps, gen_batches, round(gen_batches_per_step, 2) AS gen_batches_per_step,
               prompts_generated, prompts_kept, prompts_used, round(filtered_share, 3) AS filtered_share,
               round(unused_share, 3) AS unused_share
        FROM filter_waste_run ORDER BY run_id""",
    figures=_figures,
)
