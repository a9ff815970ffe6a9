"""nvidia-smi --query-gpu CSV and dmon readers: fixtures named after their quirk, expected
numbers counted by hand from the fixture text (and the real log with wc/grep as noted)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from analyses.manifest import RunManifest
from analyses.readers.nvidia_smi import NvidiaSmiCsvReader, NvidiaSmiDmonReader
from tests._telemetry_util import FIX, run, value


def test_interleaved_gpus_with_index():
    name, t, s, r = run(FIX / "interleaved_gpus_with_index.csv")
    assert name == "nvidia_smi_csv"
    # 1 header + 4 data lines; 4 metric columns (name and pci.bus_id are attributes) x 4 lines
    assert t == {"lines": 5, "rows_ok": 4, "rows_rejected": 0, "rows_skipped": 1}
    assert s.height == 16
    assert sorted(s["gpu"].unique()) == ["0", "1"]
    assert set(s["metric"]) == {"gpu_util_pct", "mem_used_mib", "power_w", "temp_gpu_c"}
    assert value(s, "1", "power_w", "2026-01-05 10:00:01.002") == 59.5
    assert value(s, "0", "gpu_util_pct", "2026-01-05 10:00:00") == 95.0
    assert set(s["host"]) == {"interleaved_gpus_with_index"}  # file stem: nvidia-smi prints no host


def test_units_in_values_converted_to_canonical_units():
    _, t, s, _ = run(FIX / "units_in_values.csv")
    assert t["rows_ok"] == 2 and s.height == 10
    assert value(s, "0", "mem_used_mib", "2026-02-02 01:07:37.100") == 17092.0
    assert value(s, "0", "mem_used_mib", "2026-02-02 01:07:52.106") == 2048.0  # "2 GiB" in the cell wins
    assert value(s, "0", "power_w", "2026-02-02 01:07:52.106") == pytest.approx(61.5)  # "61500 mW"
    assert value(s, "0", "sm_clock_mhz", "2026-02-02 01:07:37.100") == 1410.0
    assert s["gpu"].unique().to_list() == ["0"]  # no index column -> one GPU "0"


def test_na_values_write_no_sample_but_count_as_parsed():
    _, t, s, r = run(FIX / "na_values.csv")
    # line 2: util 12 only; line 3: all N/A; line 4: util, power, temp.memory; fan never;
    # line 5: all N/A at a time *before* line 4 (writes nothing, so not a clock jump); line 6: util 9
    assert t == {"lines": 6, "rows_ok": 5, "rows_rejected": 0, "rows_skipped": 1}
    assert s.height == 5
    assert "fan_speed_pct" not in set(s["metric"])
    assert value(s, "0", "temp_mem_c", "2026-01-05 10:00:30") == 55.0
    assert value(s, "0", "gpu_util_pct", "2026-01-05 10:00:45") == 9.0


def test_nounits_header_uses_header_units_and_ignores_attributes():
    _, t, s, _ = run(FIX / "nounits_header.csv")
    assert t["rows_ok"] == 2 and t["rows_rejected"] == 0
    # pstate (P0) and the throttle bitmask (0x...) are attributes, not samples
    assert set(s["metric"]) == {"gpu_util_pct", "mem_used_mib", "power_w"}
    assert value(s, "1", "mem_used_mib", "2026-01-05 10:00:00") == 39000.0


def test_restarted_logger_repeated_header_switches_columns():
    _, t, s, _ = run(FIX / "restarted_logger_repeated_header.csv")
    # 2 header lines + 1 blank skipped; 4 data lines, 2 metrics each
    assert t == {"lines": 7, "rows_ok": 4, "rows_rejected": 0, "rows_skipped": 3}
    assert s.height == 8
    assert s.filter(pl.col("metric") == "power_w")["value"].to_list() == [100.0, 110.0]
    assert s.filter(pl.col("metric") == "mem_used_mib")["value"].to_list() == [100.0, 200.0]


def test_clock_jump_rejects_the_backwards_line_only():
    _, t, s, r = run(FIX / "clock_jump.csv")
    assert t["rows_rejected"] == 1 and t["rows_ok"] == 4
    assert r["line_no"].to_list() == [4]  # 09:59:50 after 10:00:15 for GPU 0
    assert r["reason"][0].startswith("clock went backwards")
    # GPU 1 at 10:00:20 is its own series: not a jump
    assert s.filter(pl.col("gpu") == "1").height == 1


def test_duplicate_timestamps_first_wins():
    _, t, s, r = run(FIX / "duplicate_timestamps.csv")
    assert r["line_no"].to_list() == [4]
    assert r["reason"][0] == "duplicate timestamp for this GPU"
    assert s.height == 3


def test_unknown_unit_bad_value_cut_line_and_bad_timestamp_are_rejected():
    _, t, s, r = run(FIX / "unknown_unit_and_cut_line.csv")
    assert t == {"lines": 6, "rows_ok": 1, "rows_rejected": 4, "rows_skipped": 1}
    reasons = dict(zip(r["line_no"].to_list(), r["reason"].to_list(), strict=True))
    assert reasons[3] == "unknown unit 'furlongs' for memory.used"
    assert reasons[4].startswith("non-numeric value")
    assert reasons[5] == "expected 4 fields, got 3"
    assert reasons[6].startswith("unparseable timestamp")
    assert s.height == 2


def test_timezone_tag_converts_naive_local_times():
    m = RunManifest(tags={"timezone": "America/Toronto"})
    _, _, s, _ = run(FIX / "clock_jump.csv", m)
    # 10:00 in Toronto (EST, UTC-5) on 5 Jan is 15:00 UTC
    assert s["ts"].min() == datetime(2026, 1, 5, 15, 0, tzinfo=UTC)


def test_small_chunks_keep_state_across_batches(monkeypatch):
    import analyses.readers.nvidia_smi as mod

    def tiny(path, batch_lines=2):
        from analyses.readers.lines import line_frames

        return line_frames(path, 2)

    monkeypatch.setattr(mod, "line_frames", tiny)
    _, t, s, r = run(FIX / "clock_jump.csv")
    assert r["line_no"].to_list() == [4] and s.height == 4
    _, t, s, _ = run(FIX / "restarted_logger_repeated_header.csv")
    assert s.height == 8 and t["rows_skipped"] == 3


def test_dmon_with_date_time():
    name, t, s, r = run(FIX / "dmon_with_date_time.txt")
    assert name == "nvidia_smi_dmon"
    # 4 '#' lines skipped; 6 data lines, the last one cut (7 of 12 fields) -> rejected
    assert t == {"lines": 10, "rows_ok": 5, "rows_rejected": 1, "rows_skipped": 4}
    # 8 metrics per line (mtemp is '-'): pwr gtemp sm mem enc dec mclk pclk
    assert s.height == 5 * 8
    assert value(s, "0", "gpu_util_pct", "2026-01-05 10:00:02") == 99.0
    assert value(s, "1", "sm_clock_mhz", "2026-01-05 10:00:01") == 210.0
    assert "temp_mem_c" not in set(s["metric"])


def test_dmon_without_time_has_null_ts():
    _, t, s, _ = run(FIX / "dmon_without_time.txt")
    assert t["rows_ok"] == 2 and s.height == 2 * 10  # 11 columns after gpu, mtemp '-'
    assert s["ts"].null_count() == s.height
    assert {"jpg", "ofa"} <= set(s["metric"])  # unknown dmon columns kept verbatim


def test_sniffers_are_strict():
    csv, dmon = NvidiaSmiCsvReader(), NvidiaSmiDmonReader()
    p = Path("x")
    assert not csv.sniff("step,loss,reward\n1,0.5,0.1\n", p)
    assert not csv.sniff("timestamp,loss\n2026/01/01 00:00:00,1\n", p)
    assert csv.sniff("utilization.gpu [%]\n5 %\n", p)
    assert not dmon.sniff("# gpu is fine\nhello\n", p)


@pytest.mark.real_logs
def test_real_gpu_usage_csv(real_file):
    name, t, s, r = run(real_file("nvidia_smi_csv/gpu_usage.csv"))
    assert name == "nvidia_smi_csv"
    # wc -l -> 1640 lines (no trailing partial line); 1 header -> 1639 samples per metric
    assert t == {"lines": 1640, "rows_ok": 1639, "rows_rejected": 0, "rows_skipped": 1}
    counts = dict(s.group_by("metric").len().iter_rows())
    assert counts == {"gpu_util_pct": 1639, "mem_used_mib": 1639}
    assert set(s["gpu"]) == {"0"} and set(s["host"]) == {"gpu_usage"}
    # head -2: "2026/02/02 01:07:37.100, 17092 MiB, 0 %"
    assert value(s, "0", "mem_used_mib", "2026-02-02 01:07:37.100") == 17092.0
    # tail -1: "2026/02/02 07:57:08.704, 1047 MiB, 0 %"
    assert s["ts"].max() == datetime(2026, 2, 2, 7, 57, 8, 704000, tzinfo=UTC)


def test_gzipped_log_reads_like_the_plain_one(tmp_path):
    import gzip

    p = tmp_path / "smi.csv.gz"
    p.write_bytes(gzip.compress((FIX / "clock_jump.csv").read_bytes()))
    name, t, s, r = run(p)
    assert name == "nvidia_smi_csv"
    assert t == {"lines": 6, "rows_ok": 4, "rows_rejected": 1, "rows_skipped": 1}
    assert r["line_no"].to_list() == [4] and s.height == 4


def test_multi_gpu_without_index_numbers_gpus_by_order_in_a_pass():
    _, t, s, r = run(FIX / "multi_gpu_without_index.csv")
    # 2 passes of 3 lines sharing a timestamp -> GPUs 0, 1, 2 in order
    assert t == {"lines": 7, "rows_ok": 6, "rows_rejected": 0, "rows_skipped": 1}
    util = {(g, v) for g, v in s.filter(pl.col("metric") == "gpu_util_pct").select("gpu", "value").iter_rows()}
    assert util == {("0", 90.0), ("1", 10.0), ("2", 0.0), ("0", 91.0), ("1", 11.0), ("2", 1.0)}


def test_multi_gpu_pass_cut_by_a_batch_boundary(monkeypatch):
    import analyses.readers.nvidia_smi as mod
    from analyses.readers.lines import line_frames

    # batches of 3 lines: [header, l2, l3] [l4, l5, l6] [l7] -> the first pass spans two batches
    monkeypatch.setattr(mod, "line_frames", lambda path, batch_lines=0: line_frames(path, 3))
    _, t, s, r = run(FIX / "multi_gpu_without_index.csv")
    assert r.height == 0
    mem = dict(s.filter(pl.col("metric") == "mem_used_mib").select("value", "gpu").iter_rows())
    assert mem == {1000.0: "0", 2000.0: "1", 3000.0: "2", 1001.0: "0", 2001.0: "1", 3001.0: "2"}


def test_restarted_logger_with_attribute_only_header(tmp_path):
    # the logger restarts with a query holding no metric (index, name only): its line is parsed
    # but writes nothing, and must not break the samples of the first segment (by hand: 1 sample)
    p = tmp_path / "smi.csv"
    p.write_text(
        "timestamp, index, utilization.gpu [%]\n2026/01/05 10:00:01.000, 0, 5 %\n"
        "timestamp, index, name\n2026/01/05 10:00:02.000, 0, H100\n"
    )
    _, t, s, r = run(p)
    assert t == {"lines": 4, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 2}
    assert s.select("gpu", "metric", "value").rows() == [("0", "gpu_util_pct", 5.0)]


def test_invalid_utf8_byte_rejects_its_line_not_the_file(tmp_path):
    # one undecodable byte after a unit (a corrupted log): before, the native line scanner failed
    # the whole file; now the byte reads as U+FFFD and only that line's unit is unknown
    p = tmp_path / "smi.csv"
    p.write_bytes(
        b"timestamp, index, utilization.gpu [%]\n"
        b"2026/01/05 10:00:01.000, 0, 5 %\n"
        b"2026/01/05 10:00:02.000, 0, 6 %\xff\n"
    )
    _, t, s, r = run(p)
    assert t == {"lines": 3, "rows_ok": 1, "rows_rejected": 1, "rows_skipped": 1}
    assert r["line_no"].to_list() == [3] and r["reason"][0].startswith("unknown unit")
    assert s["value"].to_list() == [5.0]


def test_dmon_header_naming_a_column_twice_does_not_fail_the_file(tmp_path) -> None:
    # found by the fuzz: a spliced dmon header repeated a column name and the file failed whole
    from analyses.readers import read_file
    from analyses.readers.base import FileContext
    from analyses.readers.nvidia_smi import NvidiaSmiDmonReader

    path = tmp_path / "dmon.txt"
    path.write_text("# gpu   pwr  xx  xx\n# Idx     W   a   a\n    0    50   1   2\n    0    51   3   4\n")
    from analyses.manifest import load_manifest

    chunks = list(read_file(NvidiaSmiDmonReader(), FileContext("r", path, "dmon.txt", load_manifest(tmp_path))))
    assert sum(c.rows_ok for c in chunks) == 2
    s = pl.concat([c.tables["gpu_samples"] for c in chunks])
    assert sorted(s.filter(pl.col("metric") == "xx")["value"].to_list()) == [1.0, 2.0, 3.0, 4.0]


def test_dmon_header_of_more_fields_than_dmon_prints_rejects_its_rows(tmp_path) -> None:
    # found by the long fuzz run: a 262 KB "# gpu ..." line of 40,000 fields took 1.4 GB and 3.5 s
    from analyses.manifest import load_manifest
    from analyses.readers import read_file
    from analyses.readers.base import FileContext
    from analyses.readers.nvidia_smi import DMON_MAX_FIELDS, NvidiaSmiDmonReader

    path = tmp_path / "dmon.txt"
    names = " ".join(["gpu"] + ["pwr"] * DMON_MAX_FIELDS)
    path.write_text(f"# {names}\n    0    50\n# gpu pwr\n# Idx W\n    0    51\n")
    chunks = list(read_file(NvidiaSmiDmonReader(), FileContext("r", path, "dmon.txt", load_manifest(tmp_path))))
    assert [sum(getattr(c, k) for c in chunks) for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")] == [5, 1, 1, 3]
    reasons = pl.concat([c.rejects for c in chunks if c.rejects is not None])["reason"].to_list()
    assert reasons == [f"its dmon header has {DMON_MAX_FIELDS + 1} fields, over {DMON_MAX_FIELDS}: not a dmon table"]


def test_csv_header_of_more_fields_than_nvidia_smi_has_rejects_its_rows(tmp_path) -> None:
    # found by the long fuzz run (seed 4): a 262 KB header of 13,106 fields took 2.0 GB for one data line
    from analyses.manifest import load_manifest
    from analyses.readers import read_file
    from analyses.readers.base import FileContext
    from analyses.readers.nvidia_smi import SMI_MAX_FIELDS

    path = tmp_path / "smi.csv"
    wide = ", ".join(["timestamp"] + ["memory.used [MiB]"] * SMI_MAX_FIELDS)
    path.write_text(f"{wide}\n2025/01/01 00:00:00.000, 5 MiB\ntimestamp, memory.used [MiB]\n"
                    "2025/01/01 00:00:01.000, 7 MiB\n")
    chunks = list(read_file(NvidiaSmiCsvReader(), FileContext("r", path, "smi.csv", load_manifest(tmp_path))))
    assert [sum(getattr(c, k) for c in chunks) for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")] == [4, 1, 1, 2]
    reasons = pl.concat([c.rejects for c in chunks if c.rejects is not None])["reason"].to_list()
    assert reasons == [f"its nvidia-smi header has {SMI_MAX_FIELDS + 1} fields, over {SMI_MAX_FIELDS}: "
                       "not an nvidia-smi table"]
    s = pl.concat([c.tables["gpu_samples"] for c in chunks if c.tables.get("gpu_samples") is not None])
    assert s["value"].to_list() == [7.0]


def test_header_whose_gpu_column_cycles_while_index_is_constant():
    """A real 8-GPU capture's header `timestamp,gpu,index,...` whose `index` is 0 in every row while
    `gpu` cycles 0..7 within each timestamp: `index` made one GPU of eight (21 of 24 lines rejected as
    repeated times) and `gpu` a metric. The column that tells a pass's lines apart is the GPU."""
    _, t, s, r = run(FIX / "header_gpu_column_cycles_index_constant.csv")
    # 1 header + 3 passes x 8 GPUs; 4 metric columns (memory.used/total, utilization, temperature)
    assert t == {"lines": 25, "rows_ok": 24, "rows_rejected": 0, "rows_skipped": 1}
    assert r.height == 0 and s.height == 24 * 4
    assert sorted(s["gpu"].unique(), key=int) == [str(g) for g in range(8)]
    assert set(s["metric"]) == {"mem_used_mib", "mem_total_mib", "gpu_util_pct", "temp_gpu_c"}  # no metric `gpu`
    assert value(s, "7", "mem_used_mib", "2025-06-01 10:00:10") == 8002.0
    assert value(s, "3", "gpu_util_pct", "2025-06-01 10:00:05") == 31.0


def test_a_column_that_is_no_query_field_is_never_a_metric(tmp_path):
    p = tmp_path / "smi.csv"
    p.write_text("timestamp, index, utilization.gpu [%], step, clocks_event_reasons.active\n"
                 "2026/01/05 10:00:01.000, 0, 5 %, 17, 0x0000000000000001\n"
                 "2026/01/05 10:00:02.000, 0, 6 %, 18, 4\n")
    _, t, s, r = run(p)
    assert t["rows_ok"] == 2 and r.height == 0
    # `step` (a logging script's) is dropped; a query field without a canonical name stays verbatim when numeric
    assert sorted(set(s["metric"])) == ["clocks_event_reasons.active", "gpu_util_pct"]
    assert s.filter(pl.col("metric") == "clocks_event_reasons.active")["value"].to_list() == [4.0]


def test_an_index_that_tells_the_gpus_apart_still_wins_over_a_gpu_column(tmp_path):
    p = tmp_path / "smi.csv"
    p.write_text("timestamp, gpu, index, utilization.gpu [%]\n"
                 "2026/01/05 10:00:01.000, 5, 0, 1 %\n2026/01/05 10:00:01.000, 5, 1, 2 %\n")
    _, t, s, r = run(p)
    assert sorted(s["gpu"].to_list()) == ["0", "1"] and r.height == 0
