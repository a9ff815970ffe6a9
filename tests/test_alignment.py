"""Step windows and per-step GPU utilization. Every expected number is computed by hand in the
comments from the small frames built here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from analyses.alignment import (
    METHOD_CUMSUM,
    METHOD_LOG_PREV,
    METHOD_LOG_TS,
    derive_step_windows,
)
from analyses.api import PolyTrace
from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers import reader_by_name
from analyses.schema import STEP_WINDOWS, STEPS
from analyses.warehouse import scan_table
from tests._telemetry_util import FIX
from tests._views_util import stage_run


def t(h: int, m: int, s: float) -> datetime:
    return datetime(2026, 1, 5, h, m, tzinfo=UTC) + timedelta(seconds=s)


def rows(w: pl.DataFrame) -> dict[int, tuple]:
    return {
        r["step"]: (r["start_ts"], r["end_ts"], r["rollout_end_ts"], r["method"])
        for r in w.iter_rows(named=True)
    }


def test_windows_from_log_timestamps():
    steps = pl.DataFrame(
        {
            "step": [1, 2, 3],
            "ts": [t(10, 0, 10), t(10, 0, 30), t(10, 1, 0)],
            "step_time_s": [10.0, None, 25.0],
            "gen_time_s": [4.0, 5.0, 30.0],
        }
    )
    w = derive_step_windows(steps, RunManifest(started_at=t(9, 0, 0)))  # ts wins over started_at
    assert w.columns == list(STEP_WINDOWS.columns)
    assert rows(w) == {
        1: (t(10, 0, 0), t(10, 0, 10), t(10, 0, 4), METHOD_LOG_TS),  # 10:00:10 - 10 s; + gen 4 s
        2: (t(10, 0, 10), t(10, 0, 30), t(10, 0, 15), METHOD_LOG_PREV),  # no step time: previous ts
        3: (t(10, 0, 35), t(10, 1, 0), t(10, 1, 0), METHOD_LOG_TS),  # gen 30 s > step 25 s: capped at end
    }


def test_first_step_without_step_time_has_no_window_and_untimed_steps_are_left_out():
    steps = pl.DataFrame(
        {"step": [1, 2, 3], "ts": [t(10, 0, 10), None, t(10, 0, 50)], "step_time_s": [None, 5.0, None]}
    )
    w = derive_step_windows(steps, RunManifest(started_at=t(9, 0, 0)))
    # step 1: no step time, no previous ts; step 2: no ts (no mixing with started_at);
    # step 3: previous *logged* step is 1
    assert rows(w) == {3: (t(10, 0, 10), t(10, 0, 50), None, METHOD_LOG_PREV)}


def test_windows_from_started_at_and_cumulative_step_times():
    steps = pl.DataFrame(
        {"step": [2, 1, 3, 4], "step_time_s": [20.0, 10.0, None, 5.0], "gen_time_s": [None, 2.5, 1.0, 1.0]}
    )
    w = derive_step_windows(steps, RunManifest(started_at=t(12, 0, 0)))
    # step order 1, 2: ends at 12:00:10 and 12:00:30; step 3 has no time -> chain stops (3 and 4 unknown)
    assert rows(w) == {
        1: (t(12, 0, 0), t(12, 0, 10), t(12, 0, 2.5), METHOD_CUMSUM),
        2: (t(12, 0, 10), t(12, 0, 30), None, METHOD_CUMSUM),
    }


def test_no_timing_information_gives_no_windows():
    assert derive_step_windows(STEPS.empty(), RunManifest()).height == 0
    steps = pl.DataFrame({"step": [1], "step_time_s": [3.0]})
    assert derive_step_windows(steps, RunManifest()).height == 0  # no started_at, no ts
    assert derive_step_windows(STEPS.empty(), None).height == 0


def test_a_run_without_steps_derives_its_empty_tables_without_a_query(monkeypatch: pytest.MonkeyPatch):
    """The ingest derives steps and step windows while the run's samples are written on the staging
    writer thread; a ``LazyFrame.collect`` (the "auto" engine) waited for that write's hold on
    Polars' streaming engine (~30-40 ms of a run of packed step files), so a run without steps
    uses none."""
    from analyses.schema import conform
    from analyses.steps import StepsAccumulator

    def refused(*_a, **_k):
        raise AssertionError("LazyFrame.collect called")

    monkeypatch.setattr(pl.LazyFrame, "collect", refused)
    steps = StepsAccumulator().finish(n_gpus=8)
    assert steps.height == 0 and steps.schema == STEPS.empty().schema
    for manifest in (None, RunManifest(), RunManifest(started_at=t(10, 0, 0))):
        w = derive_step_windows(steps, manifest)
        assert w.height == 0 and w.schema == STEP_WINDOWS.empty().schema
    monkeypatch.undo()  # the typed empty frames are those the queries gave
    assert steps.equals(conform(pl.DataFrame(schema={"step": pl.Int64}), STEPS))
    assert w.equals(conform(pl.DataFrame(schema={"step": pl.Int64}), STEP_WINDOWS))


def _samples() -> pl.LazyFrame:
    util = [
        # step 1 [10:00:00, 10:00:10), rollout until 10:00:04
        ("0", 0, 100.0),
        ("1", 0, 50.0),
        ("0", 2, 80.0),
        ("1", 2, 0.0),
        ("0", 5, 0.0),
        ("1", 5, 0.0),
        ("0", 8, 2.0),
        ("1", 8, 60.0),
        # step 2 [10:00:10, 10:00:30), no rollout end
        ("0", 12, 10.0),
        # outside every window
        ("0", 40, 99.0),
        ("1", -1, 99.0),
    ]
    df = pl.DataFrame(
        {
            "run_id": "r",
            "host": "h",
            "gpu": [g for g, _, _ in util],
            "ts": [t(10, 0, s) for _, s, _ in util],
            "metric": "gpu_util_pct",
            "value": [v for *_, v in util],
        }
    )
    noise = pl.DataFrame(
        {
            "run_id": ["r", "r"],
            "host": "h",
            "gpu": "0",
            "ts": [t(10, 0, 1), None],
            "metric": ["power_w", "gpu_util_pct"],
            "value": [300.0, 0.0],
        }
    )
    return pl.concat([df, noise]).lazy()


def _windows() -> pl.LazyFrame:
    return pl.DataFrame(
        {
            "run_id": ["r", "r", "q"],
            "step": [1, 2, 1],
            "start_ts": [t(10, 0, 0), t(10, 0, 10), t(10, 0, 0)],
            "end_ts": [t(10, 0, 10), t(10, 0, 30), t(10, 0, 10)],
            "rollout_end_ts": [t(10, 0, 4), None, None],
            "method": METHOD_LOG_TS,
        }
    ).lazy()


def _stage(root: Path) -> None:
    """_samples and _windows as two runs of a warehouse (r with telemetry, q without)."""
    samples, windows = _samples().collect(), _windows().collect()
    for rid in ("r", "q"):
        stage_run(root, rid, {"gpu_samples": samples.filter(pl.col("run_id") == rid).drop("run_id"),
                              "step_windows": windows.filter(pl.col("run_id") == rid).drop("run_id")})


def test_step_gpu_utilization_by_hand(tmp_path: Path):
    _stage(tmp_path / "wh")
    out = PolyTrace(tmp_path / "wh").view("gpu_step_utilization")
    r = {(x["run_id"], x["step"]): x for x in out.iter_rows(named=True)}
    s1 = r[("r", 1)]
    assert (s1["n_samples"], s1["n_gpus"]) == (8, 2)
    assert s1["mean_util_pct"] == pytest.approx(292 / 8)  # 100+50+80+0+0+0+2+60
    assert s1["idle_share"] == pytest.approx(4 / 8)  # 0, 0, 0, 2 are < 5 %
    assert s1["rollout_n_samples"] == 4  # samples at :00 and :02
    assert s1["rollout_mean_util_pct"] == pytest.approx((100 + 50 + 80 + 0) / 4)
    assert s1["rollout_idle_share"] == pytest.approx(1 / 4)
    # moments: :00 100/75, :02 80/40, :05 mean 0 (left out), :08 60/31
    assert s1["spread_moments"] == 3
    assert s1["spread_max_over_mean"] == pytest.approx((100 / 75 + 2.0 + 60 / 31) / 3)
    assert s1["spread_max_over_mean_max"] == pytest.approx(2.0)
    s2 = r[("r", 2)]
    assert (s2["n_samples"], s2["n_gpus"], s2["mean_util_pct"], s2["idle_share"]) == (1, 1, 10.0, 0.0)
    assert s2["rollout_n_samples"] == 0 and s2["rollout_mean_util_pct"] is None
    assert s2["spread_moments"] == 0 and s2["spread_max_over_mean"] is None
    q1 = r[("q", 1)]  # a window without telemetry still gets a row
    assert q1["n_samples"] == 0 and q1["mean_util_pct"] is None


def test_a_gpu_idle_for_the_whole_run_is_left_out_of_each_step(tmp_path: Path):
    samples = _samples().collect()
    idle = samples.filter(pl.col("gpu") == "0").with_columns(gpu=pl.lit("7"), value=pl.lit(0.0))
    stage_run(tmp_path / "wh", "r", {"gpu_samples": pl.concat([samples, idle]).drop("run_id"),
                                     "step_windows": _windows().collect().filter(pl.col("run_id") == "r").drop("run_id")})
    s1 = PolyTrace(tmp_path / "wh").view("gpu_step_utilization").filter(pl.col("step") == 1).row(0, named=True)
    assert (s1["n_samples"], s1["n_gpus"], s1["mean_util_pct"]) == (8, 2, pytest.approx(292 / 8))


def test_ingest_writes_step_windows_and_utilization_joins(tmp_path):
    assert reader_by_name("verl_jsonl").name == "verl_jsonl"
    run = tmp_path / "run1"
    run.mkdir()
    (run / "run.toml").write_text('started_at = "2026-01-05T10:00:00Z"\n')
    # two steps of 20 s and 30 s with generation 5 s and 10 s -> windows [10:00:00, 10:00:20),
    # [10:00:20, 10:00:50); rollouts end 10:00:05 and 10:00:30
    (run / "metrics.jsonl").write_text(
        '{"step":1,"data":{"timing_s/gen":5.0,"timing_s/step":20.0}}\n'
        '{"step":2,"data":{"timing_s/gen":10.0,"timing_s/step":30.0}}\n'
    )
    (run / "smi.csv").write_bytes((FIX / "clock_jump.csv").read_bytes())
    wh = tmp_path / "wh"
    ingest_run(run, wh)
    w = scan_table(wh, "step_windows").collect().sort("step")
    assert w["method"].to_list() == [METHOD_CUMSUM, METHOD_CUMSUM]
    assert w["end_ts"].to_list() == [t(10, 0, 20), t(10, 0, 50)]
    assert w["rollout_end_ts"].to_list() == [t(10, 0, 5), t(10, 0, 30)]
    out = PolyTrace(wh).view("gpu_step_utilization")
    # clock_jump.csv kept GPU 0 at 10:00:00 (10 %), :15 (20 %), :30 (40 %) and GPU 1 at :20 (50 %)
    by_step = {x["step"]: x for x in out.iter_rows(named=True)}
    assert by_step[1]["n_samples"] == 2 and by_step[1]["mean_util_pct"] == pytest.approx(15.0)
    assert by_step[2]["n_samples"] == 2 and by_step[2]["mean_util_pct"] == pytest.approx(45.0)
    assert by_step[2]["rollout_n_samples"] == 1  # GPU 1 at :20 is before 10:00:30
