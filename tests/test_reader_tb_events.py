"""TensorBoard event files: framing and checksums, simple and TF2 tensor scalars, the tags of
verl / OpenRLHF / NeMo-RL / transformers mapped to canonical names, wall times as step times.

Fixtures are written with TensorBoard's own ``EventFileWriter`` by
``tests/fixtures/tensorboard/make_fixtures.py`` (invented values)."""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import Chunk, FileContext, UnreadableFile, read_head
from analyses.readers.tb_events import INSTALL_HINT, TensorBoardReader
from analyses.warehouse import scan_table
from tests._ci import skip_or_fail
from tests.conftest import FIXTURES

TB = FIXTURES / "tensorboard"


@pytest.fixture(autouse=True)
def needs_tensorboard() -> None:
    """The tensorboard extra decodes the records: ``make test`` installs it, so CI must have it."""
    try:
        import google_crc32c  # noqa: F401
        from tensorboard.compat.proto import event_pb2  # noqa: F401
    except ImportError:
        skip_or_fail("tensorboard extra not installed (pip install 'polytrace[tensorboard]')")


def _file(name: str) -> Path:
    return TB / name / f"events.out.tfevents.{name}"


def _one(path: Path) -> Chunk:
    (c,) = TensorBoardReader().read(FileContext("r", path, path.name, RunManifest()))
    return c


def _v(sm: pl.DataFrame, step: int, metric: str) -> float:
    return sm.filter((pl.col("step") == step) & (pl.col("metric") == metric))["value"].item()


def test_sniff_by_the_file_version_record(tmp_path: Path) -> None:
    p = _file("verl")
    assert detect(p).name == "tensorboard"
    other = tmp_path / "events.out.tfevents.fake"
    other.write_bytes(b"brain.Event:2 but not a record\n")
    assert not TensorBoardReader().sniff(read_head(other), other)


def test_verl_scalars_histogram_and_validation() -> None:
    c = _one(_file("verl"))
    # 8 records: file_version and 3 histogram events skipped; 3 steps + 1 validation event parsed
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (8, 4, 0, 4)
    sm = c.tables["step_metrics"]
    assert _v(sm, 2, "response_length/mean") == 502.0
    assert _v(sm, 3, "timing_s/step") == 55.5
    assert _v(sm, 1, "response_length/clip_ratio") == 0.125
    assert sm.filter(pl.col("is_validation")).select("step", "metric").rows() == [(2, "val-core/openai/gsm8k/acc/mean@1")]
    assert "actor/entropy_hist" not in sm["raw_metric"].to_list()
    assert c.step_attrs is not None
    ts = c.step_attrs.sort("step")
    assert ts["step"].to_list() == [1, 2, 3]
    # step 2's latest scalar is the validation one, 5 s after its training scalars
    assert [t.timestamp() for t in ts["ts"]] == [1_760_000_060.0, 1_760_000_125.0, 1_760_000_180.0]


def test_openrlhf_and_nemo_rl_tags() -> None:
    o = _one(_file("openrlhf")).tables["step_metrics"]
    assert _v(o, 2, "critic/score/mean") == pytest.approx(0.2)  # float32 simple_value
    assert _v(o, 3, "response_length/mean") == 600.0
    assert _v(o, 1, "actor/kl_loss") == pytest.approx(0.01)
    assert _v(o, 1, "actor/pg_loss") == -0.5
    n = _one(_file("nemo_rl")).tables["step_metrics"]
    assert _v(n, 1, "response_length/mean") == 321.0
    assert _v(n, 2, "timing_s/step") == 40.0
    assert _v(n, 2, "timing_s/gen") == 25.0
    assert _v(n, 1, "perf/total_num_tokens") == 9000.0
    assert _v(n, 1, "response_length/clip_ratio") == 0.25
    assert n.filter(pl.col("is_validation"))["metric"].to_list() == ["validation/accuracy"]


def test_tf2_tensor_scalars_with_plugin_named_once() -> None:
    c = _one(_file("trl_tf2_tensor_scalars"))
    assert (c.lines, c.rows_ok, c.rows_skipped) == (7, 6, 1)
    sm = c.tables["step_metrics"]
    assert _v(sm, 2, "response_length/mean") == 128.0  # train/completions/mean_length, metadata only at step 1
    assert _v(sm, 2, "critic/score/mean") == 1.0
    assert sm.filter(pl.col("is_validation"))["raw_metric"].unique().to_list() == ["eval/loss"]


def test_bad_checksum_and_cut_record() -> None:
    c = _one(_file("bad_crc_then_cut"))
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (4, 1, 2, 1)
    reasons = c.rejects["reason"].to_list()
    assert reasons[0].startswith("bad_checksum: record data at byte")
    assert reasons[1] == "truncated_record: file ends inside a record"
    assert c.tables["step_metrics"].select("step", "value").rows() == [(1, 1.0)]


def test_corrupt_length_rejects_the_rest(tmp_path: Path) -> None:
    data = bytearray(_file("openrlhf").read_bytes())
    (first_len,) = struct.unpack("<Q", data[:8])
    second = 12 + first_len + 4
    data[second] ^= 0x01  # the second record's length no longer matches its checksum
    p = tmp_path / "events.out.tfevents.x"
    p.write_bytes(bytes(data))
    c = _one(p)
    assert (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped) == (2, 0, 1, 1)
    assert c.rejects["reason"].item().startswith("corrupt_record: length checksum mismatch")


def test_run_steps_from_event_files(tmp_path: Path) -> None:
    run = tmp_path / "openrlhf_run"
    shutil.copytree(TB / "openrlhf", run / "runs")
    wh = tmp_path / "wh"
    rep = ingest_run(run, wh)
    assert [(f.format, f.status) for f in rep.files] == [("tensorboard", "ok")]
    steps = scan_table(wh, "steps").sort("step").collect()
    # no logged step time: the wall time between consecutive steps (30 s apart)
    assert steps.select("step", "step_time_s", "step_time_source").rows() == [
        (1, None, None), (2, 30.0, "log_ts_diff"), (3, 30.0, "log_ts_diff"),
    ]
    assert steps["response_len_mean"].to_list() == [200.0, 400.0, 600.0]
    assert scan_table(wh, "step_windows").collect().height == 2


def test_missing_extra_fails_with_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto", None)
    with pytest.raises(UnreadableFile, match=r"polytrace\[tensorboard\]") as exc:
        _one(_file("verl"))
    assert str(exc.value) == INSTALL_HINT
