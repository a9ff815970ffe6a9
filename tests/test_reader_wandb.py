"""wandb ``.wandb`` transaction-log reader: framing, history, GPU stats, privacy, missing extra.

Fixtures are written by ``tests/fixtures/wandb/make_fixtures.py`` (invented values)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import FileContext, read_head
from analyses.readers.wandb_offline import INSTALL_HINT, WandbOfflineReader, iter_records
from analyses.warehouse import scan_table
from tests.conftest import FIXTURES

WDIR = FIXTURES / "wandb"
PERSONAL = WDIR / "history_gpu_stats_personal.wandb"
REAL = "verl_agentic_open-agentrl/run-20251130_144822-gjvwlq13/run-gjvwlq13.wandb"
EMAIL = re.compile(rb"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


@pytest.fixture
def needs_wandb() -> None:
    """The wandb extra decodes the records: CI installs ``.[dev,wandb]`` so it must be there."""
    try:
        import wandb.proto.wandb_internal_pb2  # noqa: F401
    except ImportError:
        msg = "wandb extra not installed (pip install 'polytrace[wandb]')"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)


def _read(path: Path):
    ctx = FileContext(run_id="r", path=path, rel_path=path.name, manifest=RunManifest())
    return list(WandbOfflineReader().read(ctx))


def _one(path: Path):
    chunks = _read(path)
    assert len(chunks) == 1
    return chunks[0]


def test_sniff_by_magic_header(tmp_path: Path) -> None:
    assert WandbOfflineReader().sniff(read_head(PERSONAL), PERSONAL)
    assert detect(PERSONAL).name == "wandb_offline"
    other = tmp_path / "x.wandb"
    other.write_bytes(b"step:1 - a:1\n")
    assert not WandbOfflineReader().sniff(read_head(other), other)


def test_framing_without_wandb() -> None:
    # the framing is ours (no wandb needed): 8 records, payload sizes as written
    recs = list(iter_records(PERSONAL))
    assert [n for n, _, _ in recs] == list(range(1, 9))
    assert all(err is None and data for _, data, err in recs)
    # a 55 KB history row crosses two 32 KiB blocks (FIRST/MIDDLE/LAST) and is reassembled;
    # the third record is cut by the end of the file
    cut = list(iter_records(WDIR / "multiblock_then_cut.wandb"))
    assert [(n, err is None) for n, _, err in cut] == [(1, True), (2, True), (3, False)]
    assert len(cut[1][1]) > 32768 and cut[2][2].startswith("truncated_record")


def test_history_and_gpu_stats(needs_wandb) -> None:
    # 8 records: run, environment, output_raw (skipped) + 3 history + 2 stats (ok)
    c = _one(PERSONAL)
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (8, 5, 0, 3)
    sm = c.tables["step_metrics"]
    # step 0: two val metrics; step 1: timing/gen -> timing_s/gen, pg_loss, lr (NaN kept),
    # nested key a.b; the string and the histogram object are not numbers; step 2: two metrics
    assert sm.group_by("step").len().sort("step")["len"].to_list() == [2, 4, 2]
    assert sm.filter(pl.col("step") == 0)["is_validation"].all()
    assert not sm.filter(pl.col("step") > 0)["is_validation"].any()
    row = sm.filter(pl.col("step") == 1, pl.col("raw_metric") == "timing/gen").row(0, named=True)
    assert row["metric"] == "timing_s/gen" and row["value"] == 12.0
    assert "_step" not in sm["raw_metric"].to_list() and "_timestamp" not in sm["raw_metric"].to_list()
    assert c.step_attrs is not None
    steps = c.step_attrs.sort("step")
    assert steps["step"].to_list() == [0, 1, 2]
    assert str(steps["ts"][1]) == "2023-11-14 22:15:30.250000+00:00"  # _timestamp 1700000130.25
    g = c.tables["gpu_samples"]
    # 2 stats records x 2 GPUs x 5 fields; host metrics and gpu.process.* are not GPU samples
    assert g.height == 20
    assert sorted(g["metric"].unique().to_list()) == [
        "gpu_util_pct",
        "mem_used_mib",
        "memoryAllocated",
        "power_w",
        "temp_gpu_c",
    ]
    assert g.filter(pl.col("metric") == "mem_used_mib")["value"].unique().to_list() == [2048.0]  # 2 GiB
    assert g.filter(pl.col("gpu") == "1", pl.col("metric") == "gpu_util_pct").sort("ts")[
        "value"
    ].to_list() == [20.0, 96.0]
    assert g["host"].unique().to_list() == ["history_gpu_stats_personal"]


def test_bad_checksum_rejects_one_record(needs_wandb) -> None:
    c = _one(WDIR / "bad_checksum.wandb")
    assert (c.lines, c.rows_ok, c.rows_rejected) == (3, 2, 1)
    assert c.rejects["line_no"].to_list() == [2] and c.rejects["reason"][0].startswith("bad_checksum")
    assert c.tables["step_metrics"]["step"].to_list() == [1, 3]


def test_no_personal_data_in_warehouse(needs_wandb, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / PERSONAL.name).write_bytes(PERSONAL.read_bytes())
    assert EMAIL.search(PERSONAL.read_bytes())  # the fixture does carry an e-mail
    wh = tmp_path / "wh"
    ingest_run(run, wh)
    _assert_no_email(wh, forbidden=("janes-workstation",))


def _assert_no_email(wh: Path, forbidden: tuple[str, ...] = ()) -> None:
    files = list((wh / "parquet").rglob("*.parquet"))
    assert files
    for f in files:
        df = pl.read_parquet(f)
        for col in [c for c, t in df.schema.items() if t == pl.String]:
            s = df[col].drop_nulls()
            assert not s.str.contains(EMAIL.pattern.decode()).any(), f"e-mail address in {f}:{col}"
            for word in forbidden:
                assert not s.str.contains(word, literal=True).any(), f"{word!r} in {f}:{col}"


def test_missing_wandb_fails_the_file_with_install_hint(tmp_path: Path, monkeypatch) -> None:
    # simulate an install without the extra: importing wandb.proto fails
    monkeypatch.setitem(sys.modules, "wandb.proto", None)
    monkeypatch.setitem(sys.modules, "wandb.proto.wandb_internal_pb2", None)
    run = tmp_path / "run"
    run.mkdir()
    (run / PERSONAL.name).write_bytes(PERSONAL.read_bytes())
    (run / "output.log").write_text("hello\n")
    rep = ingest_run(run, tmp_path / "wh")
    f = next(x for x in rep.files if x.path == PERSONAL.name)
    assert f.format == "wandb_offline" and f.status == "error"
    assert INSTALL_HINT in f.error and "pip install 'polytrace[wandb]'" in f.error


@pytest.mark.real_logs
def test_real_run_counts(needs_wandb, real_file, tmp_path: Path) -> None:
    path = real_file(REAL)
    chunks = _read(path)
    lines = sum(c.lines for c in chunks)
    # 1 922 complete records + the last one cut by the end of the file (2 752 512 bytes = 84
    # blocks exactly: the file was copied while wandb was still writing); counted with
    # iter_records and a protobuf decode of each record (stats 1079, output_raw 653, summary
    # 118, history 59, files 7, environment 2, telemetry 2, header 1, run 1)
    assert lines == 1923
    assert sum(c.rows_ok for c in chunks) == 1079 + 59
    assert sum(c.rows_rejected for c in chunks) == 1
    assert sum(c.rows_skipped for c in chunks) == 1923 - 1138 - 1
    g = pl.concat([c.tables["gpu_samples"] for c in chunks if "gpu_samples" in c.tables])
    per = g.group_by("gpu", "metric").len()
    # 539 of the 1079 stats records carry gpu.N.* keys (the others are host stats): 539 samples
    # per GPU and field, 8 GPUs x 12 fields ("about 540 per GPU" in PROVENANCE.md)
    assert per["len"].unique().to_list() == [539]
    assert sorted(g["gpu"].unique().to_list()) == [str(i) for i in range(8)]
    assert g.height == 539 * 8 * 12
    sm = pl.concat([c.tables["step_metrics"] for c in chunks if "step_metrics" in c.tables])
    # 59 history rows: _step 0 (validation only) and 1..58; output.log has 60 `step:` lines
    # (0..59): step 59's history row is not in the copied file
    train = sm.filter(~pl.col("is_validation"))["step"].unique().sort().to_list()
    assert train == list(range(1, 59))
    assert sorted(sm.filter(pl.col("is_validation"))["step"].unique().to_list()) == [0, 10, 20, 30, 40, 50]
    steps = pl.concat([c.step_attrs for c in chunks if c.step_attrs is not None])
    assert steps.height == 59
    # privacy: the run's environment record holds an e-mail; none may reach the warehouse
    assert EMAIL.search(path.read_bytes())
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(path, run / path.name)  # a symlink out of the run would not be read
    wh = tmp_path / "wh"
    ingest_run(run, wh)
    _assert_no_email(wh)
    assert scan_table(wh, "gpu_samples").select(pl.len()).collect().item() == 51744


@pytest.mark.real_logs
def test_real_run_directory_stores_each_step_metric_once(needs_wandb, real_file, tmp_path: Path) -> None:
    # the run directory as wandb writes it: run-<id>.wandb beside files/output.log, both with the
    # step metrics of steps 0..58; step 59 is only in output.log (its history row is not in the
    # copied .wandb), with 75 ` - key:value` pairs on its line (grep "step:59 " | grep -o)
    wandb_file = real_file(REAL)
    run = tmp_path / "run"
    (run / "files").mkdir(parents=True)
    shutil.copyfile(wandb_file, run / wandb_file.name)  # symlinks out of the run would not be read
    shutil.copyfile(wandb_file.parent / "files" / "output.log", run / "files" / "output.log")
    rep = ingest_run(run, tmp_path / "wh")
    by = {f.path: f for f in rep.files}
    console = by["files/output.log"]
    assert by[wandb_file.name].rows_superseded == 0
    # 4437 = the 4440 ` - key:value` matches on the 60 step lines, less 3 that are the cut tails of
    # lines truncated at 4096 characters (rejects rows, not metrics)
    assert console.rows_out == 75 and console.rows_superseded + console.rows_out == 4437
    sm = scan_table(tmp_path / "wh", "step_metrics").collect()
    assert sm.select(pl.struct("step", "metric", "is_validation").is_unique().all()).item()
    assert sm.filter(pl.col("path") == "files/output.log")["step"].unique().to_list() == [59]
    assert scan_table(tmp_path / "wh", "steps").collect()["step"].to_list() == list(range(1, 60))


def _frame(pieces: list[tuple[int, bytes]]) -> bytes:
    """A .wandb file of raw (type, data) pieces in one block, framed as wandb's writer does
    (CRC-32 seeded with the type byte), written here independently of the reader."""
    import struct
    import zlib

    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for rtype, data in pieces:
        crc = zlib.crc32(data, zlib.crc32(bytes([rtype])))
        out += struct.pack("<IHB", crc, len(data), rtype) + data
    return bytes(out)


def test_record_without_its_last_piece_is_rejected_not_lost(tmp_path: Path) -> None:
    # FULL "a"; FIRST "b1" whose MIDDLE/LAST never come (a FULL starts instead); FULL "c";
    # FIRST "d1" + LAST "d2" -> 4 logical records: a, the broken one, c, d1d2
    p = tmp_path / "run-x.wandb"
    p.write_bytes(_frame([(1, b"a"), (2, b"b1"), (1, b"c"), (2, b"d1"), (4, b"d2")]))
    recs = list(iter_records(p))
    assert [(n, data, (err or "").split(":")[0]) for n, data, err in recs] == [
        (1, b"a", ""),
        (2, None, "corrupt_record"),
        (3, b"c", ""),
        (4, b"d1d2", ""),
    ]


def test_history_without_integral_step_is_rejected(needs_wandb, tmp_path: Path) -> None:
    from wandb.proto import wandb_internal_pb2 as pb

    def history(items: dict[str, str]) -> bytes:
        r = pb.Record()
        for k, v in items.items():
            it = r.history.item.add()
            it.key, it.value_json = k, v
        return r.SerializeToString()

    p = tmp_path / "run-y.wandb"
    p.write_bytes(
        _frame(
            [
                (1, history({"_step": "1", "loss": "0.5"})),
                (1, history({"loss": "0.25"})),  # no _step: the value has no step to land on
                (1, history({"_step": "2.5", "loss": "0.125"})),  # not an integer step
            ]
        )
    )
    c = _one(p)
    # by hand: record 1 parsed (1 metric), records 2 and 3 rejected; nothing silently dropped
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (3, 1, 2, 0)
    assert c.tables["step_metrics"].select("step", "metric", "value").rows() == [(1, "loss", 0.5)]
    assert dict(zip(c.rejects["line_no"], c.rejects["reason"], strict=True)) == {
        2: "history record without a numeric _step",
        3: "history record with a _step that is not a non-negative integer: 2.5",
    }


HF_RUN = WDIR / "hf_trainer_via_wandb" / "run-20250301_120000-hf0trl01"


def test_hf_trainer_run_lands_on_the_trainers_steps_under_one_name(needs_wandb, tmp_path: Path) -> None:
    """An HF Trainer (TRL GRPO) run logged to wandb: history keyed by _step 0..25 with train/global_step
    30..760; its output.log prints the collapsed bar 760/760 before the 25 log dicts. Before: `train/loss`
    on steps 0..24 from the history and `loss` on step 760 from the console (24 of 25 dicts superseded, no
    reject), steps 0..760 mixed. Now one series `loss` on 30..750, the console's copies superseded by the
    binary history."""
    wh = tmp_path / "wh"
    rep = ingest_run(HF_RUN, wh)
    by = {f.path: f for f in rep.files}
    console, history = by["files/output.log"], by["run-hf0trl01.wandb"]
    assert (history.lines, history.rows_ok, history.rows_out) == (26, 26, 25 * 15)
    assert (console.rows_ok, console.rows_rejected, console.rows_out, console.rows_superseded) == (27, 0, 0, 25 * 15)
    assert console.rows_repeated == 0  # no dict of the console lost its step to another dict
    sm = scan_table(wh, "step_metrics").collect()
    loss = sm.filter(pl.col("metric") == "loss").sort("step")
    assert loss["step"].to_list() == list(range(30, 751, 30)) and loss["raw_metric"].unique().to_list() == ["train/loss"]
    assert loss["value"][0] == pytest.approx(0.0485)
    assert not sm.filter(pl.col("metric").str.starts_with("train/")).height  # no second name for a series
    # transformers' names are canonical: completions/mean_length is response_length/mean, reward critic/score/mean
    assert {"response_length/mean", "critic/score/mean", "actor/entropy"} <= set(sm["metric"])
    # bookkeeping and the run summary are no step metrics
    assert not {"epoch", "global_step", "train_runtime", "total_flos"} & set(sm["metric"])
    steps = scan_table(wh, "steps").collect()
    assert steps["step"].to_list() == list(range(30, 751, 30))
    assert steps["response_len_mean"][0] == pytest.approx(203.5)
    assert scan_table(wh, "rejects").collect().height == 0
    assert scan_table(wh, "runs").collect()["framework"].item() == "trl"


def test_history_without_global_step_keeps_wandbs_step(needs_wandb, tmp_path: Path) -> None:
    # verl logs with step=global_step: _step is the step, names as written (canonical verl names)
    (c,) = _read(PERSONAL)
    sm = c.tables["step_metrics"]
    assert sorted(sm["step"].unique().to_list()) == [0, 1, 2] and "timing_s/gen" in set(sm["metric"])
