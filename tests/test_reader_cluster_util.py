"""Long and wide cluster utilization tables (Alibaba GenAI pod duty cycle, AcmeTrace style), and
tar.gz archives of them. Fixture numbers counted by hand; real-file numbers as noted."""

from __future__ import annotations

import io
import shutil
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.readers.base import UnreadableFile
from analyses.readers.cluster_util import ClusterUtilLongReader, ClusterUtilWideReader
from analyses.warehouse import scan_table
from tests._telemetry_util import FIX, run


def test_acmetrace_wide():
    name, t, s, r = run(FIX / "acmetrace_wide.csv")
    assert name == "cluster_util_wide"
    # header skipped; line 4 has 'n/a?' (non-numeric), line 5 repeats 00:00:15 (duplicate time)
    assert t == {"lines": 5, "rows_ok": 2, "rows_rejected": 2, "rows_skipped": 1}
    assert dict(zip(r["line_no"], r["reason"], strict=True)) == {
        4: "non-numeric value",
        5: "duplicate timestamp for this GPU",
    }
    # line 2: 3 cells, line 3: 2 cells (one empty)
    assert s.height == 5
    first = s.filter(pl.col("ts") == datetime(2023, 7, 1, tzinfo=UTC))
    got = {(h, g): v for h, g, v in first.select("host", "gpu", "value").iter_rows()}
    assert got == {("10.0.0.1", "0"): 95.0, ("10.0.0.1", "1"): 3.0, ("10.0.0.2", "0"): 50.0}
    assert set(s["metric"]) == {"acmetrace_wide"}  # a file name that names no metric is kept verbatim


def test_wide_metric_from_file_name(tmp_path):
    # AcmeTrace names files after the dcgm field: GPU_UTIL in %, SM_ACTIVE as a 0..1 ratio
    util = tmp_path / "GPU_UTIL.csv"
    util.write_text("Time,10.0.0.1-0\n2023-07-01 00:00:00,42\n")
    sm = tmp_path / "SM_ACTIVE.csv"
    sm.write_text("Time,10.0.0.1-0,10.0.0.1-1\n1688169600,0.5,0.25\n")
    _, _, s, _ = run(util)
    assert s.select("metric", "value").row(0) == ("gpu_util_pct", 42.0)
    _, _, s, _ = run(sm)
    assert sorted(s["value"]) == [25.0, 50.0] and set(s["metric"]) == {"sm_active_pct"}
    assert s["ts"][0] == datetime(2023, 7, 1, tzinfo=UTC)  # epoch seconds


def test_long_util_quirks():
    name, t, s, r = run(FIX / "long_util_quirks.csv")
    assert name == "cluster_util_long"
    # header + blank skipped; 'abc' value, a repeated (pod-a, 1662858777), a 4-field line rejected
    assert t == {"lines": 8, "rows_ok": 3, "rows_rejected": 3, "rows_skipped": 2}
    assert sorted(r["line_no"]) == [5, 6, 8]
    assert s.sort("host", "ts")["value"].to_list() == [10.0, 11.0, 20.0]
    assert set(s["gpu"]) == {"all"}


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_tar_gz_members_are_read(tmp_path):
    data = (FIX / "long_util_quirks.csv").read_bytes()
    arc = tmp_path / "pod_gpu_duty_cycle.tar.gz"
    _tar(arc, {"README.txt": b"hello\nworld\n", "pod_gpu_duty_cycle.csv": data})
    name, t, s, r = run(arc)
    assert name == "cluster_util_long"
    # README: 2 lines skipped; the CSV member as in test_long_util_quirks, line numbers after the README's
    assert t == {"lines": 10, "rows_ok": 3, "rows_rejected": 3, "rows_skipped": 4}
    assert sorted(r["line_no"]) == [7, 8, 10]
    assert set(s["metric"]) == {"gpu_util_pct"}  # member name says duty cycle


def test_tar_gz_member_equal_to_extracted_sibling_is_skipped(tmp_path):
    data = (FIX / "long_util_quirks.csv").read_bytes()
    arc = tmp_path / "util.tar.gz"
    _tar(arc, {"util.csv": data})
    (tmp_path / "util.csv").write_bytes(data)
    both = frozenset({arc, tmp_path / "util.csv"})
    _, t, s, _ = run(arc, run_files=both)
    assert t == {"lines": 8, "rows_ok": 0, "rows_rejected": 0, "rows_skipped": 8} and s.height == 0
    # the copy lies beside the archive on disk but is not one of the run's files: read the archive
    _, t, s, _ = run(arc, run_files=frozenset({arc}))
    assert t["rows_ok"] == 3
    (tmp_path / "util.csv").write_bytes(data.replace(b"20.0", b"21.0"))  # same size, other bytes
    _, t, s, _ = run(arc, run_files=both)
    assert t["rows_ok"] == 3


def test_wide_header_naming_one_gpu_twice_fails_the_file(tmp_path):
    # found by the long fuzz run: polars raised DuplicateError from inside the reader
    p = tmp_path / "wide_dup.csv"
    p.write_text("Time,10.0.0.1-0,10.0.0.1-0,10.0.0.2-0\n2023-07-01 00:00:00,95.0,3.0,50\n")
    with pytest.raises(UnreadableFile, match="header names column '10.0.0.1-0' twice"):
        run(p)


def test_sniffers_are_strict():
    lng, wide = ClusterUtilLongReader(), ClusterUtilWideReader()
    p = Path("x")
    assert not lng.sniff("_step,actor/loss\n1,2\n", p)
    assert not lng.sniff(",worker,gpu,time,batch_time_norm\n", p)
    assert not wide.sniff("time,loss,reward\n1,2,3\n", p)
    assert wide.sniff("Time,10.0.0.1,10.0.0.2\n", p)


@pytest.mark.real_logs
def test_real_alibaba_pod_duty_cycle(real_file):
    name, t, s, _ = run(real_file("alibaba_genai_gpu_util/pod_gpu_duty_cycle_anon.csv"))
    assert name == "cluster_util_long"
    # wc -l -> 157418 = header + 157417 rows (PROVENANCE: 157 417 rows, 143 pods, 1 441 times 57 s apart)
    assert t == {"lines": 157418, "rows_ok": 157417, "rows_rejected": 0, "rows_skipped": 1}
    assert s.height == 157417
    assert s["host"].n_unique() == 143
    assert s["ts"].n_unique() == 1441
    assert s["ts"].min() == datetime.fromtimestamp(1662858720, UTC)
    assert s["ts"].max() == datetime.fromtimestamp(1662940800, UTC)
    assert set(s["metric"]) == {"gpu_util_pct"} and s["value"].max() <= 100.0


@pytest.mark.real_logs
def test_real_alibaba_dir_with_archive_ingests_once(real_file, warehouse, tmp_path):
    d = real_file("alibaba_genai_gpu_util")
    rep = ingest_run(d, warehouse)
    files = {f.path: f for f in rep.files}
    # the archive holds the CSV beside it byte for byte (PROVENANCE): skipped whole, counted
    arc = files["pod_gpu_duty_cycle_anon.tar.gz"]
    assert (arc.format, arc.lines, arc.rows_skipped, arc.rows_out) == ("cluster_util_long", 157418, 157418, 0)
    assert scan_table(warehouse, "gpu_samples").select(pl.len()).collect().item() == 157417
    # the archive alone ingests
    solo = tmp_path / "solo"
    solo.mkdir()
    shutil.copy(d / "pod_gpu_duty_cycle_anon.tar.gz", solo)
    rep = ingest_run(solo, warehouse)
    assert rep.files[0].rows_out == 157417 and rep.files[0].rows_ok == 157417
    # and so does the archive given as a single-file run, its extracted copy beside it on disk
    rep = ingest_run(d / "pod_gpu_duty_cycle_anon.tar.gz", warehouse, run_id="archive-alone")
    assert (rep.files[0].rows_ok, rep.files[0].rows_out, rep.files[0].rows_skipped) == (157417, 157417, 1)


def test_gzipped_csv_and_small_stream_blocks(tmp_path, monkeypatch):
    import gzip

    import analyses.telemetry_units as tu

    monkeypatch.setattr(tu, "STREAM_BLOCK", 16)  # cut lines across many blocks
    p = tmp_path / "util.csv.gz"
    p.write_bytes(gzip.compress((FIX / "long_util_quirks.csv").read_bytes()))
    _, t, s, r = run(p)
    assert t == {"lines": 8, "rows_ok": 3, "rows_rejected": 3, "rows_skipped": 2}
    assert sorted(r["line_no"]) == [5, 6, 8]
    assert s.sort("host", "ts")["value"].to_list() == [10.0, 11.0, 20.0]
    # a plain .csv.gz is read by analyses.readers.lines; archive members are the stream path
    # that STREAM_BLOCK cuts: the same numbers as test_long_util_quirks
    arc = tmp_path / "pod_gpu_duty_cycle.tar.gz"
    _tar(arc, {"pod_gpu_duty_cycle.csv": (FIX / "long_util_quirks.csv").read_bytes()})
    _, t, s, r = run(arc)
    assert t == {"lines": 8, "rows_ok": 3, "rows_rejected": 3, "rows_skipped": 2}
    assert sorted(r["line_no"]) == [5, 6, 8]
    assert s.sort("host", "ts")["value"].to_list() == [10.0, 11.0, 20.0]


def test_absurd_epoch_rejects_its_line_not_the_file(tmp_path):
    # 1e30 and inf are numbers no epoch can be: before, the Int64 cast of the whole column
    # failed the file; by hand: header skipped, lines 3 and 4 rejected, 2 samples kept
    p = tmp_path / "GPU_UTIL.csv"
    p.write_text("Time,10.0.0.1-0\n1688169600,42\n1e30,43\ninf,44\n1688169700,45\n")
    _, t, s, r = run(p)
    assert t == {"lines": 5, "rows_ok": 2, "rows_rejected": 2, "rows_skipped": 1}
    assert dict(zip(r["line_no"], r["reason"], strict=True)) == {3: "unparseable timestamp", 4: "unparseable timestamp"}
    assert s["value"].to_list() == [42.0, 45.0]
    # the same in a long table whose time column mixes text and numbers (the per-cell path)
    p = tmp_path / "pod_gpu_duty_cycle.csv"
    p.write_text("value,timestamp,container_ip\n12,2022-09-11 01:12:00,10.0.0.1\n13,1e300,10.0.0.1\n")
    _, t, s, r = run(p)
    assert t == {"lines": 3, "rows_ok": 1, "rows_rejected": 1, "rows_skipped": 1}
    assert r["line_no"].to_list() == [3] and s["value"].to_list() == [12.0]
