"""A filtering run's generation batches (DAPO's dynamic sampling): how many prompts a generation
batch holds, what share of them the filter keeps, and how many kept prompts make a trainer step.

DAPO generates batches of ``prompts_generated`` prompts (``n_sampling`` responses each), keeps the
prompts whose responses' rewards differ, and trains once ``train_batch_size`` prompts are kept
(the surplus of the last batch is not used). The keep share is the pooled ratio of kept to
generated prompts; whether a prompt is kept is drawn independently at that rate when exported
(the logs record kept indices, not why: a prompt's difficulty is not in the warehouse).
"""

from __future__ import annotations

from typing import Any

import polars as pl


def fit_filter(batches: pl.DataFrame | None) -> dict[str, Any] | None:
    """The ``filter`` section of a workload spec, or None when the run did not filter."""
    if batches is None or batches.height == 0:
        return None
    b = batches.drop_nulls(["prompts_generated", "prompts_kept"]).filter(pl.col("prompts_generated") > 0)
    if b.height == 0:
        return None
    generated, kept = int(b["prompts_generated"].sum()), int(b["prompts_kept"].sum())
    tbs = b["train_batch_size"].drop_nulls()
    return {
        "kind": "dynamic_sampling",
        "prompts_per_gen_batch": int(b["prompts_generated"].median()),
        "keep_rate": kept / generated,
        "train_batch_size": int(tbs.median()) if tbs.len() else None,
        "gen_batches": b.height,
        "trainer_steps": int(b["trainer_step"].n_unique()) if "trainer_step" in b.columns else None,
    }
