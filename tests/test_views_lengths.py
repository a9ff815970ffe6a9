"""length_quantiles / length_cdf / length_drift on hand-made samples (answers computed by hand)."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
from _views_util import open_wh, rows, stage_run

from analyses.views import view_frame


@pytest.fixture
def wh(tmp_path: Path) -> Path:
    root = tmp_path / "wh"
    # run a: two prompts (g1 with 4 responses, g2 with 1), max_response_length 100, plus a validation
    # sample that must not count
    stage_run(
        root,
        "a",
        {
            "samples": {
                "step": [1, 1, 1, 1, 1, 1],
                "sample_id": ["s1", "s2", "s3", "s4", "s5", "v1"],
                "group_id": ["g1", "g1", "g1", "g1", "g2", "gv"],
                "prompt_tokens": [10, 10, 10, 10, 50, 9999],
                "response_tokens": [10, 20, 30, 100, 40, 5000],
                "validate": [False, False, None, False, False, True],
            }
        },
        task="math",
        max_response_length=100,
    )
    # run b: responses 1..1000 (one per sample, no group ids), prompt 7 each; no max length known
    n = 1000
    stage_run(
        root,
        "b",
        {
            "samples": {
                "step": [1] * n,
                "sample_id": [f"s{i}" for i in range(n)],
                "prompt_tokens": [7] * n,
                "response_tokens": list(range(1, n + 1)),
                "task": ["code"] * n,
            }
        },
        task="math",
    )
    # run c: 8 steps of [90, 100, 110] then [180, 200, 220]: the median doubles at step 5
    steps = [s for s in range(1, 9) for _ in range(3)]
    resp = [v * (2 if s >= 5 else 1) for s in range(1, 9) for v in (90, 100, 110)]
    stage_run(
        root,
        "c",
        {"samples": {"step": steps, "sample_id": [str(i) for i in range(24)], "response_tokens": resp}},
    )
    return root


def test_length_quantiles_by_hand(wh: Path) -> None:
    con = open_wh(wh)
    q = {(r["run_id"], r["kind"]): r for r in rows(con, "SELECT * FROM length_quantiles")}
    a = q[("a", "response")]
    # sorted [10, 20, 30, 40, 100]; quantile_disc = ceil(n*q)-th: p50 = 3rd, p90 = p99 = p999 = 5th
    assert (a["task"], a["n"], a["mean"], a["min"]) == ("math", 5, 40.0, 10)
    assert (a["p50"], a["p90"], a["p99"], a["p999"], a["max"]) == (30, 100, 100, 100, 100)
    assert a["max_over_mean"] == pytest.approx(100 / 40)
    assert a["p99_over_p50"] == pytest.approx(100 / 30)
    assert a["truncation_share"] == pytest.approx(1 / 5)  # 100 >= max_response_length 100
    p = q[("a", "prompt")]
    # one row per (step, group): g1 -> 10, g2 -> 50
    assert (p["n"], p["mean"], p["p50"], p["max"]) == (2, 30.0, 10, 50)
    assert p["truncation_share"] is None  # no max_prompt_length in the run
    b = q[("b", "response")]
    # 1..1000: ceil(1000 q)-th smallest is 1000 q itself
    assert (b["task"], b["p50"], b["p90"], b["p99"], b["p999"], b["max"]) == ("code", 500, 900, 990, 999, 1000)
    assert b["mean"] == 500.5
    assert b["truncation_share"] is None
    assert q[("b", "prompt")]["n"] == 1000  # no group ids: every sample its own prompt


def test_length_cdf_every_value_and_tail(wh: Path) -> None:
    con = open_wh(wh)
    a = rows(con, "SELECT value, n, cdf, ccdf, share_ge, in_tail FROM length_cdf WHERE run_id='a' AND kind='response' ORDER BY value")
    assert [r["value"] for r in a] == [10, 20, 30, 40, 100]
    assert [r["cdf"] for r in a] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert [r["ccdf"] for r in a] == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.0])
    assert [r["share_ge"] for r in a] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    assert not any(r["in_tail"] for r in a)  # nothing above p99 = 100
    b = rows(con, "SELECT count(*) AS n, count(*) FILTER (WHERE in_tail) AS tail FROM length_cdf WHERE run_id='b' AND kind='response'")
    assert b == [{"n": 1000, "tail": 10}]  # one row per distinct value; 991..1000 are above p99 = 990


def test_length_cdf_tail_cut_is_length_quantiles_p99(tmp_path: Path) -> None:
    # length_cdf finds p99 from its value counts (the ceil(n q)-th smallest) instead of reading
    # length_quantiles: on group sizes where n * 0.99 is and is not whole, ties included, both agree
    import numpy as np

    rng = np.random.default_rng(3)
    root = tmp_path / "wh"
    for i, n in enumerate([1, 2, 99, 100, 101, 1000, 1234]):
        lengths = rng.integers(1, 1 + int(rng.integers(3, 400)), n).tolist()
        stage_run(root, f"r{i}", {"samples": {"step": [1] * n, "sample_id": [f"s{j}" for j in range(n)],
                                              "response_tokens": lengths}})
    con = open_wh(root)
    wrong = rows(con, """SELECT c.run_id, c.value FROM length_cdf c JOIN length_quantiles q USING (run_id, task, kind)
                         WHERE c.in_tail IS DISTINCT FROM (c.value > q.p99)""")
    assert wrong == []
    assert rows(con, "SELECT count(DISTINCT run_id) AS n FROM length_cdf WHERE kind = 'response'") == [{"n": 7}]


def test_length_drift_shift_and_slope(wh: Path) -> None:
    d = view_frame(open_wh(wh), "length_drift", runs=["c"]).sort("step")
    assert d["p50"].to_list() == [100] * 4 + [200] * 4
    assert d["p10"].to_list() == [90] * 4 + [180] * 4
    assert d["p90"].to_list() == [110] * 4 + [220] * 4
    # only step 5 is a shift: its windows [2,4] vs [5,7] differ by exactly x2; steps 4 and 6 see x2^(2/3)
    assert d.filter(pl.col("is_shift"))["step"].to_list() == [5]
    assert d.filter(pl.col("step") == 5)["shift_ratio"][0] == pytest.approx(2.0)
    assert d.filter(pl.col("step") == 4)["shift_ratio"][0] == pytest.approx(2 ** (2 / 3))
    assert d.filter(pl.col("step") <= 3)["shift_ratio"].null_count() == 3  # before-window not full
    # OLS slope of ln p50 on step: ln2 * sum_{5..8}(x - 4.5) / sum_{1..8}(x - 4.5)^2 = ln2 * 8 / 42
    assert d["run_log_p50_slope_per_step"][0] == pytest.approx(math.log(2) * 8 / 42)


def test_view_frame_filters_runs(wh: Path) -> None:
    assert set(view_frame(open_wh(wh), "length_quantiles", runs=["a", "c"])["run_id"]) == {"a", "c"}
    with pytest.raises(KeyError):
        view_frame(open_wh(wh), "no_such_view")


def test_partial_step_is_shown_but_left_out_of_quantiles_and_slope(tmp_path: Path) -> None:
    # steps 1 and 2: 4 responses each; step 3: 1 response (< 0.5 x median(4, 4, 1) = 2): partial
    root = tmp_path / "wh"
    stage_run(root, "p", {"samples": {"step": [1] * 4 + [2] * 4 + [3], "sample_id": [str(i) for i in range(9)],
                                      "response_tokens": [10, 10, 10, 10, 20, 20, 20, 20, 1000]}})
    c = open_wh(root)
    q = rows(c, "SELECT n, max, mean, n_partial FROM length_quantiles WHERE kind = 'response'")[0]
    assert (q["n"], q["max"], q["mean"], q["n_partial"]) == (8, 20, 15.0, 1)
    d = rows(c, "SELECT step, partial, run_log_p50_slope_per_step AS slope FROM length_drift ORDER BY step")
    assert [(r["step"], r["partial"]) for r in d] == [(1, False), (2, False), (3, True)]
    # slope of ln p50 over steps 1-2 only: ln 20 - ln 10
    assert all(r["slope"] == pytest.approx(math.log(2)) for r in d)
