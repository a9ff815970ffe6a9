"""Per-worker iteration times (Alibaba PAI mini-batch-time) into rank_times."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses.readers.worker_times import WorkerTimesReader
from tests._telemetry_util import FIX, run


def test_worker_times_quirks():
    name, t, rows, r = run(FIX / "worker_times_quirks.csv", table="rank_times")
    assert name == "worker_times"
    # header skipped; (iteration 11, worker 0) twice -> 2nd rejected; 'x' iteration; a 4-field line
    assert t == {"lines": 8, "rows_ok": 4, "rows_rejected": 3, "rows_skipped": 1}
    assert dict(zip(r["line_no"], r["reason"], strict=True)) == {
        6: "duplicate (worker, iteration)",
        7: "iteration is not an integer",
        8: "expected 5 fields, got 4",
    }
    got = {(s, k): v for s, k, v in rows.select("step", "rank", "seconds").iter_rows()}
    assert got == {(1, 0): 476.0, (1, 1): 509.0, (11, 0): 480.0, (11, 1): 900.0}
    assert set(rows["phase"]) == {"iteration"}
    assert set(rows["source"]) == {"worker_times:normalised_0_1000"}


def test_unnormalised_batch_time_is_seconds(tmp_path):
    p = tmp_path / "job.csv"
    p.write_text("worker,time,batch_time\n0,1,0.75\n")
    _, _, rows, _ = run(p, table="rank_times")
    assert rows.select("seconds", "source").row(0) == (0.75, "worker_times")


def test_sniffer_is_strict():
    r = WorkerTimesReader()
    assert not r.sniff("step,rank,loss\n", Path("x"))
    assert r.sniff(",worker,gpu,time,batch_time_norm\n0,0,25,1,476\n", Path("x"))


@pytest.mark.real_logs
def test_real_pai_job_1(real_file):
    name, t, rows, _ = run(real_file("alibaba_pai_minibatch/job_1_norm.csv"), table="rank_times")
    assert name == "worker_times"
    # wc -l -> 3001 = header + 10 workers x 300 iterations
    assert t == {"lines": 3001, "rows_ok": 3000, "rows_rejected": 0, "rows_skipped": 1}
    assert rows["rank"].n_unique() == 10 and rows["step"].n_unique() == 300
    assert (rows["step"].min(), rows["step"].max()) == (1, 2988)  # iterations sampled every ~10
    # the straggler: iterations where one worker is > 1.3x the median of its iteration are all
    # worker 6's, 8 of them between iterations 1811 and 1941 (computed with polars on the CSV)
    slow = rows.with_columns(med=pl.col("seconds").median().over("step")).filter(
        pl.col("seconds") > 1.3 * pl.col("med")
    )
    assert set(slow["rank"]) == {6} and slow.height == 8
    assert (slow["step"].min(), slow["step"].max()) == (1811, 1941)
