"""dcgm-exporter Prometheus text and query_range JSON readers. Expected numbers are counted by
hand from the fixtures; real-file counts with ``grep -c '^DCGM_' file`` and ``wc -l``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.readers.prometheus import PrometheusRangeJsonReader, PrometheusTextReader
from analyses.warehouse import scan_table
from tests._telemetry_util import FIX, run

T0 = datetime(2026, 1, 5, 10, 0, 0, tzinfo=UTC)  # 1767607200 s


def test_scrape_with_timestamps_units_and_labels():
    name, t, s, _ = run(FIX / "scrape_with_timestamps.prom")
    assert name == "prometheus_text"
    # 6 HELP/TYPE lines skipped, 6 samples
    assert t == {"lines": 12, "rows_ok": 6, "rows_rejected": 0, "rows_skipped": 6}
    assert set(s["host"]) == {"node-a"} and sorted(set(s["gpu"])) == ["0", "1"]
    assert (s["ts"] == T0).all()
    sm = dict(s.filter(pl.col("metric") == "sm_active_pct").select("gpu", "value").iter_rows())
    assert sm == {"0": pytest.approx(81.25), "1": pytest.approx(3.125)}  # ratios 0.8125 / 0.03125 x100
    assert s.filter((pl.col("metric") == "mem_used_mib") & (pl.col("gpu") == "0"))["value"][0] == 71234.0


def test_two_concatenated_scrapes():
    _, t, s, _ = run(FIX / "two_concatenated_scrapes.prom")
    # 2 x (4 HELP/TYPE + 4 samples) + 1 blank line
    assert t == {"lines": 17, "rows_ok": 8, "rows_rejected": 0, "rows_skipped": 9}
    util0 = s.filter((pl.col("metric") == "gpu_util_pct") & (pl.col("gpu") == "0")).sort("ts")
    assert util0["value"].to_list() == [97.0, 95.0]
    assert util0["ts"].to_list() == [T0, datetime(2026, 1, 5, 10, 0, 15, tzinfo=UTC)]


def test_partial_scrape_cut_mid_line():
    _, t, s, r = run(FIX / "partial_scrape_cut_mid_line.prom")
    assert t == {"lines": 8, "rows_ok": 3, "rows_rejected": 1, "rows_skipped": 4}
    assert r["line_no"].to_list() == [8] and "cut mid-line" in r["reason"][0]
    assert s["ts"].null_count() == s.height  # no timestamps in the exposition -> null (documented)


def test_counter_reset_is_repaired_and_flagged():
    _, t, s, _ = run(FIX / "counter_reset.prom")
    e = s.filter(pl.col("metric") == "energy_j").sort("ts")
    # raw mJ 1e6, 2e6, 0.5e6 (reset), 1.5e6 -> J 1000, 2000, 2000+500, 2000+1500
    assert e["value"].to_list() == [1000.0, 2000.0, 2500.0, 3500.0]
    assert e["quality"].to_list() == [None, None, "counter_reset", None]
    # '# TYPE ... counter' makes an unknown dcgm field a counter too: 5, 2 (reset) -> 7, 3 -> 8
    x = s.filter(pl.col("metric") == "DCGM_FI_DEV_XID_COUNT_CUSTOM").sort("ts")
    assert x["value"].to_list() == [5.0, 7.0, 8.0]
    assert s.filter(pl.col("quality") == "counter_reset").height == 2


def test_counter_reset_across_chunks(monkeypatch):
    import analyses.readers.prometheus as mod
    from analyses.readers.lines import line_frames

    monkeypatch.setattr(mod, "line_frames", lambda path, batch_lines=0: line_frames(path, 3))
    _, _, s, _ = run(FIX / "counter_reset.prom")
    e = s.filter(pl.col("metric") == "energy_j").sort("ts")
    assert e["value"].to_list() == [1000.0, 2000.0, 2500.0, 3500.0]


def test_clock_jump_and_duplicate_per_series():
    _, t, s, r = run(FIX / "clock_jump_and_duplicate.prom")
    assert dict(zip(r["line_no"], r["reason"], strict=True)) == {
        3: "clock went backwards: timestamp earlier than a previous sample of this GPU",
        4: "duplicate timestamp for this GPU",
    }
    assert s.height == 3  # GPU 1's earlier time is its own series


def test_non_gpu_metrics_nan_mig_and_instance_labels():
    _, t, s, _ = run(FIX / "non_gpu_metrics_and_nan.prom")
    # skipped: HELP, TYPE, two go_* samples (no GPU label), one NaN
    assert t == {"lines": 8, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 5}
    rows = {(h, g, m): v for h, g, _, m, v, *_ in s.iter_rows()}
    assert rows[("node-a", "1", "gpu_util_pct")] == 15.0  # 1.5e+01
    assert rows[("node-b", "2/3", "temp_gpu_c")] == 45.0  # MIG instance 3 of GPU 2
    assert rows[("10.1.2.3", "4", "temp_gpu_c")] == 46.0  # instance without port, minor_number


def test_markdown_embedded_scrape():
    name, t, s, _ = run(FIX / "markdown_embedded_scrape.md")
    assert name == "prometheus_text"
    # 14 lines, 2 DCGM samples; prose, fences, curl, '#' lines and blanks skipped
    assert t == {"lines": 14, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 12}
    assert dict(s.select("metric", "value").iter_rows()) == {"gpu_util_pct": 97.0, "power_w": 612.5}


def test_query_range_matrix():
    name, t, s, r = run(FIX / "query_range_matrix.json")
    assert name == "prometheus_range_json"
    # 8 [ts, v] pairs: one NaN (skipped), one "oops" (rejected), 6 samples
    assert t == {"lines": 8, "rows_ok": 6, "rows_rejected": 1, "rows_skipped": 1}
    assert r["line_no"].to_list() == [8]
    d = s.filter(pl.col("metric") == "dram_active_pct")
    assert d["value"].to_list() == [25.0]  # ratio 0.25 -> 25 %
    assert d["host"].to_list() == ["10.0.0.2"]  # no Hostname label -> instance without port
    assert d["ts"].to_list() == [datetime(2026, 1, 5, 10, 0, 0, 500000, tzinfo=UTC)]
    assert s.filter(pl.col("gpu") == "1")["value"].to_list() == [2.0, 0.0, 1.0]


def test_query_range_error_status_is_a_file_error(tmp_path):
    p = tmp_path / "err.json"
    p.write_text('{"status":"error","errorType":"bad_data","data":{"resultType":"matrix","result":[]}}')
    from analyses.manifest import RunManifest
    from analyses.readers.base import FileContext, UnreadableFile

    with pytest.raises(UnreadableFile):
        list(PrometheusRangeJsonReader().read(FileContext("r", p, p.name, RunManifest())))


def test_sniffers_are_strict():
    text, js = PrometheusTextReader(), PrometheusRangeJsonReader()
    p = Path("x")
    assert not text.sniff("step:1 - loss:0.5\nDCGM is great\n", p)
    assert text.sniff('# TYPE foo gauge\nfoo{a="1"} 3\n', p)
    assert not js.sniff('{"step": 1, "data": {"loss": 1}}\n', p)


@pytest.mark.real_logs
@pytest.mark.parametrize(
    "rel,lines,samples",
    [
        # samples: grep -c '^DCGM_' file ; lines: wc -l (+1 when the last line has no newline)
        ("dcgm_prometheus/ericsson-ccd_T4_scrape.prom", 20, 20),
        ("dcgm_prometheus/upcloud_L40S_scrape.prom", 69, 23),
        ("dcgm_prometheus/ericsson-ccd_accelerator_metrics.md", 36, 20),
        ("dcgm_prometheus/upcloud_accelerator-metrics.md", 107, 23),
    ],
)
def test_real_dcgm_scrapes(real_file, rel, lines, samples):
    name, t, s, _ = run(real_file(rel))
    assert name == "prometheus_text"
    assert t["lines"] == lines and t["rows_ok"] == samples and t["rows_rejected"] == 0
    assert s.height == samples
    assert s["gpu"].unique().to_list() == ["0"]


@pytest.mark.real_logs
def test_real_t4_under_load_values(real_file):
    _, _, s, _ = run(real_file("dcgm_prometheus/ericsson-ccd_T4_scrape.prom"))
    v = dict(s.select("metric", "value").iter_rows())
    # the scrape: GPU_UTIL 91, GR_ENGINE_ACTIVE 0.156205, DRAM_ACTIVE 0.092781, TOTAL_ENERGY 15152422938 mJ
    assert v["gpu_util_pct"] == 91.0
    assert v["gr_engine_active_pct"] == pytest.approx(15.6205)
    assert v["dram_active_pct"] == pytest.approx(9.2781)
    assert v["energy_j"] == pytest.approx(15152422.938)
    assert set(s["host"]) == {"cp-bm14r7"}
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in v  # not in the unit table: kept verbatim


@pytest.mark.real_logs
def test_real_dcgm_dir_ingests(real_file, warehouse):
    d = real_file("dcgm_prometheus")
    rep = ingest_run(d, warehouse)
    assert {f.format for f in rep.files} == {"prometheus_text"}
    # 20 + 23 from the .prom files; the .md files embed the same scrapes, which are stored once (issue 13)
    assert scan_table(warehouse, "gpu_samples").select(pl.len()).collect().item() == 43
    assert sum(f.rows_superseded for f in rep.files) == 43


def test_unit_table_is_documented_and_consistent():
    import analyses.telemetry_units as tu

    suffix = {
        "pct": "_pct",
        "MiB": "_mib",
        "W": "_w",
        "C": "_c",
        "MHz": "_mhz",
        "J": "_j",
        "B/s": "_bytes_per_s",
        "count": "_count",
        "code": "_last",
    }
    table = tu.unit_table()
    assert table["canonical"].is_unique().all()
    for m in tu.METRICS:
        assert m.canonical.endswith(suffix[m.unit]), m.canonical
        assert f"| {m.canonical} " in tu.__doc__, f"{m.canonical} missing from the documented table"
        if m.dcgm_unit:
            assert tu.unit_factor(m.dcgm_unit, m.unit) is not None
    assert tu.unit_factor("ratio", "pct") == 100.0
    assert tu.unit_factor("MB", "MiB") == 1.0  # nvidia-smi's MB is MiB
    assert tu.unit_factor("mJ", "J") == 1e-3
    assert tu.unit_factor("furlongs", "MiB") is None and tu.unit_factor("W", "MiB") is None
    assert tu.stem_metric("pod_gpu_duty_cycle_anon").canonical == "gpu_util_pct"
    assert tu.stem_metric("DRAM_ACTIVE").canonical == "dram_active_pct"
    assert tu.stem_metric("job_1_norm") is None


def test_bad_telemetry_file_never_sinks_the_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scrape.prom").write_bytes((FIX / "scrape_with_timestamps.prom").read_bytes())
    (run_dir / "cut.prom").write_bytes((FIX / "partial_scrape_cut_mid_line.prom").read_bytes())
    (run_dir / "err.json").write_text('{"status":"error","data":{"resultType":"matrix","result":[]}}')
    rep = ingest_run(run_dir, tmp_path / "wh")
    status = {f.path: f.status for f in rep.files}
    assert status == {"scrape.prom": "ok", "cut.prom": "partial", "err.json": "error"}
    # 6 samples from the full scrape + 3 from the cut one
    assert scan_table(tmp_path / "wh", "gpu_samples").select(pl.len()).collect().item() == 9
    rejects = scan_table(tmp_path / "wh", "rejects").collect()
    assert rejects.select("path", "line_no").rows() == [("cut.prom", 8)]


def test_query_range_malformed_series_and_null_pairs_are_rejected_not_fatal(tmp_path):
    # result[0]: a bare number (not a series); result[1]: a good pair, a null entry, a 1-element
    # entry; result[2]: "values" is not a list. By hand: 5 records, 1 sample, 4 rejected.
    p = tmp_path / "q.json"
    p.write_text(
        '{"status":"success","data":{"resultType":"matrix","result":['
        "1,"
        '{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0"},"values":[[1767607200,"50"],null,[1767607215]]},'
        '{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"1"},"values":5}'
        "]}}"
    )
    name, t, s, r = run(p)
    assert name == "prometheus_range_json"
    assert t == {"lines": 5, "rows_ok": 1, "rows_rejected": 4, "rows_skipped": 0}
    assert s.select("gpu", "ts", "metric", "value").rows() == [("0", T0, "gpu_util_pct", 50.0)]
    assert sorted(r["line_no"].to_list()) == [1, 3, 4, 5]


def test_out_of_range_timestamp_rejects_the_line(tmp_path):
    # 99999999999999999 ms is no time (before: an Int64 overflow / failed cast); by hand 1 + 1
    p = tmp_path / "t.prom"
    p.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5 99999999999999999\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} 6 1767607200000\n')
    _, t, s, r = run(p)
    assert t == {"lines": 2, "rows_ok": 1, "rows_rejected": 1, "rows_skipped": 0}
    assert r.select("line_no", "reason").rows() == [(1, "timestamp out of range: 99999999999999999")]
    assert s.select("ts", "value").rows() == [(T0, 6.0)]
