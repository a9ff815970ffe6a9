"""TRL / Unsloth console captures: log dicts behind tqdm, steps from the training bar, step times
from tqdm, canonical names, line accounting; on the two real captures and on fixtures that copy
their quirks (``tests/fixtures/trl_console/make_fixtures.py``)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from analyses.api import PolyTrace
from analyses.ingest import ingest_run
from analyses.manifest import load_manifest
from analyses.readers import detect
from analyses.readers.base import Chunk, FileContext, read_head
from analyses.readers.trl_console import TrlConsoleReader, run_start
from analyses.warehouse import scan_table
from tests.conftest import FIXTURES

TDIR = FIXTURES / "trl_console"
UNSLOTH = "unsloth_grpo/run-20251217-122231.log"
TRL_MD = "trl_grpo_terminal/20251022_181457/run_terminal.md"


def _read(path: Path) -> list[Chunk]:
    return list(TrlConsoleReader().read(FileContext("r", path, path.name, load_manifest(path.parent))))


def _acc(chunks: list[Chunk]) -> dict[str, int]:
    return {
        "lines": sum(c.lines for c in chunks), "ok": sum(c.rows_ok for c in chunks),
        "rejected": sum(c.rows_rejected for c in chunks), "skipped": sum(c.rows_skipped for c in chunks),
    }


def _sm(chunks: list[Chunk]) -> pl.DataFrame:
    return pl.concat([c.tables["step_metrics"] for c in chunks if "step_metrics" in c.tables])


def _value(sm: pl.DataFrame, step: int, metric: str) -> float:
    return sm.filter((pl.col("step") == step) & (pl.col("metric") == metric))["value"].item()


def _rejects(chunks: list[Chunk]) -> pl.DataFrame:
    return pl.concat([c.rejects for c in chunks if c.rejects is not None])


# ------------------------------------------------------------------ real captures


def test_unsloth_real_log(real_file) -> None:
    path = real_file(UNSLOTH)
    assert detect(path).name == "trl_console"
    chunks = _read(path)
    # 43 lines: the 2 dict lines, the 0/5 bar (with the generation_config print) and the final
    # redraw read; the checkpoint-loading bar, banners and Unsloth's patch messages skipped
    assert _acc(chunks) == {"lines": 43, "ok": 4, "rejected": 0, "skipped": 39}
    sm = _sm(chunks)
    assert sorted(sm["step"].unique().to_list()) == [1, 2]
    assert _value(sm, 1, "response_length/mean") == 666.75
    assert _value(sm, 2, "response_length/mean") == 722.5
    assert _value(sm, 2, "response_length/max") == 868.0
    assert _value(sm, 1, "response_length/clip_ratio") == 0.0
    assert _value(sm, 2, "perf/cumulative_num_tokens") == 6477.0
    assert _value(sm, 1, "actor/kl_loss") == 0.0
    assert _value(sm, 2, "rewards/lean_validity_reward/mean") == 0.0
    # Unsloth also logs the legacy completion_length: stored under its own name, not twice
    assert _value(sm, 1, "completion_length") == 666.75
    assert sm.filter(pl.col("metric") == "response_length/mean").height == 2
    # bar: "1/5 [10:44<42:59, 644.91s/it]" then "2/5 [18:35<27:06, 542.21s/it]"
    assert _value(sm, 1, "progress/step_time_s/tqdm_elapsed") == 644.0
    assert _value(sm, 2, "progress/step_time_s/tqdm_elapsed") == 18 * 60 + 35 - 644.0
    assert _value(sm, 2, "progress/step_time_s/tqdm_rate") == 542.21
    # no time in the log: the file name's stamp (the script's start) anchors the bar's elapsed time
    steps = chunks[-1].step_attrs
    assert steps is not None
    assert steps["ts"].to_list() == [datetime(2025, 12, 17, 12, 33, 15, tzinfo=UTC), datetime(2025, 12, 17, 12, 41, 6, tzinfo=UTC)]


def test_trl_terminal_markdown_real_log(real_file) -> None:
    path = real_file(TRL_MD)
    assert detect(path).name == "trl_console"
    chunks = _read(path)
    # 139 lines: 5 dict lines and 11 bar lines read; Map/Filter/checkpoint bars, the two header
    # blocks, banners, fences skipped
    assert _acc(chunks) == {"lines": 139, "ok": 16, "rejected": 0, "skipped": 123}
    sm = _sm(chunks)
    logged = sm.filter(pl.col("metric") == "response_length/mean")
    assert logged["step"].to_list() == [10, 20, 30, 40, 43]  # logging_steps=10, then the final summary at 43
    assert _value(sm, 10, "response_length/mean") == 142.7390625
    assert _value(sm, 20, "response_length/clip_ratio") == 0.965625
    assert _value(sm, 10, "critic/score/mean") == 1.875
    assert _value(sm, 10, "actor/entropy") == 1.0277012687176466
    assert _value(sm, 43, "response_length/clip_ratio") == 0.9895833333333334
    # the summary's run totals are not step metrics
    assert not sm["raw_metric"].is_in(["train_runtime", "train_loss", "train_samples_per_second"]).any()
    # every step of the bar has its time: "1/43 [01:40" ... "43/43 [56:46"
    times = sm.filter(pl.col("metric") == "progress/step_time_s/tqdm_elapsed").sort("step")
    assert times["step"].to_list() == list(range(1, 44))
    assert times["value"].sum() == 56 * 60 + 46
    assert _value(sm, 1, "progress/step_time_s/tqdm_rate") == 100.69
    # the capture's "- Time: 2025-10-22 18:14:57" header anchors the bar
    steps = chunks[-1].step_attrs
    assert steps is not None
    assert steps.filter(pl.col("step") == 43)["ts"].item() == datetime(2025, 10, 22, 19, 11, 43, tzinfo=UTC)


def test_trl_run_ingests_into_steps(real_file, warehouse: Path) -> None:
    rep = ingest_run(real_file(TRL_MD).parent, warehouse)
    assert [(f.format, f.status) for f in rep.files] == [("trl_console", "ok")]
    steps = scan_table(warehouse, "steps").sort("step").collect()
    assert steps.height == 43
    assert set(steps["step_time_source"].to_list()) == {"tqdm_elapsed"}
    assert steps.filter(pl.col("step") == 20)["response_len_mean"].item() == 253.8
    assert steps.filter(pl.col("response_clip_ratio").is_not_null())["step"].to_list() == [10, 20, 30, 40, 43]
    windows = scan_table(warehouse, "step_windows").collect()
    assert windows.height == 43


def test_trl_run_shows_in_the_report(real_file, warehouse: Path, tmp_path: Path) -> None:
    from analyses.api import PolyTrace

    ingest_run(real_file(TRL_MD).parent, warehouse)
    res = PolyTrace(warehouse).report(tmp_path / "r.html", png=False)
    variance = next(s for s in res.sections if s.group == "step_variance")
    st = variance.headline.filter(pl.col("metric") == "step_time_s")
    assert st["n_steps"].item() == 43
    assert "20251022_181457" in res.path.read_text(encoding="utf-8")


# ------------------------------------------------------------------ fixtures


def test_header_twice_eval_bar_and_cut_dict() -> None:
    path = TDIR / "header_twice_eval_bar_and_cut_dict.md"
    chunks = _read(path)
    # 40 lines: 16 of the two header blocks, the Map bar, 10 banner lines and the closing fence
    # lines skipped (29); 5 training-bar lines, 4 log dicts and the eval bar's line (its states
    # are read, then set aside) parsed (10); the cut dict of line 30 rejected
    assert _acc(chunks) == {"lines": 40, "ok": 10, "rejected": 1, "skipped": 29}
    rej = _rejects(chunks)
    assert dict(zip(rej["line_no"], rej["reason"], strict=True)) == {
        26: "non-numeric pair dropped, rest of line kept: key 'lr_scheduler'",
        30: "trainer log dict does not end the line (cut, nested or followed by text)",
    }
    sm = _sm(chunks)
    assert _value(sm, 2, "response_length/mean") == 100.0
    assert _value(sm, 2, "actor/kl_loss") == 0.002  # np.float64(0.002)
    assert _value(sm, 3, "response_length/mean") == 110.0  # the bar showed 3/6 before it
    assert sm.filter(pl.col("raw_metric") == "frac_reward_zero_std").height == 0  # None: no value
    # the eval dict lands on step 3 (the training bar's), not on the eval bar's 4/4
    ev = sm.filter(pl.col("is_validation"))
    assert ev.select("step", "metric", "value").rows() == [(3, "eval_loss", 0.3), (3, "eval_reward", 0.6)]
    assert _value(sm, 6, "response_length/mean") == 130.0  # the end-of-training summary's metrics
    elapsed = sm.filter(pl.col("metric") == "progress/step_time_s/tqdm_elapsed").sort("step")
    # 3/6 first drawn at 01:45; its redraw after the evaluation (01:50) is not a new step
    assert elapsed.select("step", "value").rows() == [(1, 30.0), (2, 35.0), (3, 40.0), (4, 35.0), (5, 35.0), (6, 35.0)]
    rate = sm.filter(pl.col("metric") == "progress/step_time_s/tqdm_rate").sort("step")
    assert rate["value"].to_list() == [30.0, 32.8, 35.4, 33.0, 34.0, 34.5]
    steps = chunks[-1].step_attrs
    assert steps is not None
    assert steps.filter(pl.col("step") == 1)["ts"].item() == datetime(2025, 10, 22, 12, 6, 1, tzinfo=UTC)


def test_bars_without_cr_fast_steps() -> None:
    """A capture without carriage returns (bar states run together), ~3 s steps, 100+ hour ETAs."""
    chunks = _read(TDIR / "bars_without_cr_fast_steps.md")
    assert _acc(chunks) == {"lines": 29, "ok": 6, "rejected": 0, "skipped": 23}
    sm = _sm(chunks)
    assert sm.filter(pl.col("metric") == "response_length/mean").select("step", "value").rows() == [(2, 53.35), (4, 2.6)]
    # elapsed differences of 3-19 s are too coarse at one-second resolution: the rate stands in
    assert sm.filter(pl.col("metric") == "progress/step_time_s/tqdm_elapsed").height == 0
    rate = sm.filter(pl.col("metric") == "progress/step_time_s/tqdm_rate").sort("step")
    assert rate.select("step", "value").rows() == [(1, 19.23), (2, 12.07), (3, 6.88), (4, 5.84)]


def test_resumed_second_session() -> None:
    chunks = _read(TDIR / "resumed_second_session.log")
    assert _acc(chunks) == {"lines": 9, "ok": 7, "rejected": 0, "skipped": 2}  # the traceback
    sm = _sm(chunks)
    assert sm.filter(pl.col("metric") == "critic/score/mean").select("step", "value").rows() == [
        (1, 0.2), (3, 0.4), (4, 0.45),
    ]
    elapsed = sm.filter(pl.col("metric") == "progress/step_time_s/tqdm_elapsed").sort("step")
    # the resumed bar jumps 0 -> 3: step 3 has no time; step 4 = 01:35 - 00:50
    assert elapsed.select("step", "value").rows() == [(1, 40.0), (2, 40.0), (4, 45.0)]
    assert "steps" not in chunks[-1].tables  # no start time anywhere: no time stamps


def test_dicts_without_progress_bar_use_logging_steps() -> None:
    path = TDIR / "printer_callback_no_bar" / "dicts_without_progress_bar.log"
    assert load_manifest(path.parent).tags["logging_steps"] == 5
    chunks = _read(path)
    assert _acc(chunks) == {"lines": 4, "ok": 3, "rejected": 0, "skipped": 1}  # the debug print of a sample
    sm = _sm(chunks)
    assert sm.select("step", "metric", "value", "is_validation").rows() == [
        (5, "loss", 0.1, False), (5, "critic/score/mean", 0.2, False), (5, "eval_loss", 0.5, True),
        (10, "loss", 0.2, False), (10, "critic/score/mean", 0.3, False),
    ]


def test_absurd_bar_elapsed_time_is_no_step_time_and_no_timestamp() -> None:
    # a fuzzed bar "6e30:00" overflowed the step's timestamp (a strict cast error failed the file)
    from analyses.readers.trl_console import MAX_ELAPSED_S, _plausible_elapsed

    x = pl.DataFrame({"s": [0.0, 12.5, MAX_ELAPSED_S, MAX_ELAPSED_S + 1, 6e30, float("inf"), float("nan"), -1.0]})
    out = x.select(_plausible_elapsed(pl.col("s")))["s"].to_list()
    assert out == [0.0, 12.5, MAX_ELAPSED_S, None, None, None, None, None]


def test_log_dict_sniff_is_linear_in_the_line() -> None:
    from analyses.readers.trl_console import has_log_dict

    assert has_log_dict("  5%|▌ | 1/20 [00:03<01:00] {'loss': 0.1, 'epoch': 0.05}\r")
    assert not has_log_dict("{'epoch': 0.05}")  # no key before the epoch
    assert not has_log_dict("{'loss': 0.1, 'epoch': 0.05} and more")
    # a fuzzed 512 KB line of this shape took the old regex minutes; the check is one pass
    line = "{'a': 'x" + "{'b': " * 80_000 + "'epoch': 1"
    assert not has_log_dict(line) and has_log_dict(line + "}")


def test_sniff_needs_a_log_dict(tmp_path: Path) -> None:
    r = TrlConsoleReader()
    p = tmp_path / "x.log"
    p.write_text("print: {'prompt': 'hi', 'answer': '4'}\n step:1 - a:1\n", encoding="utf-8")
    assert not r.sniff(read_head(p), p)
    p.write_text("\r 10%|#| 1/10 [00:01<00:09, 1.00s/it]\r   \r{'loss': 0.5, 'epoch': 0.1}\n", encoding="utf-8")
    assert r.sniff(read_head(p), p)


def test_run_start_rules(tmp_path: Path) -> None:
    d = tmp_path / "job"
    d.mkdir()
    log = d / "run-20251217-122231.log"
    log.write_text("x\n", encoding="utf-8")
    m = load_manifest(d)
    assert run_start(m, None, log) == datetime(2025, 12, 17, 12, 22, 31, tzinfo=UTC)
    assert run_start(m, "2025-10-22 18:14:57", log) == datetime(2025, 10, 22, 18, 14, 57, tzinfo=UTC)
    (d / "run.toml").write_text('timezone = "Asia/Shanghai"\n', encoding="utf-8")
    assert run_start(load_manifest(d), None, log) == datetime(2025, 12, 17, 4, 22, 31, tzinfo=UTC)
    (d / "run.toml").write_text("started_at = 2025-12-17T12:30:00Z\n", encoding="utf-8")
    assert run_start(load_manifest(d), "2025-10-22 18:14:57", log) == datetime(2025, 12, 17, 12, 30, tzinfo=UTC)
    assert run_start(load_manifest(tmp_path), None, tmp_path / "plain.log") is None


def test_unsloth_run_directory_lines_up_gpu_samples(real_file, tmp_path: Path) -> None:
    """An Unsloth run directory - the console log and nvidia-smi's CSV beside it, with an
    ``index`` column and ``[N/A]`` temperatures (a vGPU) - gets step windows and per-step GPU
    utilization like a verl run. The CSV is made here: 30% busy in step 1's window, 80% in step 2's."""

    run = tmp_path / "unsloth_run"
    run.mkdir()
    shutil.copy(real_file(UNSLOTH), run / "run-20251217-122231.log")
    rows = ["timestamp, index, utilization.gpu [%], memory.used [MiB], temperature.gpu, pstate"]
    t = datetime(2025, 12, 17, 12, 22, 31)
    step1_end, step2_end = datetime(2025, 12, 17, 12, 33, 15), datetime(2025, 12, 17, 12, 41, 6)
    while t < datetime(2025, 12, 17, 12, 45):
        util = 30 if t < step1_end else 80 if t < step2_end else 5
        rows.append(f"{t:%Y/%m/%d %H:%M:%S}.123, 0, {util} %, 37541 MiB, [N/A], P0")
        t += timedelta(seconds=5)
    (run / "gpu-usage-20251217-122231.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    wh = tmp_path / "wh"
    rep = ingest_run(run, wh)
    assert sorted((f.path, f.format, f.status) for f in rep.files) == [
        ("gpu-usage-20251217-122231.csv", "nvidia_smi_csv", "ok"),
        ("run-20251217-122231.log", "trl_console", "ok"),
    ]
    w = scan_table(wh, "step_windows").sort("step").collect()
    assert w.select("step", "start_ts", "end_ts", "method").rows() == [
        (1, datetime(2025, 12, 17, 12, 22, 31, tzinfo=UTC), datetime(2025, 12, 17, 12, 33, 15, tzinfo=UTC), "log_ts_minus_step_time"),
        (2, datetime(2025, 12, 17, 12, 33, 15, tzinfo=UTC), datetime(2025, 12, 17, 12, 41, 6, tzinfo=UTC), "log_ts_minus_step_time"),
    ]
    util = PolyTrace(wh).view("gpu_step_utilization").sort("step")
    assert util["mean_util_pct"].to_list() == [30.0, 80.0]
    # 5-s samples at 12:22:31.123 + 5k s: k = 0..128 in [12:22:31, 12:33:15), k = 129..222 in [12:33:15, 12:41:06)
    assert util["n_samples"].to_list() == [129, 94]
    assert scan_table(wh, "gpu_samples").filter(pl.col("metric").str.contains("temp")).collect().height == 0


@pytest.mark.parametrize(
    "name", ["header_twice_eval_bar_and_cut_dict.md", "resumed_second_session.log", "bars_without_cr_fast_steps.md"]
)
def test_fixtures_detected(name: str) -> None:
    assert detect(TDIR / name).name == "trl_console"


COLLAPSED = FIXTURES / "wandb" / "hf_trainer_via_wandb" / "run-20250301_120000-hf0trl01" / "files" / "output.log"


def _collapsed(tmp_path: Path, text: str | None = None, toml: str | None = None):  # noqa: ANN202
    d = tmp_path / "run"
    d.mkdir(parents=True)
    (d / "output.log").write_text(text if text is not None else COLLAPSED.read_text())
    if toml:
        (d / "run.toml").write_text(toml)
    ctx = FileContext("r", d / "output.log", "output.log", load_manifest(d))
    return list(TrlConsoleReader().read(ctx))


def test_collapsed_bar_before_every_dict_gives_steps_from_the_logging_interval(tmp_path: Path) -> None:
    """wandb's output.log keeps the bar's last drawing (760/760) and prints it before the 25 log dicts:
    all were put on step 760. 760 and 25 dicts give the interval 30 (the only L with 760 // L == 25), and
    the epochs 0.04, 0.08, ... grow in proportion: steps 30..750; the summary dict stays at 760."""
    chunks = _collapsed(tmp_path)
    assert _acc(chunks) == {"lines": 30, "ok": 27, "rejected": 0, "skipped": 3}
    sm = _sm(chunks)
    assert sorted(sm.filter(pl.col("metric") == "loss")["step"].to_list()) == list(range(30, 751, 30))
    assert sm.filter(pl.col("metric") == "response_length/mean").sort("step")["value"][-1] == 287.5


def test_collapsed_bar_with_run_toml_interval_and_without_a_way_to_tell(tmp_path: Path) -> None:
    chunks = _collapsed(tmp_path / "a", toml="[tags]\nlogging_steps = 25\n")  # run.toml says: it wins
    assert sorted(_sm(chunks).filter(pl.col("metric") == "loss")["step"].to_list()) == list(range(25, 626, 25))
    # epochs that do not grow in proportion (a logging interval that changed): no step can be told, and
    # each dict is rejected saying why, instead of all landing on step 760
    text = COLLAPSED.read_text().replace("'epoch': 0.08}", "'epoch': 0.5}")
    chunks = _collapsed(tmp_path / "b", text)
    assert _acc(chunks)["rejected"] == 25 and not any("step_metrics" in c.tables for c in chunks)
    reasons = pl.concat([c.rejects for c in chunks if c.rejects is not None])["reason"].unique().to_list()
    assert reasons == ["trainer log dict without a step: the training log dicts all follow one progress-bar state "
                       "(a capture that kept only the bar's last drawing) and their epochs do not tell the logging "
                       "interval: set logging_steps in run.toml"]
