"""gpu_utilization / gpu_timeline on hand-made telemetry aligned to two step windows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _views_util import open_wh, rows, stage_run

from analyses.views import headline_frame

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def con(tmp_path: Path):  # noqa: ANN201
    root = tmp_path / "wh"
    ts = [T0 + timedelta(seconds=i) for i in range(4)]
    stage_run(
        root,
        "g",
        {
            "gpu_samples": {
                "host": ["h"] * 9,
                "gpu": ["0"] * 4 + ["1"] * 4 + ["0"],
                "ts": ts + ts + [ts[0]],
                "metric": ["gpu_util_pct"] * 8 + ["mem_used_mib"],
                # gpu 0 idles for the first sample only; gpu 1 sits at 50 %; memory is not utilization
                "value": [0.0, 100.0, 100.0, 100.0, 50.0, 50.0, 50.0, 50.0, 1000.0],
            },
            "step_windows": {
                "step": [1, 2],
                "start_ts": [T0, T0 + timedelta(seconds=2)],
                "end_ts": [T0 + timedelta(seconds=2), T0 + timedelta(seconds=4)],
            },
        },
    )
    return open_wh(root)


def test_whole_run_per_gpu(con) -> None:  # noqa: ANN001
    got = {r["gpu"]: r for r in rows(con, "SELECT * FROM gpu_utilization WHERE scope = 'run'")}
    assert got["0"]["mean_util_pct"] == 75.0 and got["0"]["idle_share"] == 0.25  # [0, 100, 100, 100]
    assert got["1"]["mean_util_pct"] == 50.0 and got["1"]["idle_share"] == 0.0
    assert got["0"]["n_samples"] == 4  # the memory sample is not a utilization sample
    assert got["0"]["gpu_spread_pct"] == 25.0 and got["0"]["all_gpus_mean_util_pct"] == 62.5


def test_per_step_alignment(con) -> None:  # noqa: ANN001
    got = {(r["step"], r["gpu"]): r for r in rows(con, "SELECT * FROM gpu_utilization WHERE scope = 'step'")}
    # step 1 = [t0, t0+2): gpu0 [0, 100]; step 2 = [t0+2, t0+4): gpu0 [100, 100]
    assert got[(1, "0")]["mean_util_pct"] == 50.0 and got[(1, "0")]["idle_share"] == 0.5
    assert got[(2, "0")]["mean_util_pct"] == 100.0 and got[(2, "0")]["idle_share"] == 0.0
    assert got[(1, "0")]["gpu_spread_pct"] == 0.0 and got[(2, "1")]["gpu_spread_pct"] == 50.0
    assert got[(1, "1")]["n_gpus"] == 2


def test_timeline_buckets(con) -> None:  # noqa: ANN001
    # span 3 s / 300 points < 1 s, so buckets are 1 s: one point per sample
    got = rows(con, "SELECT gpu, util_pct FROM gpu_timeline ORDER BY gpu, ts")
    assert [r["util_pct"] for r in got] == [0.0, 100.0, 100.0, 100.0, 50.0, 50.0, 50.0, 50.0]


def test_gpu_idle_for_the_whole_run_is_left_out_of_the_run_mean(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    ts = [T0 + timedelta(seconds=i) for i in range(2)]
    # gpu 0 never reaches 5 % (a GPU of the node the job never used); gpus 1 and 2 work
    stage_run(root, "g", {"gpu_samples": {"host": ["h"] * 6, "gpu": ["0", "0", "1", "1", "2", "2"], "ts": ts * 3,
                                          "metric": ["gpu_util_pct"] * 6, "value": [0.0, 4.0, 80.0, 60.0, 90.0, 90.0]}})
    c = open_wh(root)
    got = {r["gpu"]: r for r in rows(c, "SELECT * FROM gpu_utilization WHERE scope = 'run'")}
    assert got["0"]["idle_whole_run"] and not got["1"]["idle_whole_run"]
    r = got["1"]
    assert (r["n_gpus"], r["gpus_used"], r["gpus_idle_whole_run"]) == (3, 2, 1)
    assert r["used_gpus_mean_util_pct"] == 80.0  # (70 + 90) / 2, not (2 + 70 + 90) / 3
    assert r["all_gpus_mean_util_pct"] == pytest.approx(54.0) and r["gpu_spread_pct"] == 20.0
    head = headline_frame(c, "gpu_utilization").to_dicts()[0]
    assert (head["gpus"], head["gpus_used"], head["gpus_idle_whole_run"], head["mean_util_pct"]) == (3, 2, 1, 80.0)
    assert head["idle_share"] == 0.0


def test_single_scrape_has_no_timeline_but_a_utilization(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    # one DCGM scrape without a timestamp, and one with: neither is a time series
    stage_run(root, "a", {"gpu_samples": {"host": ["h"], "gpu": ["0"], "ts": [None], "metric": ["gpu_util_pct"],
                                          "value": [91.0]}})
    stage_run(root, "b", {"gpu_samples": {"host": ["h"], "gpu": ["0"], "ts": [T0], "metric": ["gpu_util_pct"],
                                          "value": [91.0]}})
    c = open_wh(root)
    assert rows(c, "SELECT * FROM gpu_timeline") == []
    assert [r["mean_util_pct"] for r in rows(c, "SELECT * FROM gpu_utilization ORDER BY run_id")] == [91.0, 91.0]


def test_timeline_marks_the_step_starts(con) -> None:  # noqa: ANN001
    from analyses.figures import gpu_timeline_figure

    tl = con.sql("SELECT * FROM gpu_timeline").pl()
    w = con.sql("SELECT run_id, step, start_ts FROM gpu_step_utilization").pl()
    fig = gpu_timeline_figure(tl, "g", w)
    starts = [t for t in fig.data if t.name == "step starts"]
    # the two step windows start at t0 and t0 + 2 s, both inside the telemetry span [t0, t0 + 3 s]
    assert len(starts) == 1 and [x for x in starts[0].x if x is not None] == [T0, T0, T0 + timedelta(seconds=2),
                                                                             T0 + timedelta(seconds=2)]
