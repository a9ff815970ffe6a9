"""step_series / step_variance / stage_breakdown on hand-made steps (answers computed by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _views_util import open_wh, rows, stage_run

from analyses.views import headline_frame


@pytest.fixture
def con(tmp_path: Path):  # noqa: ANN201
    root = tmp_path / "wh"
    stage_run(
        root,
        "r",
        {
            "steps": {
                "step": [1, 2, 3, 4, 5],
                "throughput_tokens_per_s": [100.0, 110.0, 90.0, 100.0, 300.0],
                "step_time_s": [100.0, None, 50.0, 10.0, 10.0],
                "gen_time_s": [50.0, 30.0, 40.0, None, None],
                "reward_time_s": [10.0, None, None, None, None],
                "old_log_prob_time_s": [5.0, None, None, None, None],
                "ref_time_s": [5.0, None, None, None, None],
                "update_actor_time_s": [20.0, 10.0, 20.0, None, None],
            }
        },
    )
    return open_wh(root)


def test_step_variance_throughput(con) -> None:  # noqa: ANN001
    r = rows(con, "SELECT * FROM step_variance WHERE metric = 'throughput_tokens_per_s'")[0]
    # [100, 110, 90, 100, 300]: mean 140; squared deviations 1600+900+2500+1600+25600 = 32200, /4 -> var 8050
    assert r["n_steps"] == 5 and r["mean"] == pytest.approx(140.0)
    assert r["std"] == pytest.approx(8050**0.5)
    assert r["cv"] == pytest.approx(8050**0.5 / 140)
    assert r["max_over_min"] == pytest.approx(300 / 90)
    # quantile_cont Q1 = 100, Q3 = 110 -> fences [85, 125]: only step 5 (300) is out
    assert r["outlier_steps"] == [5] and r["n_outliers"] == 1


def test_step_series_skips_missing_values(con) -> None:  # noqa: ANN001
    got = rows(con, "SELECT metric, count(*) AS n FROM step_series GROUP BY 1 ORDER BY 1")
    assert got == [
        {"metric": "gen_time_s", "n": 3},
        {"metric": "step_time_s", "n": 4},
        {"metric": "throughput_tokens_per_s", "n": 5},
    ]


def test_stage_breakdown_shares(con) -> None:  # noqa: ANN001
    got = {r["step"]: r for r in rows(con, "SELECT * FROM stage_breakdown")}
    assert set(got) == {1, 2, 3}  # steps 4, 5 have no stage timing at all
    s1 = got[1]  # step 100 s = gen 50 + (10+5+5) inference + 20 training + 10 other
    assert (s1["rollout_share"], s1["inference_share"], s1["training_share"]) == pytest.approx((0.5, 0.2, 0.2))
    assert s1["other_share"] == pytest.approx(0.1) and s1["other_s"] == pytest.approx(10.0)
    s2 = got[2]  # no step time: the stages are the step (30 + 10)
    assert (s2["rollout_share"], s2["training_share"], s2["other_share"]) == pytest.approx((0.75, 0.25, 0.0))
    s3 = got[3]  # stages overlap (40 + 20 > 50): shares of 60 s, other 0
    assert (s3["rollout_share"], s3["training_share"], s3["other_s"]) == pytest.approx((2 / 3, 1 / 3, 0.0))


def test_stage_headline_is_null_not_nan_when_no_time_is_logged(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    stage_run(root, "z", {"steps": {"step": [1, 2], "gen_time_s": [0.0, 0.0], "step_time_s": [0.0, 0.0]}})
    h = headline_frame(open_wh(root), "stage_breakdown").row(0, named=True)
    # 0 s of stage time over 0 s of step time: no share, not NaN (docs/views.md: ratios are NULL on a 0 denominator)
    assert h["steps"] == 2 and h["rollout_share"] is None and h["other_share"] is None
