"""Append-only ingest (issue 26, item 1): after any sequence of appends the tables equal one full
ingest of the same complete lines. Property test: real verl console, TRL console, nvidia-smi CSV,
DCGM and PolyTrace v2 JSONL inputs cut at seeded random byte offsets (mid-line included), ingested
after each cut, every table compared (sorted rows) with a full ingest; then the fallbacks."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import polars as pl
import pytest

from analyses import ingest_files, run_facts, warehouse
from analyses.ingest import RunReport, ingest_run
from analyses.schema import TABLES
from analyses.warehouse import read_published, scan_table

# (format, path under real_logs, whether its reader continues appended lines)
INPUTS = [
    ("verl_console", "verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log", True),
    ("verl_console", "verl_agentic_open-agentrl/run-20251129_221801-i80f2v90/files/output.log", True),
    ("trl_console", "trl_grpo_terminal/20251022_181457/run_terminal.md", False),
    ("nvidia_smi", "nvidia_smi_csv/gpu_usage.csv", False),
    ("dcgm", "dcgm_prometheus/upcloud_L40S_scrape.prom", False),
    ("polytrace_v2", "polytrace/verl/profile/packed_length_log/20260614_023133/packed_lengths_step_3.jsonl", False),
]
CUTS = 4


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    df = df.drop("source_dir", strict=False)  # where the run was read from: the two copies differ
    return df.sort(df.columns, nulls_last=True) if df.height else df


def _assert_same(a: Path, b: Path, where: str) -> None:
    for t in TABLES:
        x, y = _sorted(scan_table(a, t).collect()), _sorted(scan_table(b, t).collect())
        assert x.equals(y), f"{where}: table {t} differs\n{x}\n{y}"


def _full(data: bytes, name: str, tmp: Path) -> Path:
    ref = tmp / "ref"
    shutil.rmtree(ref, ignore_errors=True)
    (ref / "run").mkdir(parents=True)
    (ref / "run" / name).write_bytes(data)
    ingest_run(ref / "run", ref / "wh", run_id="run", append=False)
    return ref / "wh"


def _cuts(size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return sorted(rng.sample(range(1, size), CUTS)) + [size]


@pytest.mark.real_logs
@pytest.mark.parametrize(("fmt", "rel", "resumable"), INPUTS, ids=[f"{i[0]}-{Path(i[1]).stem[:12]}" for i in INPUTS])
def test_appends_equal_one_full_ingest(tmp_path: Path, real_file, fmt: str, rel: str, resumable: bool) -> None:  # noqa: ANN001
    _appends_equal_one_full_ingest(tmp_path, real_file(rel).read_bytes(), fmt, Path(rel).name, resumable)


@pytest.mark.real_logs
@pytest.mark.parametrize("rel", [i[1] for i in INPUTS if i[0] == "verl_console"])
def test_appends_past_the_config_head_equal_one_full_ingest(tmp_path: Path, real_file, rel: str,  # noqa: ANN001
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A log past the bytes its config dump is read from (4 MiB; 64 KiB here): an append keeps the
    previous version's config facts and run_config instead of reading the head again."""
    for mod in (run_facts, ingest_files):
        monkeypatch.setattr(mod, "CONFIG_HEAD_BYTES", 64 << 10)
    _appends_equal_one_full_ingest(tmp_path, real_file(rel).read_bytes(), "verl_console", Path(rel).name, True)


def _appends_equal_one_full_ingest(tmp_path: Path, data: bytes, fmt: str, name: str, resumable: bool) -> None:
    run = tmp_path / "live" / "run"
    run.mkdir(parents=True)
    wh = tmp_path / "live" / "wh"
    modes = []
    for cut in _cuts(len(data), seed=len(data)):
        (run / name).write_bytes(data[:cut])
        rep: RunReport = ingest_run(run, wh, run_id="run")
        modes.append(rep.mode)
        # an append reads complete lines only: a partial last line waits for the next refresh
        seen = data[: data.rfind(b"\n", 0, cut) + 1] if rep.mode == "append" else data[:cut]
        _assert_same(wh, _full(seen, name, tmp_path), f"{fmt} cut at {cut} ({rep.mode})")
    if resumable:
        assert "append" in modes, modes
    else:
        assert modes == ["full"] * len(modes)
        assert rep.refresh_notes and rep.refresh_notes[0].startswith("full ingest: ")


V2_DIR = "polytrace/verl/profile/packed_length_log/20260614_023133"


@pytest.mark.real_logs
def test_a_v2_directory_gaining_step_files_appends_them(tmp_path: Path, real_file) -> None:  # noqa: ANN001
    """A PolyTrace v2 log directory gaining one step file per training step: each refresh reads only
    the new file, and the tables equal a full ingest of the directory."""
    src = real_file(V2_DIR)
    files = sorted(p.name for p in src.iterdir())
    run = tmp_path / "run"
    run.mkdir()
    wh = tmp_path / "wh"
    modes = []
    for name in files:
        shutil.copy(src / name, run / name)
        rep = ingest_run(run, wh, run_id="run")
        modes.append(rep.mode)
        _assert_same(wh, _full_dir(run, tmp_path), f"after {name}")
    assert modes == ["full"] + ["append"] * (len(files) - 1), modes
    # the first (full) ingest's segment, then one per step file added
    assert len(read_published(wh, "run").tables["samples"]) == len(files)


def _verl_lines(n: int, start: int = 1) -> str:
    return "".join(f"step:{i} - response_length/mean:{100 + i} - actor/entropy:0.5 - timing_s/step:10.0 - "
                   f"perf/throughput:{1000 + i}\n" for i in range(start, start + n))


def test_many_appends_compact_and_equal_a_full_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More appends than MAX_SEGMENTS (lowered to 4 here): the appended tables are compacted into one
    segment, the steps stay exact (each step's time and tokens read the step before it), and a
    partial line waits."""
    monkeypatch.setattr(warehouse, "MAX_SEGMENTS", 4)
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text(_verl_lines(3))
    wh = tmp_path / "wh"
    assert ingest_run(log.parent, wh).mode == "full"
    step = 4
    counts = []
    for _ in range(warehouse.MAX_SEGMENTS + 2):
        with log.open("a") as fh:
            fh.write(_verl_lines(2, step) + "step:99 - response_len")  # a line still being written
        step += 2
        rep = ingest_run(log.parent, wh)
        assert rep.mode == "append", rep.refresh_notes
        text = log.read_text()
        log.write_text(text[: text.rindex("\n") + 1])  # the writer's partial line is gone again
        counts.append(len(read_published(wh, "run").tables["step_metrics"]))
    assert counts == [2, 3, 4, 1, 2, 3]  # the full ingest's segment, one per append, compacted past 4
    _assert_same(wh, _full(log.read_bytes(), "train.log", tmp_path), "after compaction")
    steps = scan_table(wh, "steps").collect()
    assert steps["step"].to_list() == list(range(1, step)) and steps["step_time_s"].null_count() == 0


@pytest.mark.parametrize(("change", "note"), [
    ("rewrite", "was rewritten"),
    ("truncate", "is shorter than when last read"),
    ("new_file", "several files carry step metrics"),  # a second verl log: its steps are deduplicated
    ("gone", "is gone"),
])
def test_anything_but_an_append_is_a_full_ingest_that_says_why(tmp_path: Path, change: str, note: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.log").write_text(_verl_lines(10))
    (run / "b.csv").write_text("not,a,log\n")
    wh = tmp_path / "wh"
    ingest_run(run, wh)
    if change == "rewrite":
        (run / "a.log").write_text(_verl_lines(10).replace("0.5", "0.6") + _verl_lines(1, 11))
    elif change == "truncate":
        (run / "a.log").write_text(_verl_lines(5))
    elif change == "new_file":
        (run / "c.log").write_text(_verl_lines(2, 20))
    else:
        (run / "b.csv").unlink()
    rep = ingest_run(run, wh)
    assert rep.mode == "full" and len(rep.refresh_notes) == 1 and note in rep.refresh_notes[0], rep.refresh_notes
    _assert_same(wh, _full_dir(run, tmp_path), change)


def _full_dir(run: Path, tmp: Path) -> Path:
    ref = tmp / "refdir"
    shutil.rmtree(ref, ignore_errors=True)
    shutil.copytree(run, ref / "run")
    ingest_run(ref / "run", ref / "wh", append=False)
    return ref / "wh"


def test_old_manifests_stay_readable(tmp_path: Path) -> None:
    """A polytrace-run/1 manifest (one file per table) reads as one segment per table, and the next
    ingest of the run is a full one (it has no append state) that says so."""
    import json

    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text(_verl_lines(4))
    wh = tmp_path / "wh"
    ingest_run(log.parent, wh, append=False)
    mpath = wh / "manifests" / "run.json"
    doc = json.loads(mpath.read_text())
    doc["format"] = "polytrace-run/1"
    doc["tables"] = {k: v[0] for k, v in doc["tables"].items()}
    doc["info"].pop("append")
    mpath.write_text(json.dumps(doc))
    assert scan_table(wh, "steps").collect().height == 4
    with log.open("a") as fh:
        fh.write(_verl_lines(1, 5))
    rep = ingest_run(log.parent, wh)
    assert rep.mode == "full" and "keeps no append state" in rep.refresh_notes[0]
    assert scan_table(wh, "steps").collect().height == 5


@pytest.mark.parametrize("clock", ["time_stamps", "started_at"])
def test_appended_steps_and_windows_are_segments_equal_to_a_full_ingest(tmp_path: Path, clock: str) -> None:
    """A log growing by new steps: ``steps`` and ``step_windows`` get one segment per append (the
    previous rows are not rewritten), whether the windows come from the lines' time stamps (each
    reads the step before it) or from run.toml's start and the summed step times (each reads every
    step before it); the tables and the row counts the report gives equal a full ingest."""
    def lines(n: int, start: int) -> str:
        stamp = "2026-01-01 00:{m:02d}:{s:02d} " if clock == "time_stamps" else ""
        return "".join(stamp.format(m=i // 60, s=i % 60) + f"step:{i} - response_length/mean:{100 + i} - "
                       f"timing_s/step:{5.0 + i % 3}\n" for i in range(start, start + n))

    run = tmp_path / "run"
    run.mkdir()
    if clock == "started_at":
        (run / "run.toml").write_text('started_at = "2026-01-01T00:00:00Z"\n')
    log = run / "train.log"
    log.write_text(lines(3, 1))
    wh = tmp_path / "wh"
    ingest_run(run, wh, run_id="run")
    step = 4
    for _ in range(3):
        with log.open("a") as fh:
            fh.write(lines(2, step))
        step += 2
        rep = ingest_run(run, wh, run_id="run")
        assert rep.mode == "append", rep.refresh_notes
    tables = read_published(wh, "run").tables
    assert len(tables["steps"]) == 4 and len(tables["step_windows"]) == 4
    windows = scan_table(wh, "step_windows").collect()
    assert windows["step"].to_list() == list(range(1, step))
    ref = tmp_path / "ref"
    (ref / "run").mkdir(parents=True)
    for f in run.iterdir():
        shutil.copy(f, ref / "run" / f.name)
    full = ingest_run(ref / "run", ref / "wh", run_id="run", append=False)
    _assert_same(wh, ref / "wh", clock)
    assert rep.table_rows == full.table_rows
