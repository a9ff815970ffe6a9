"""DAPO-style filtering waste: generation batches per trainer step and discarded samples.

Per generation batch, ``kept`` passed the filter (e.g. non-zero reward variance) and ``used``
went into the training batch; kept beyond the batch size are surplus. Sample counts fall back
to prompts x n when a reader recorded only prompts (not possible here: no n), so a NULL sample
count means unknown.
"""

from __future__ import annotations

from analyses.catalog import register_view
from analyses.views._common import ratio

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

register_view(
    "filter_waste",
    f"SELECT *, {_shares} FROM (SELECT run_id, trainer_step, {_sums} FROM filter_batches GROUP BY ALL)",
    "Per run x trainer step: gen_batches, prompts generated/kept/used, samples generated/kept; filtered_share "
    "= share of generated prompts the filter discarded; unused_share = share of generated prompts not "
    "trained on (filtered + surplus kept beyond the batch); filtered_sample_share the same in samples.",
)

register_view(
    "filter_waste_run",
    f"""
SELECT *, {_shares}, {ratio("gen_batches", "trainer_steps")} AS gen_batches_per_step
FROM (SELECT run_id, count(DISTINCT trainer_step) AS trainer_steps, {_sums} FROM filter_batches GROUP BY ALL)
""",
    "Per run: trainer_steps, gen_batches, gen_batches_per_step, the sums and shares of filter_waste over the run.",
)
