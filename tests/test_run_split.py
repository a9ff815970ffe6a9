"""One directory, several runs (issue 13 item 5): console logs that each start over, wandb run
folders and PolyTrace workload directories side by side become one run each; a resumed run stays one."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyses.cli import main
from analyses.run_split import first_step, plan_runs
from analyses.warehouse import scan_table


def _log(path: Path, steps: range) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("banner\n" + "".join(f"step:{s} - timing_s/step:1.5 - critic/score/mean:0.5\n" for s in steps))
    return path


def test_first_step_of_a_console_log_behind_ansi_and_ray_prefixes(tmp_path: Path) -> None:
    f = tmp_path / "a.log"
    f.write_text("x\n\x1b[36m(main_task pid=1)\x1b[0m step:7 - a:1\nstep:8 - a:1\n")
    assert first_step(f) == 7


def test_logs_that_each_start_over_are_separate_runs(tmp_path: Path) -> None:
    _log(tmp_path / "qwen.log", range(0, 5))
    _log(tmp_path / "gemma.log", range(1, 3))
    plan = plan_runs(tmp_path)
    assert [(r.path.name, r.run_id) for r in plan.runs] == [("gemma.log", "gemma"), ("qwen.log", "qwen")]
    assert plan.reason == "2 console logs whose steps each start over"


def test_a_resumed_run_over_two_logs_stays_one(tmp_path: Path) -> None:
    _log(tmp_path / "part1.log", range(0, 50))
    _log(tmp_path / "part2.log", range(45, 90))  # resumed from the step-45 checkpoint
    assert not plan_runs(tmp_path).split


def test_two_fresh_logs_and_a_resume_are_ambiguous_and_stay_one_with_a_note(tmp_path: Path) -> None:
    _log(tmp_path / "a.log", range(0, 5))
    _log(tmp_path / "b.log", range(0, 5))
    _log(tmp_path / "c.log", range(5, 9))
    plan = plan_runs(tmp_path)
    assert not plan.split and "2 console logs start from step 0/1" in plan.note


def test_run_toml_forces_one_run_or_a_split(tmp_path: Path) -> None:
    _log(tmp_path / "a.log", range(0, 5))
    _log(tmp_path / "b.log", range(0, 5))
    (tmp_path / "run.toml").write_text("split_runs = false\n")
    assert not plan_runs(tmp_path).split
    (tmp_path / "run.toml").write_text('run_id = "together"\n')
    assert not plan_runs(tmp_path).split
    (tmp_path / "run.toml").write_text('run_id = "together"\nsplit_runs = true\n')
    assert plan_runs(tmp_path).split


def test_wandb_run_folders_and_workload_dirs(tmp_path: Path) -> None:
    w = tmp_path / "w" / "wandb"
    _log(w / "run-20251129_221801-i80f2v90" / "files" / "output.log", range(1, 4))
    _log(w / "run-20251130_144822-gjvwlq13" / "files" / "output.log", range(1, 4))
    assert [r.run_id for r in plan_runs(tmp_path / "w").runs] == ["run-20251129_221801-i80f2v90",
                                                                   "run-20251130_144822-gjvwlq13"]
    p = tmp_path / "dapo"
    for d in ("20260610_092349", "20260614_023133"):
        (p / "profile" / d).mkdir(parents=True)
        (p / "profile" / d / "packed_lengths_step_1.jsonl").write_text("{}\n")
    plan = plan_runs(p)
    assert [r.run_id for r in plan.runs] == ["dapo-20260610_092349", "dapo-20260614_023133"]
    (p / "notes.txt").write_text("x")  # a file outside both: not left out silently, one run
    assert not plan_runs(p).split and "other files beside them" in plan_runs(p).note


@pytest.mark.real_logs
def test_real_verl_directory_is_three_runs(real_file, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    wh = tmp_path / "wh"
    assert main(["ingest", str(real_file("verl")), "--warehouse", str(wh)]) == 0
    out = capsys.readouterr().out
    assert "3 console logs whose steps each start over: 3 runs" in out
    steps = dict(scan_table(wh, "steps").group_by("run_id").len().collect().iter_rows())
    # step lines: Qwen 0..434, gemma 0..105 (training), GUI 1..2; nothing superseded across them
    assert steps == {"Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567": 435,
                     "gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640": 106, "GUI-Cursor-Moving_verl_demo": 2}
    assert scan_table(wh, "source_files").select("rows_superseded").sum().collect().item() == 0


@pytest.mark.real_logs
def test_real_polytrace_verl_is_two_workload_runs(real_file, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    wh = tmp_path / "wh"
    assert main(["ingest", "--root", str(real_file("polytrace")), "--warehouse", str(wh), "-q"]) == 0
    runs = sorted(scan_table(wh, "runs").collect()["run_id"])
    # dataset (fitted parameters only), rllm, search_r1, verl-video, and verl's two DAPO jobs apart
    assert runs == ["dataset", "rllm", "search_r1", "verl-20260610_092349", "verl-20260614_023133", "verl-video"]
    n = dict(scan_table(wh, "samples").group_by("run_id").len().collect().iter_rows())
    assert n["verl-20260610_092349"] == n["verl-20260614_023133"] == 4608
