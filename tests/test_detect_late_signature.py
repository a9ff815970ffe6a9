"""Format detection beyond the head: a console capture whose first step line comes megabytes in
(a wandb ``output.log`` of a verl run opening with reward-function debug prints) is still
recognised, by the bounded second look of :mod:`analyses.readers.late_sniff`. Inputs are made
here with that shape (>= 3 MB of prints first)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from analyses.ingest import ingest_run
from analyses.readers import detect, late_sniff
from analyses.readers.base import SNIFF_BYTES, read_head
from analyses.readers.verl_console import VerlConsoleReader
from analyses.warehouse import scan_table

N_STEPS = 5


def _debug_prints(min_bytes: int) -> str:
    """What a reward function prints per sample while validation and the first steps run."""
    out, size, i = [], 0, 0
    while size < min_bytes:
        block = (
            f"[reward_fn] sample {i}: data_source=openai/gsm8k ground_truth={i % 97}\n"
            f"[reward_fn] solution_str=<|im_start|>assistant\\nLet me think step by step. {i} * 3 = {i * 3}. "
            f"Therefore the answer is #### {i * 3}<|im_end|>\n"
            f"[reward_fn] extracted={i * 3} score={'1.0' if i % 3 else '0.0'} format_ok=True\n"
        )
        out.append(block)
        size += len(block)
        i += 1
    return "".join(out)


def _verl_step_lines() -> str:
    return "".join(
        f"step:{s} - global_seqlen/mean:266183.5 - actor/entropy:np.float64(0.21) - "
        f"response_length/mean:{1700 + s}.5 - response_length/clip_ratio:0.0{s} - timing_s/step:{400 + s}.25\n"
        for s in range(1, N_STEPS + 1)
    )


@pytest.fixture(scope="module")
def late_output_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wandb_run") / "files"
    d.mkdir()
    p = d / "output.log"
    p.write_text("wandb: Tracking run with wandb version 0.19.1\n" + _debug_prints(3_500_000) + _verl_step_lines(), encoding="utf-8")
    return p


def test_head_alone_shows_no_format(late_output_log: Path) -> None:
    head = read_head(late_output_log)
    assert late_output_log.stat().st_size > 3_000_000 and len(head.encode()) == SNIFF_BYTES
    assert not VerlConsoleReader().sniff(head, late_output_log)


def test_late_step_lines_are_recognised_and_read(late_output_log: Path, tmp_path: Path) -> None:
    assert detect(late_output_log).name == "verl_console"
    rep = ingest_run(late_output_log.parent, tmp_path / "wh")
    (f,) = rep.files
    assert (f.format, f.status, f.rows_ok, f.rows_rejected) == ("verl_console", "ok", N_STEPS, 0)
    assert f.rows_ok + f.rows_skipped == f.lines
    steps = scan_table(tmp_path / "wh", "steps").sort("step").collect()
    assert steps["step"].to_list() == list(range(1, N_STEPS + 1))
    assert steps["response_len_mean"].to_list() == [1701.5, 1702.5, 1703.5, 1704.5, 1705.5]
    assert steps["step_time_s"].to_list() == [401.25, 402.25, 403.25, 404.25, 405.25]


def test_late_step_lines_in_a_gzip(late_output_log: Path, tmp_path: Path) -> None:
    gz = tmp_path / "output.log.gz"
    gz.write_bytes(gzip.compress(late_output_log.read_bytes()))
    assert detect(gz).name == "verl_console"


def test_late_trl_log_dict(tmp_path: Path) -> None:
    p = tmp_path / "train.log"
    p.write_text(
        _debug_prints(3_200_000)
        + "\r 10%|#         | 1/10 [01:00<09:00, 60.00s/it]\r          \r"
        + "{'loss': 0.1, 'completions/mean_length': 120.0, 'reward': 0.5, 'epoch': 0.1}\n",
        encoding="utf-8",
    )
    assert detect(p).name == "trl_console"


def test_no_signature_anywhere(tmp_path: Path) -> None:
    p = tmp_path / "prints.log"
    p.write_text(_debug_prints(300_000), encoding="utf-8")
    assert detect(p) is None


def test_the_look_is_bounded(late_output_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late_sniff, "LATE_SNIFF_MAX_BYTES", 1_000_000)
    assert detect(late_output_log) is None
    monkeypatch.setattr(late_sniff, "LATE_SNIFF_MAX_BYTES", 4_000_000)
    assert detect(late_output_log).name == "verl_console"


def test_binary_files_get_no_second_look(tmp_path: Path) -> None:
    p = tmp_path / "weights.bin"
    p.write_bytes(bytes(range(256)) * 400 + _verl_step_lines().encode())
    assert detect(p) is None


def test_blocks_keep_lines_whole(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    lines = [f"line {i} " + "x" * (i % 50) for i in range(2000)]
    p.write_text("\n".join(lines) + "\nlast line without newline", encoding="utf-8")
    blocks = list(late_sniff.line_blocks(p, block_bytes=1000))
    assert all(b.endswith(b"\n") for b in blocks[:-1])
    assert b"".join(blocks) == p.read_bytes()
    assert max(len(b) for b in blocks) <= 1000 + 60  # a block plus the line it completes
    assert late_sniff.lines_holding(b"a step:1\nb\nstep:2 x\nno", ["step:", "x"]) == "a step:1\nstep:2 x\n"
