"""A run whose files yield no parsed line is no success (it lands, so that its files say why), and
every file under a run directory is accounted for in ``source_files``: a file read to its end that
gave nothing is ``no_data``, hidden files and directories, run.toml and the tokenizer are skipped
with their reason, and a classic Mac file (``\\r`` line ends) is read line by line."""

from __future__ import annotations

import gzip
from pathlib import Path

import polars as pl
import pytest

from analyses.api import PolyTrace
from analyses.cli import main
from analyses.ingest import ingest_run
from analyses.ingest_files import SKIP_HIDDEN_FILE, SKIP_MANIFEST
from analyses.readers.lines import count_lines, iter_line_batches
from analyses.warehouse import scan_table

JUNK_LINES = "step:1 - loss:abc\nstep:2 - loss:def\n"  # sniffs as a verl console log; no pair is a number


def _junk_run(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "blob.bin").write_bytes(bytes(range(256)) * 64)  # random-looking bytes
    (d / "train.log").write_text(JUNK_LINES)
    return d


def test_a_run_of_nothing_exits_1_with_one_line_and_the_overview_says_no_data(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wh = tmp_path / "wh"
    run = _junk_run(tmp_path / "junk")
    assert main(["ingest", str(run), "--warehouse", str(wh), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("polytrace ingest: run junk: no data: none of its 2 file(s) gave a parsed line")
    assert "blob.bin: unsupported" in err[0] and "train.log: no_data" in err[0]
    sf = scan_table(wh, "source_files").collect().sort("path")
    assert sf.select("path", "format", "lines", "rows_ok", "rows_rejected", "status").rows() == [
        ("blob.bin", "unknown", 0, 0, 0, "unsupported"), ("train.log", "verl_console", 2, 0, 2, "no_data")]
    assert sf["error"][1].startswith("read as verl_console: none of its 2 line(s) parsed: 2 rejected (first: ")
    ov = PolyTrace(wh).view("run_overview").row(0, named=True)
    assert (ov["has_data"], ov["n_alerts"], ov["formats"]) == (False, 1, None)
    assert ov["alerts"].startswith("no data: blob.bin: unsupported (binary file that no reader recognizes); "
                                   "train.log: no_data (read as verl_console: none of its 2 line(s) parsed")
    # a run with data beside it: that one is fine, the command still says no
    good = tmp_path / "good"
    good.mkdir()
    (good / "train.log").write_text("step:1 - timing_s/gen:1.0\n")
    assert main(["ingest", str(good), str(run), "--warehouse", str(wh), "--quiet", "--workers", "2"]) == 1
    assert PolyTrace(wh).view("run_overview").sort("run_id").select("run_id", "has_data").rows() == [
        ("good", True), ("junk", False)]


def test_a_file_that_only_skips_lines_is_no_data_not_ok(tmp_path: Path, warehouse: Path) -> None:
    d = tmp_path / "r"
    d.mkdir()
    (d / "train.log").write_text("step:1 - timing_s/gen:1.0\n")
    (d / "gpu.csv").write_text("timestamp, index, utilization.gpu [%]\n\n")  # nvidia-smi started, no sample yet
    (d / "empty.log").write_text("")
    rep = ingest_run(d, warehouse)
    by = {f.path: f for f in rep.files}
    assert (by["gpu.csv"].status, by["gpu.csv"].lines, by["gpu.csv"].rows_skipped) == ("no_data", 2, 2)
    assert by["gpu.csv"].error == "read as nvidia_smi_csv: none of its 2 line(s) parsed: 2 skipped by the " \
                                  "nvidia_smi_csv rules (not data lines)"
    assert by["empty.log"].status == "empty" and by["train.log"].status == "ok" and rep.has_data


def test_hidden_files_run_toml_and_tokenizer_are_accounted_for(tmp_path: Path, warehouse: Path) -> None:
    d = tmp_path / "r"
    (d / ".git" / "objects").mkdir(parents=True)
    (d / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (d / ".git" / "objects" / "ab").write_text("x")
    (d / "train.log").write_text("step:1 - timing_s/gen:1.0\n")
    (d / ".hidden.jsonl").write_text('{"_step": 1, "loss": 0.5}\n')
    (d / "tok.json").write_text("{}")
    (d / "run.toml").write_text('tokenizer = "tok.json"\n')
    rep = ingest_run(d, warehouse)
    sf = scan_table(warehouse, "source_files").collect().sort("path")
    assert sf.select("path", "status", "error").rows() == [
        (".git", "skipped", "hidden directory (its name starts with '.'): not read, nor anything below it (2 file(s))"),
        (".hidden.jsonl", "skipped", SKIP_HIDDEN_FILE),
        ("run.toml", "skipped", SKIP_MANIFEST),
        ("tok.json", "skipped", "the run's tokenizer (run.toml tokenizer): read for token counts, not as a log"),
        ("train.log", "ok", None),
    ]
    assert rep.has_data and scan_table(warehouse, "runs").collect()["n_files"].item() == 5


MAC_LOG = "step:1 - timing_s/gen:1.0 - timing_s/step:2.0\rstep:2 - timing_s/gen:1.5 - timing_s/step:3.0\rbanner\r"


@pytest.mark.parametrize("gz", [False, True])
def test_classic_mac_line_ends_parse(tmp_path: Path, warehouse: Path, gz: bool) -> None:
    """CR-only line ends gave one line, 1 row and status ok; now 3 lines, 2 steps."""
    d = tmp_path / "mac"
    d.mkdir()
    data = MAC_LOG.encode()
    f = d / ("train.log.gz" if gz else "train.log")
    f.write_bytes(gzip.compress(data) if gz else data)
    assert count_lines(f) == 3
    assert sum(b.n_lines for b in iter_line_batches(f)) == 3
    (fr,) = ingest_run(d, warehouse).files
    assert (fr.format, fr.lines, fr.rows_ok, fr.rows_skipped, fr.status) == ("verl_console", 3, 2, 1, "ok")
    steps = scan_table(warehouse, "steps").collect()
    assert steps.select("step", "step_time_s").rows() == [(1, 2.0), (2, 3.0)]


def test_classic_mac_nvidia_smi_csv(tmp_path: Path, warehouse: Path) -> None:
    csv = ("timestamp, index, utilization.gpu [%]\r2025/01/01 00:00:00.000, 0, 50 %\r"
           "2025/01/01 00:00:01.000, 0, 60 %\r")
    d = tmp_path / "smi"
    d.mkdir()
    (d / "gpu.csv").write_bytes(csv.encode())
    (fr,) = ingest_run(d, warehouse).files
    assert (fr.format, fr.lines, fr.rows_ok, fr.status) == ("nvidia_smi_csv", 3, 2, "ok")
    g = scan_table(warehouse, "gpu_samples").collect()
    assert g.filter(pl.col("metric") == "gpu_util_pct")["value"].to_list() == [50.0, 60.0]


def test_a_progress_bar_redrawn_with_cr_is_not_a_mac_file(tmp_path: Path) -> None:
    # a console capture: \r redraws inside lines, and newlines: split on \n only, as before
    f = tmp_path / "c.log"
    f.write_bytes(b" 10%|# | 1/10\r 20%|## | 2/10\r\n{'loss': 0.1, 'epoch': 0.1}\n")
    assert count_lines(f) == 2
    lines = pl.concat([b.lines for b in iter_line_batches(f)])["line"].to_list()
    assert lines[0] == " 10%|# | 1/10\r 20%|## | 2/10"
