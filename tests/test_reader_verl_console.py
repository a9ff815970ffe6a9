"""verl console-log reader (``step:N - key:value - ...``) and the shared line streamer."""

from __future__ import annotations

import gzip
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers import detect, limits
from analyses.readers.base import Chunk, FileContext, UnreadableFile, read_head
from analyses.readers.lines import count_lines, iter_line_batches
from analyses.readers.verl_console import VerlConsoleReader, parse_batch
from analyses.warehouse import scan_table

FIX = Path(__file__).parent / "fixtures" / "verl_console"
QWEN = "verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
GEMMA = "verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log"
GUI = "verl/GUI-Cursor-Moving_verl_demo.log"
AGENTIC = "verl_agentic_open-agentrl/run-20251129_221801-i80f2v90/files/output.log"
AGENTIC_60 = "verl_agentic_open-agentrl/run-20251130_144822-gjvwlq13/files/output.log"


class Read:
    """Everything the reader emitted for one file, concatenated, with the accounting checked."""

    def __init__(self, path: Path, **reader_args: int) -> None:
        reader = VerlConsoleReader(**reader_args)
        chunks: list[Chunk] = list(reader.read(FileContext("r", path, path.name, RunManifest())))
        self.acc = {
            k: sum(getattr(c, k) for c in chunks)
            for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")
        }
        assert self.acc["rows_ok"] + self.acc["rows_rejected"] + self.acc["rows_skipped"] == self.acc["lines"]
        assert self.acc["lines"] == count_lines(path)
        sms = [c.tables["step_metrics"] for c in chunks if "step_metrics" in c.tables]
        self.sm = pl.concat(sms).sort("line_no", "raw_metric") if sms else pl.DataFrame()
        rej = [c.rejects for c in chunks if c.rejects is not None]
        self.rej = (
            pl.concat(rej).sort("line_no", "reason")
            if rej
            else pl.DataFrame(schema={"line_no": pl.Int64, "reason": pl.String, "raw": pl.String})
        )
        attrs = [c.step_attrs for c in chunks if c.step_attrs is not None]
        self.attrs = pl.concat(attrs).sort("step") if attrs else pl.DataFrame()

    def value(self, step: int, metric: str) -> float:
        return self.sm.filter((pl.col("step") == step) & (pl.col("metric") == metric))["value"].item()


def _wc_l(path: Path) -> int:
    """What `wc -l` says: the number of newline bytes."""
    return path.read_bytes().count(b"\n")


# ---------------------------------------------------------------------------- sniff


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ("\x1b[36m(main_task pid=54569)\x1b[0m step:0 - timing/gen:18.859 - timing/ref:5.5\n", True),
        ("\x1b[2m\x1b[36m(main_task pid=1)\x1b[0m step:0 - test_score/openai/gsm8k:0.521\n", True),
        ("wandb: Tracking run\nstep:1 - global_seqlen/min:238933 - actor/pg_loss:np.float64(0.03)\n", True),
        ("2025-03-01 10:00:00,500 INFO step:120 - timing_s/gen:10.0\n", True),
        ("2025-01-01 10:00:00,001 - INFO - step:5 - timing_s/gen:1.0\n", True),
        ("2025-01-01 10:00:00,001 - trainer - step:5 - timing_s/gen:1.0\n", False),
        # verl's start-up config dump, before any step line reached the 64 KiB head
        ("\x1b[36m(TaskRunner pid=38606)\x1b[0m {'actor_rollout_ref': {'actor': {'clip_ratio': 0.2,\n", True),
        ("actor_rollout_ref:\n  actor:\n    clip_ratio: 0.2\n", False),  # a YAML config is not a log
        ("Next step: move the cursor\nstep: 1 of 3\n", False),
        ('{"step":1,"data":{"timing_s/gen":1.0}}\n', False),  # verl JSONL file logger
        ("step,timing_s/gen\n1,2.0\n", False),
        ("", False),
    ],
)
def test_sniff(head: str, expected: bool) -> None:
    assert VerlConsoleReader().sniff(head, Path("x.log")) is expected


def test_detect_picks_this_reader_for_fixtures() -> None:
    for name in ("ansi_ray_prefix.log", "numpy_repr_values.log", "gzip_log.log.gz", "crlf_line_endings.log"):
        path = FIX / name
        reader = detect(path, read_head(path))
        assert reader is not None and reader.name == "verl_console", name


# ---------------------------------------------------------------------------- fixtures, one quirk each


def test_ansi_ray_prefix_old_and_new_timing_keys() -> None:
    r = Read(FIX / "ansi_ray_prefix.log")
    # 13 lines; step lines are 7, 10 (\x1b[2m\x1b[36m prefix) and 12; the rest is header, blank,
    # Ray banner, config dump, model text ("step by step:", "Next step:"), wandb, progress bar
    assert r.acc == {"lines": 13, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 10}
    assert r.sm["line_no"].unique().sort().to_list() == [7, 10, 12]
    assert r.sm.height == 5 + 5 + 3
    # timing/gen (old) and timing_s/gen (new) land in the same canonical metric
    assert r.value(0, "timing_s/gen") == 18.859
    assert r.value(2, "timing_s/gen") == 19.5
    raw = r.sm.filter(pl.col("metric") == "timing_s/gen").sort("step")["raw_metric"].to_list()
    assert raw == ["timing/gen", "timing/gen", "timing_s/gen"]
    assert r.value(1, "critic/lr(1e-4)") == 0.1  # a key with parentheses
    assert r.value(0, "critic/kl") == 0.0  # written "-0.000"
    assert not r.sm["is_validation"].any()
    assert r.rej.height == 0
    # one attribute row per step line: not cut, no timestamp on these lines
    assert r.attrs.rows() == [(0, None, False), (1, None, False), (2, None, False)]


def test_numpy_repr_values_and_every_number_form() -> None:
    r = Read(FIX / "numpy_repr_values.log")
    assert r.acc == {"lines": 1, "rows_ok": 1, "rows_rejected": 0, "rows_skipped": 0}
    assert r.sm.height == 14 and r.rej.height == 0  # 14 pairs on the line, all numbers
    assert r.value(1, "actor/pg_loss") == 0.0327  # np.float64(0.0327)
    assert r.value(1, "num_turns/min") == 2.0  # np.int32(2)
    assert r.value(1, "perf/mfu") == 0.5  # numpy.float32(0.5)
    assert [r.value(1, f"flag/{k}") for k in ("on", "off", "py", "pyoff")] == [1.0, 0.0, 1.0, 0.0]
    assert r.value(1, "x/sci") == 6.18e-10
    assert r.value(1, "x/int") == 238933.0
    assert r.value(1, "x/neg") == -3.5
    assert r.value(1, "x/inf") == float("inf") and r.value(1, "x/ninf") == float("-inf")
    nans = r.sm.filter(pl.col("metric").is_in(["x/nan", "x/npnan"]))["value"]
    assert nans.len() == 2 and nans.is_nan().all()


def test_cut_at_4096_keeps_complete_pairs_and_records_the_lost_tail() -> None:
    path = FIX / "cut_at_4096.log"
    line2 = path.read_text().splitlines()[1]
    assert len(line2) == 4096  # the fixture really is cut there
    r = Read(path)
    # the cut line still counts as parsed; its partial last pair becomes a rejects row
    assert r.acc == {"lines": 3, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 0}
    cut = r.sm.filter(pl.col("line_no") == 2)
    # " - " occurs 58 times in the cut line: 58 pairs, the last one partial -> 57 kept
    assert line2.count(" - ") == 58 and cut.height == 57
    assert "val-aux/aime_2024/score/best@55/mean" not in cut["metric"].to_list()
    assert r.value(10, "val-aux/aime_2024/score/best@54/mean") == pytest.approx(0.005459216666666662)
    assert r.rej.rows() == [
        (
            2,
            "line truncated at 4096 chars: partial pair dropped",
            "val-aux/aime_2024/score/best@55/mean:np.float64(0.00555921666",
        )
    ]
    assert r.attrs.rows() == [(9, None, False), (10, None, True), (11, None, False)]
    # the neighbours are untouched
    assert r.value(9, "timing_s/gen") == 12.5 and r.value(11, "timing_s/gen") == 13.5


def test_resumed_from_step_120_with_timestamp_prefix() -> None:
    r = Read(FIX / "resumed_from_step_120.log")
    assert r.acc == {"lines": 4, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 1}
    assert r.sm["step"].unique().sort().to_list() == [120, 121, 122]
    ts = r.attrs.select("step", pl.col("ts").dt.strftime("%Y-%m-%d %H:%M:%S%.3f")).rows()
    # "2025-03-01 10:00:00,500 INFO", "... 10:00:16,750 INFO", ISO "2025-03-01T10:00:33.125"
    assert ts == [
        (120, "2025-03-01 10:00:00.500"),
        (121, "2025-03-01 10:00:16.750"),
        (122, "2025-03-01 10:00:33.125"),
    ]
    assert str(r.attrs.schema["ts"]) == "Datetime(time_unit='us', time_zone='UTC')"


def test_validation_only_line_is_flagged_per_metric() -> None:
    r = Read(FIX / "validation_only_line.log")
    assert r.acc == {"lines": 4, "rows_ok": 4, "rows_rejected": 0, "rows_skipped": 0}
    flags = dict(zip(r.sm["raw_metric"], r.sm["is_validation"], strict=True))
    assert (
        flags["test_score/openai/gsm8k"]
        and flags["val/test_score/openai/gsm8k"]
        and flags["val-core/acc/mean@1"]
    )
    assert not flags["timing/gen"] and not flags["critic/score/mean"]
    # line 1 holds only validation metrics: a validation line
    assert r.sm.filter(pl.col("line_no") == 1)["is_validation"].all()


def test_malformed_step_lines_are_rejected_with_reasons() -> None:
    r = Read(FIX / "malformed_step_line.log")
    # by hand: ok = lines 1, 5, 9, 11; rejected = 2 (step:abc), 3 (no pairs), 4 (no numeric pair),
    # 6 (no numeric pair), 10 (step too large); skipped = 7 ("step: move"), 8 (text before step:)
    assert r.acc == {"lines": 11, "rows_ok": 4, "rows_rejected": 5, "rows_skipped": 2}
    reasons = dict(zip(r.rej["line_no"], r.rej["reason"], strict=True))
    assert reasons[2] == "malformed step line: step 'abc' is not an integer"
    assert reasons[3] == "malformed step line: no ' - key:value' pairs after step:N"
    assert reasons[4] == reasons[6] == "malformed step line: no numeric key:value pair"
    assert "not an integer" in reasons[10]
    # a bad pair inside a good line: the pair goes to rejects, the rest of the line is kept
    assert reasons[5] == "non-numeric pair dropped, rest of line kept: key 'a/b'"
    assert r.rej.filter(pl.col("line_no") == 5)["raw"].item() == "a/b:xyz"
    assert r.value(7, "timing_s/gen") == 3.0 and r.value(7, "c/d") == 1.5
    assert reasons[9].endswith("key 'tensor/x'") and r.value(10, "timing_s/gen") == 4.0
    # never evaluated: the repr's content is only ever cast as a number
    assert reasons[11].endswith("key 'x/evil'") and r.value(11, "x/ok") == 1.0
    assert r.rej.height == 8  # 5 rejected lines + 3 dropped pairs
    assert sorted(r.sm["step"].unique().to_list()) == [1, 7, 10, 11]


def test_step_line_with_more_pairs_than_a_record_may_hold_values(tmp_path: Path) -> None:
    # a fuzzed line of 1.7M "a/b:1.5" pairs peaked at 550 MB split; bounded by max_json_values
    p = tmp_path / "dense_step_line.log"
    p.write_text("step:1 - " + " - ".join(["a/b:1.5"] * 12) + "\nstep:2 - " + " - ".join(["a/b:2.5"] * 11) + "\n")
    with limits.override(max_json_values=11):
        r = Read(p)
    assert r.acc == {"lines": 2, "rows_ok": 1, "rows_rejected": 1, "rows_skipped": 0}
    assert r.rej["reason"].to_list() == ["too_many_values: more than 11 key:value pairs on one step line"]
    assert r.sm["step"].unique().to_list() == [2]


def test_crlf_line_endings() -> None:
    r = Read(FIX / "crlf_line_endings.log")
    assert r.acc == {"lines": 4, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 2}
    assert r.value(3, "timing_s/step") == 4.0  # no "\r" left on the last value
    assert r.value(4, "timing_s/step") == 4.5


def test_gzip_log() -> None:
    path = FIX / "gzip_log.log.gz"
    r = Read(path)
    assert r.acc == {"lines": 4, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 2}
    assert gzip.decompress(path.read_bytes()).count(b"\n") == 4
    assert r.value(1, "timing_s/gen") == 1.5


def test_no_final_newline_counts_the_last_line() -> None:
    path = FIX / "no_final_newline.log"
    r = Read(path)
    assert _wc_l(path) == 3  # wc -l does not count the unterminated last line; we do
    assert r.acc == {"lines": 4, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 2}
    assert r.value(1, "timing_s/update_actor") == 2.5


def test_invalid_utf8_bytes_do_not_sink_the_file() -> None:
    r = Read(FIX / "invalid_utf8_byte.log")
    assert r.acc == {"lines": 4, "rows_ok": 2, "rows_rejected": 0, "rows_skipped": 2}
    assert r.sm["line_no"].unique().sort().to_list() == [2, 4]


def test_binary_file_is_unreadable() -> None:
    path = FIX / "binary_not_text.log"
    assert not VerlConsoleReader().sniff(read_head(path), path)
    with pytest.raises(UnreadableFile):
        Read(path)


@pytest.mark.parametrize("name", ["ansi_ray_prefix.log", "malformed_step_line.log", "cut_at_4096.log"])
def test_batch_size_does_not_change_the_result(name: str) -> None:
    whole = Read(FIX / name)
    for args in ({"batch_lines": 1}, {"batch_lines": 1, "max_workers": 1}):  # threaded and not
        tiny = Read(FIX / name, **args)
        assert whole.acc == tiny.acc
        assert whole.sm.equals(tiny.sm) and whole.rej.equals(tiny.rej) and whole.attrs.equals(tiny.attrs)


# ---------------------------------------------------------------------------- line streamer


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"a\n\nb\n", ["a", "", "b"]),
        (b"a\n\nb", ["a", "", "b"]),  # final line without newline
        (b"a\r\n\r\nb\r\n", ["a", "", "b"]),  # CRLF
        (b"a\rb\nc\n", ["a\rb", "c"]),  # a bare CR stays inside its line, as in wc -l
        (b"\n", [""]),
        (b"", []),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_line_numbering(tmp_path: Path, data: bytes, lines: list[str], gz: bool) -> None:
    path = tmp_path / ("x.log.gz" if gz else "x.log")
    path.write_bytes(gzip.compress(data) if gz else data)
    for batch_lines, block in ((1, 2), (1000, 1 << 20)):
        batches = list(iter_line_batches(path, batch_lines, block_bytes=block))
        got = (
            pl.concat([b.lines for b in batches])
            if batches
            else pl.DataFrame(schema={"line_no": pl.Int64, "line": pl.String})
        )
        assert got["line"].to_list() == lines
        assert got["line_no"].to_list() == list(range(1, len(lines) + 1))
        assert sum(b.n_lines for b in batches) == len(lines) == count_lines(path)


def test_line_streamer_falls_back_past_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(b"step:1 a\n" * 5 + b"bad \xff step:x\nok\nstep:2\ntail")
    batches = list(iter_line_batches(path, 2, contains="step:"))
    got = pl.concat([b.lines for b in batches])
    assert got["line_no"].to_list() == [1, 2, 3, 4, 5, 6, 8]  # only lines holding "step:"
    assert got["line"][5] == "bad \ufffd step:x"
    assert sum(b.n_lines for b in batches) == 9  # the skipped lines are still covered


def test_corrupt_gzip_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "x.log.gz"
    path.write_bytes(gzip.compress(b"step:1 - a:1\n" * 1000)[:60])
    with pytest.raises(UnreadableFile):
        list(iter_line_batches(path))


# ---------------------------------------------------------------------------- through the ingest


def test_ingest_derives_steps_from_old_and_new_keys(tmp_path: Path, warehouse: Path) -> None:
    run = tmp_path / "run_console"
    run.mkdir()
    (run / "train.log").write_bytes((FIX / "ansi_ray_prefix.log").read_bytes())
    (run / "resumed.log").write_bytes((FIX / "resumed_from_step_120.log").read_bytes())
    (run / "cut.log").write_bytes((FIX / "cut_at_4096.log").read_bytes())
    rep = ingest_run(run, warehouse)
    assert {f.path: (f.format, f.status) for f in rep.files} == {
        "train.log": ("verl_console", "ok"),
        "resumed.log": ("verl_console", "ok"),
        "cut.log": ("verl_console", "ok"),  # a truncated tail is not a rejected line
    }
    steps = scan_table(warehouse, "steps").collect().sort("step")
    assert steps["step"].to_list() == [0, 1, 2, 9, 10, 11, 120, 121, 122]
    gen = dict(zip(steps["step"], steps["gen_time_s"], strict=True))
    assert gen[0] == 18.859 and gen[1] == 20.434  # timing/gen, 2024 format
    assert gen[2] == 19.5 and gen[120] == 10.0  # timing_s/gen
    assert gen[10] is None  # its timing keys were in the cut-off tail
    trunc = dict(zip(steps["step"], steps["truncated_line"], strict=True))
    assert trunc[10] is True and not any(v for k, v in trunc.items() if k != 10)
    assert steps["truncated_line"].null_count() == 0
    ts = steps.filter(pl.col("step") == 121)["ts"].dt.strftime("%H:%M:%S%.3f").item()
    assert ts == "10:00:16.750"
    rejects = scan_table(warehouse, "rejects").collect()
    assert rejects.select("path", "line_no").rows() == [("cut.log", 2)]


# ---------------------------------------------------------------------------- real logs


@pytest.mark.real_logs
def test_real_qwen_old_format(real_file) -> None:
    path = real_file(QWEN)
    r = Read(path)
    # grep -c 'step:[0-9]* - ' -> 435 step lines; wc -l -> 2046 (file ends with a newline)
    assert r.acc == {"lines": 2046, "rows_ok": 435, "rows_rejected": 0, "rows_skipped": 2046 - 435}
    assert _wc_l(path) == 2046
    assert r.sm["step"].unique().sort().to_list() == list(range(435))
    # first step line: "... step:0 - timing/gen:18.859 - ..."
    assert r.value(0, "timing_s/gen") == 18.859
    assert r.rej.height == 0


@pytest.mark.real_logs
def test_real_gemma_validation_line_and_no_final_newline(real_file) -> None:
    path = real_file(GEMMA)
    r = Read(path)
    # wc -l says 528 but the last line has no newline: 529 lines; grep -c 'step:' -> 107
    assert _wc_l(path) == 528
    assert r.acc == {"lines": 529, "rows_ok": 107, "rows_rejected": 0, "rows_skipped": 422}
    training = r.sm.filter(~pl.col("is_validation"))["step"].unique().sort().to_list()
    assert training == list(range(106))
    # line 333: "step:0 - test_score/openai/gsm8k:0.521", the only validation-only line
    # (every 10th training line also carries val/test_score/openai/gsm8k: grep -c 'val/test_score' -> 10)
    val_lines = r.sm.group_by("line_no").agg(pl.col("is_validation").all()).filter("is_validation")["line_no"]
    assert val_lines.to_list() == [333]
    assert r.sm.filter(pl.col("line_no") == 333).select("step", "metric", "value").rows() == [
        (0, "test_score/openai/gsm8k", 0.521)
    ]
    assert r.sm.filter(pl.col("metric") == "val/test_score/openai/gsm8k").height == 10


@pytest.mark.real_logs
def test_real_gui_cursor_newest_format(real_file) -> None:
    r = Read(real_file(GUI))
    # grep -n 'step:' -> lines 1726, 2285 are step lines; 2334 is "Next step: move the cursor..."
    assert r.acc["rows_ok"] == 2 and r.acc["rows_rejected"] == 0
    assert r.sm["step"].unique().sort().to_list() == [1, 2]
    # 69 pairs per line (sed 's/ - /\n/g' | wc -l -> 70, minus the step head)
    assert r.sm.group_by("step").len().sort("step")["len"].to_list() == [69, 69]
    assert r.value(1, "timing_s/get_batch_rollout_with_filtering") == pytest.approx(313.9077237630263)


@pytest.mark.real_logs
def test_real_agentic_cut_lines_through_ingest(real_file, warehouse: Path) -> None:
    path = real_file(AGENTIC)
    r = Read(path)
    # grep -c '^step:' -> 262; awk 'length($0)==4096' | wc -l -> 27 lines cut by wandb
    assert r.acc == {"lines": 630, "rows_ok": 262, "rows_rejected": 0, "rows_skipped": 368}
    assert r.rej["reason"].unique().to_list() == ["line truncated at 4096 chars: partial pair dropped"]
    assert r.rej.height == 27 and r.attrs.height == 262 and r.attrs["truncated_line"].sum() == 27
    assert r.value(1, "num_turns/min") == 2.0  # np.int32(2)
    rep = ingest_run(path, warehouse, run_id="agentic")
    (f,) = rep.files
    assert (f.format, f.status, f.lines, f.rows_ok, f.rows_rejected) == ("verl_console", "ok", 630, 262, 0)
    steps = scan_table(warehouse, "steps", ["agentic"]).collect().sort("step")
    # step 0 is validation-only (the initial validation): training steps are 1..261
    assert steps["step"].to_list() == list(range(1, 262))
    assert steps["truncated_line"].sum() == 26  # the 27th cut line is step 0's
    first = steps.row(0, named=True)
    assert first["gen_time_s"] == pytest.approx(179.71282542217523)  # timing_s/gen of step 1
    assert first["step_time_s"] == pytest.approx(427.04932610318065) and first["step_time_source"] == "logged"


@pytest.mark.real_logs
def test_real_agentic_second_run(real_file) -> None:
    r = Read(real_file(AGENTIC_60))
    # grep -c '^step:' -> 60 (steps 0..59, step 0 the initial validation)
    assert r.acc["rows_ok"] == 60 and r.acc["rows_rejected"] == 0
    training = r.sm.filter(~pl.col("is_validation"))["step"].unique().sort().to_list()
    assert training == list(range(1, 60))


@pytest.mark.real_logs
@pytest.mark.parametrize("rel", [QWEN, GEMMA, GUI, AGENTIC, AGENTIC_60])
def test_real_logs_are_detected_as_verl_console(real_file, rel: str) -> None:
    path = real_file(rel)
    reader = detect(path, read_head(path))
    assert reader is not None and reader.name == "verl_console"


def test_python_logging_prefixes() -> None:
    r = Read(FIX / "python_logging_prefix.log")
    # by hand: lines 1 ("ts - INFO - step:5"), 3 ("[ts] [INFO] step:6"), 4 ("ts | WARNING | step:7")
    # are step lines; 2 has no "step:"; 5 ("ts - trainer - step:8": a logger name is not an
    # accepted prefix) is skipped by the strict prefix rule
    assert r.acc == {"lines": 5, "rows_ok": 3, "rows_rejected": 0, "rows_skipped": 2}
    assert r.value(5, "timing_s/step") == 2.0 and r.value(6, "timing_s/gen") == 1.5
    ts = r.attrs.select("step", pl.col("ts").dt.strftime("%H:%M:%S%.3f")).rows()
    assert ts == [(5, "10:00:00.001"), (6, "10:00:04.000"), (7, "10:00:06.000")]


# ---------------------------------------------------------------------------- template fast path


def test_lines_with_the_same_pair_count_but_other_keys() -> None:
    # every line has 2 pairs, so all share the first line's key template (a/x, b/y); lines 2-5
    # do not follow it (keys swapped, another key, a repeated key, renamed/validation keys) and
    # must read exactly as the general key:value rule says (values by hand from the fixture)
    path = FIX / "same_pair_count_other_keys.log"
    for args in ({}, {"batch_lines": 2}, {"batch_lines": 1}):
        r = Read(path, **args)
        assert r.acc == {"lines": 6, "rows_ok": 6, "rows_rejected": 0, "rows_skipped": 0}
        assert r.sm.height == 12 and r.rej.height == 0
        got = {(s, raw): v for s, raw, v in r.sm.select("step", "raw_metric", "value").rows() if s != 4}
        assert got == {
            (1, "a/x"): 1.0, (1, "b/y"): 2.0, (2, "b/y"): 3.0, (2, "a/x"): 4.0,
            (3, "a/x"): 5.0, (3, "c/z"): 6.5, (5, "timing/gen"): 9.0, (5, "val/acc"): 1.0,
            (6, "a/x"): 10.0, (6, "b/y"): 11.0,
        }  # fmt: skip
        assert sorted(r.sm.filter(pl.col("step") == 4)["value"].to_list()) == [7.0, 8.0]
        line5 = r.sm.filter(pl.col("step") == 5).sort("raw_metric")
        assert line5.select("metric", "is_validation").rows() == [("timing_s/gen", False), ("val/acc", True)]
        assert not r.sm.filter(pl.col("step") != 5)["is_validation"].any()


def test_batch_of_only_cut_lines_with_bad_pairs() -> None:
    # a batch without any whole line has no key template: everything takes the general path
    # (a bad key, an empty value and a good pair; the cut-off last pair "k" is dropped)
    line = "step:38 - x y:0.196 - t/y: - z:-0.184 - k"
    batch = pl.DataFrame({"line_no": [1], "line": [line]}, schema={"line_no": pl.Int64, "line": pl.String})
    chunk = parse_batch(batch, cut_chars=len(line))
    assert (chunk.lines, chunk.rows_ok, chunk.rows_rejected, chunk.rows_skipped) == (1, 1, 0, 0)
    assert chunk.tables["step_metrics"].select("step", "metric", "value").rows() == [(38, "z", -0.184)]
    assert chunk.rejects is not None
    assert sorted(chunk.rejects.select("reason", "raw").rows()) == [
        (f"line truncated at {len(line)} chars: partial pair dropped", "k"),
        ("non-numeric pair dropped, rest of line kept: key 't/y'", "t/y:"),
        ("non-numeric pair dropped, rest of line kept: key 'x y'", "x y:0.196"),
    ]
    assert chunk.step_attrs is not None and chunk.step_attrs.rows() == [(38, None, True)]
