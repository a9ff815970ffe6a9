"""filter_waste / filter_waste_run on hand-made DAPO generation batches."""

from __future__ import annotations

from pathlib import Path

import pytest
from _views_util import open_wh, rows, stage_run


def test_filter_waste(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    # the first two batches mirror the real dapo_filter_indices.jsonl lines 1-2 (96 prompts x 8)
    stage_run(
        root,
        "d",
        {
            "filter_batches": {
                "trainer_step": [1, 1, 2],
                "gen_batch": [1, 2, 1],
                "prompts_generated": [96, 96, 96],
                "prompts_kept": [27, 33, 40],
                "prompts_used": [27, 5, 32],
                "train_batch_size": [32, 32, 32],
                "samples_generated": [768, 768, 768],
                "samples_kept": [216, 264, 320],
            }
        },
    )
    con = open_wh(root)
    per = {r["trainer_step"]: r for r in rows(con, "SELECT * FROM filter_waste")}
    s1 = per[1]  # generated 192, kept 60, used 32
    assert (s1["gen_batches"], s1["prompts_generated"], s1["prompts_kept"], s1["prompts_used"]) == (2, 192, 60, 32)
    assert s1["filtered_share"] == pytest.approx(132 / 192) and s1["unused_share"] == pytest.approx(160 / 192)
    assert s1["filtered_sample_share"] == pytest.approx((1536 - 480) / 1536)
    assert per[2]["filtered_share"] == pytest.approx(56 / 96)
    run = rows(con, "SELECT * FROM filter_waste_run")[0]  # 288 generated, 100 kept, 64 used over 2 steps
    assert (run["trainer_steps"], run["gen_batches"], run["gen_batches_per_step"]) == (2, 3, 1.5)
    assert run["filtered_share"] == pytest.approx(188 / 288) and run["unused_share"] == pytest.approx(224 / 288)
