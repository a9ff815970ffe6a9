"""tool_latency* and multiturn* views on hand-made turns and tool calls."""

from __future__ import annotations

from pathlib import Path

import pytest
from _views_util import open_wh, rows, stage_run


@pytest.fixture
def con(tmp_path: Path):  # noqa: ANN201
    root = tmp_path / "wh"
    stage_run(
        root,
        "t",
        {
            "tool_calls": {
                "step": [0] * 6,
                "sample_id": ["s1", "s1", "s1", "s2", "s2", "s3"],
                "turn": [0, 0, 0, 1, 1, 0],
                "call_index": [0, 1, 2, 0, 1, 0],
                "tool_name": ["search"] * 6,
                "latency_s": [1.0, 2.0, 3.0, 4.0, 100.0, None],
                "status": ["success", "success", "success", "success", "error", None],
            },
            "turns": {
                "step": [0, 0, 0],
                "sample_id": ["s1", "s1", "s2"],
                "turn": [0, 1, 0],
                "prompt_tokens": [100, 300, 100],
                "cached_tokens": [0, 150, 0],
                "completion_tokens": [10, 20, 30],
                "engine_latency_s": [1.0, 3.0, 2.0],
            },
        },
    )
    return open_wh(root)


def test_tool_latency_tail(con) -> None:  # noqa: ANN001
    r = rows(con, "SELECT * FROM tool_latency")[0]
    # latencies [1, 2, 3, 4, 100]: p50 = 3rd, p90 = p99 = 5th; one 'error', NULL status not a failure
    assert (r["calls"], r["failures"], r["timed_calls"]) == (6, 1, 5)
    assert (r["p50"], r["p90"], r["p99"], r["max_s"]) == (3.0, 100.0, 100.0, 100.0)
    assert r["p99_over_p50"] == pytest.approx(100 / 3) and r["failure_share"] == pytest.approx(1 / 6)


def test_tool_latency_by_turn_and_cdf(con) -> None:  # noqa: ANN001
    by = {r["turn"]: r for r in rows(con, "SELECT * FROM tool_latency_by_turn")}
    assert (by[0]["calls"], by[0]["p50"], by[0]["max_s"]) == (4, 2.0, 3.0)  # [1, 2, 3, NULL]
    assert (by[1]["calls"], by[1]["failures"], by[1]["p50"]) == (2, 1, 4.0)
    cdf = rows(con, "SELECT value, ccdf, share_ge FROM tool_latency_cdf ORDER BY value")
    assert [r["ccdf"] for r in cdf] == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.0])
    assert [r["share_ge"] for r in cdf] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])


def test_multiturn(con) -> None:  # noqa: ANN001
    m = rows(con, "SELECT * FROM multiturn")[0]
    # trajectories s1 (2 turns, 3 calls) and s2 (1 turn, 2 calls); s3 has a call but no turn rows -> not a trajectory
    assert (m["trajectories"], m["turns_mean"], m["turns_max"]) == (2, 1.5, 2)
    assert m["tool_calls_mean"] == 2.5
    assert m["prefix_cache_share"] == pytest.approx(150 / 500)
    assert m["turn_latency_p50_s"] == 2.0  # engine latencies [1, 2, 3]
    pmf = {(r["variable"], r["value"]): r["share"] for r in rows(con, "SELECT * FROM multiturn_pmf")}
    assert pmf == {("turns", 1): 0.5, ("turns", 2): 0.5, ("tool_calls", 2): 0.5, ("tool_calls", 3): 0.5}
    by = {r["turn"]: r for r in rows(con, "SELECT * FROM multiturn_by_turn")}
    assert by[0]["n"] == 2 and by[0]["prefix_cache_share"] == 0.0
    assert by[1]["prefix_cache_share"] == 0.5 and by[1]["engine_latency_p50_s"] == 3.0


def test_validation_turns_and_calls_left_out(tmp_path: Path) -> None:
    # training trajectory s1 (1 turn, 1 call of 2 s) and validation trajectory val-s1 (2 turns, 2 calls of 50 s):
    # the readers key a validation record's turns/calls to its 'val-' sample, which has validate = true
    root = tmp_path / "wh"
    stage_run(
        root,
        "v",
        {
            "samples": {"step": [0, 0], "sample_id": ["s1", "val-s1"], "validate": [False, True],
                        "n_turns": [1, 2], "n_tool_calls": [1, 2]},
            "turns": {"step": [0, 0, 0], "sample_id": ["s1", "val-s1", "val-s1"], "turn": [0, 0, 1],
                      "prompt_tokens": [100, 100, 200], "cached_tokens": [0, 0, 100], "engine_latency_s": [1.0, 9.0, 9.0]},
            "tool_calls": {"step": [0, 0, 0], "sample_id": ["s1", "val-s1", "val-s1"], "turn": [0, 0, 0],
                           "call_index": [0, 0, 1], "tool_name": ["search"] * 3, "latency_s": [2.0, 50.0, 50.0]},
        },
    )
    con = open_wh(root)
    assert rows(con, "SELECT calls, max_s FROM tool_latency") == [{"calls": 1, "max_s": 2.0}]
    assert rows(con, "SELECT count(*) AS n FROM tool_latency_cdf")[0]["n"] == 1
    assert rows(con, "SELECT sum(calls) AS n FROM tool_latency_by_turn")[0]["n"] == 1
    assert rows(con, "SELECT sample_id FROM trajectories") == [{"sample_id": "s1"}]
    m = rows(con, "SELECT * FROM multiturn")[0]
    assert (m["trajectories"], m["turn_latency_p99_s"], m["prefix_cache_share"]) == (1, 1.0, 0.0)
    assert rows(con, "SELECT turn, n FROM multiturn_by_turn") == [{"turn": 0, "n": 1}]


def test_turns_without_a_sample_id_keep_their_turn_count(tmp_path: Path) -> None:
    # a source that numbers turns but names no sample: its two turns are one trajectory of 2 turns
    # (a union of keys joined back on sample_id = NULL used to give it n_turns NULL)
    root = tmp_path / "wh"
    stage_run(
        root,
        "n",
        {
            "samples": {"step": [0], "sample_id": ["s1"], "n_turns": [1]},
            "turns": {"step": [0, 0, 0], "sample_id": [None, None, "s1"], "turn": [0, 1, 0],
                      "engine_latency_s": [1.0, 2.0, 3.0]},
        },
    )
    con = open_wh(root)
    got = rows(con, "SELECT sample_id, n_turns, engine_latency_s FROM trajectories ORDER BY sample_id NULLS LAST")
    assert got == [{"sample_id": "s1", "n_turns": 1, "engine_latency_s": 3.0},
                   {"sample_id": None, "n_turns": 2, "engine_latency_s": 3.0}]
