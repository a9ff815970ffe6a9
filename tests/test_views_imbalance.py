"""rank_imbalance on hand-made samples, rank_times and global_seqlen metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from _views_util import open_wh, rows, stage_run

from analyses.views import group


@pytest.fixture
def con(tmp_path: Path):  # noqa: ANN201
    root = tmp_path / "wh"
    stage_run(
        root,
        "r",
        {
            "samples": {
                "step": [1, 1, 1, 1],
                "sample_id": ["a", "b", "c", "v"],
                "dp_rank": [0, 0, 1, 1],
                "prompt_tokens": [5, 5, 5, 5],
                "response_tokens": [10, 30, 20, 999],
                "validate": [False, False, False, True],
            },
            "rank_times": {
                "step": [1, 1],
                "rank": [0, 4],
                "dp_rank": [0, 1],
                "phase": ["reward", "reward"],
                "seconds": [10.0, 26.0],
                "tokens": [100, 300],
            },
            "step_metrics": {
                "step": [1] * 6,
                "metric": ["global_seqlen/max", "global_seqlen/min", "global_seqlen/mean",
                           "global_seqlen/balanced_max", "global_seqlen/balanced_min", "global_seqlen/max"],
                "value": [120.0, 80.0, 100.0, 105.0, 95.0, 1e9],
                "is_validation": [False] * 5 + [True],
            },
        },
    )
    return open_wh(root)


def _get(con, phase: str, quantity: str) -> dict:  # noqa: ANN001
    out = rows(con, f"SELECT * FROM rank_imbalance WHERE phase = '{phase}' AND quantity = '{quantity}'")
    assert len(out) == 1, out
    return out[0]


def test_tokens_per_dp_rank_from_samples(con) -> None:  # noqa: ANN001
    r = _get(con, "rollout", "response_tokens")
    # dp0 = 10 + 30 = 40, dp1 = 20 (the validation sample is left out): mean 30
    assert (r["n_units"], r["max"], r["mean"], r["min"]) == (2, 40.0, 30.0, 20.0)
    assert r["max_over_mean"] == pytest.approx(4 / 3) and r["max_over_min"] == pytest.approx(2.0)
    assert r["max_minus_min"] == 20.0 and r["idle_share"] == pytest.approx(0.25)
    s = _get(con, "rollout", "sequence_tokens")  # + 5 prompt tokens per sample: 50 and 25
    assert (s["max"], s["mean"]) == (50.0, 37.5)


def test_rollout_batch_longest_over_mean(con) -> None:  # noqa: ANN001
    r = _get(con, "rollout_batch", "response_tokens")
    # responses [10, 30, 20]: longest 30, mean 20 -> 1.5; idle decode slots 1 - 20/30
    assert (r["unit"], r["n_units"]) == ("sample", 3)
    assert r["max_over_mean"] == pytest.approx(1.5) and r["idle_share"] == pytest.approx(1 / 3)


def test_rank_times(con) -> None:  # noqa: ANN001
    r = _get(con, "reward", "seconds")
    assert r["max_over_min"] == pytest.approx(2.6) and r["max_over_mean"] == pytest.approx(26 / 18)
    assert r["max_minus_min"] == pytest.approx(16.0)
    t = _get(con, "reward", "tokens")
    assert t["max_over_mean"] == pytest.approx(1.5)


def test_global_seqlen(con) -> None:  # noqa: ANN001
    r = _get(con, "train_batch", "sequence_tokens")  # the validation-line 1e9 is ignored
    assert (r["max"], r["mean"], r["min"], r["max_over_mean"], r["max_minus_min"]) == (120.0, 100.0, 80.0, 1.2, 40.0)
    b = _get(con, "train_batch_balanced", "sequence_tokens")
    assert b["max_over_mean"] == pytest.approx(1.05) and b["max_minus_min"] == pytest.approx(10.0)


def test_busiest_unit_is_named(con) -> None:  # noqa: ANN001
    got = {(r["phase"], r["quantity"]): r["busiest_unit_id"] for r in rows(con, "SELECT * FROM rank_imbalance")}
    # dp 0 generated 10 + 30 = 40 tokens, dp 1 20 (its validation sample does not count); rank 4 took 26 s
    assert got[("rollout", "response_tokens")] == 0 and got[("reward", "seconds")] == 4
    assert got[("rollout_batch", "response_tokens")] is None and got[("train_batch", "sequence_tokens")] is None


def test_worst_step_of_a_tie_is_the_earliest(tmp_path: Path) -> None:
    # steps 3, 1 and 2 equally imbalanced (max/mean 1.6): the headline names step 1 every time, not
    # whichever row DuckDB's threads saw first
    root = tmp_path / "wh"
    stage_run(root, "t", {"rank_times": {"step": [3, 3, 1, 1, 2, 2], "rank": [0, 1] * 3, "dp_rank": [0, 1] * 3,
                                          "phase": ["reward"] * 6, "seconds": [2.0, 8.0, 8.0, 2.0, 2.0, 8.0]}})
    con = open_wh(root)
    sql = "SELECT worst_step, worst_step_busiest FROM (" + group("rank_imbalance").headline_sql + ") WHERE run_id = 't'"
    assert rows(con, sql) == [{"worst_step": 1, "worst_step_busiest": 0}]


@pytest.mark.real_logs
def test_pai_straggler_named(real_file, tmp_path: Path) -> None:  # noqa: ANN001
    from analyses.ingest import ingest_run
    from analyses.views import headline_frame

    ingest_run(real_file("alibaba_pai_minibatch/job_1_norm.csv"), tmp_path / "wh", run_id="pai")
    c = open_wh(tmp_path / "wh")
    h = headline_frame(c, "rank_imbalance").to_dicts()[0]
    # batch_time_norm is 0..1000 per job, not seconds: the quantity says so
    assert (h["phase"], h["quantity"]) == ("iteration", "time_normalised")
    # PROVENANCE: worker 6 becomes a straggler part-way; the worst step (1861, max/mean 2.089) is its
    # (raw: batch_time_norm of iteration 1861, worker 6 the largest); worker 0 is busiest most often (141 of 300)
    assert (h["worst_step"], h["worst_step_busiest"]) == (1861, 6)
    assert (h["most_often_busiest"], h["most_often_busiest_steps"]) == (0, 141)


def test_imbalance_figure_names_the_straggler(con) -> None:  # noqa: ANN001
    from analyses.figures import imbalance_figure

    fig = imbalance_figure(rows_frame(con), "r")
    # the most imbalanced row that names ranks: reward tokens, rank 4 (300 vs a mean of 200; its 26 s vs 18 s is x1.44)
    assert "busiest: rank 4 at step 1 (reward tokens, ×1.50 the mean)" in fig.layout.title.text


def rows_frame(con):  # noqa: ANN001, ANN201
    return con.sql("SELECT * FROM rank_imbalance").pl()
