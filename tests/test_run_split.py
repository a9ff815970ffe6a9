"""One directory, several runs (analyses.run_split): which runs a path holds, and that every file
lands in exactly one of them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses.api import PolyTrace
from analyses.cli import main
from analyses.ingest import discover_files
from analyses.manifest import ManifestError, load_manifest
from analyses.run_split import first_step, plan_runs
from analyses.warehouse import scan_table


def _log(first: int, n: int = 3) -> str:
    return "".join(f"step:{s} - timing_s/step:1.5 - timing_s/gen:1.0\n" for s in range(first, first + n))


def _plan(d: Path) -> list[tuple[str, list[str], str]]:
    return [(r.run_id, sorted(p.relative_to(d).as_posix() for p in r.only) if r.only is not None else [],
             r.reason) for r in plan_runs(d)]


def test_console_logs_that_start_over_are_runs_and_a_resumed_log_joins_its_run(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a_qwen.log").write_text(_log(0))
    (d / "b_gemma.log").write_text(_log(1))
    (d / "c_gemma_resumed.log").write_text(_log(120))  # starts at 120: the run before it, resumed
    (d / "gpu.csv").write_text("timestamp, index, utilization.gpu [%]\n2025/01/01 00:00:00.000, 0, 50 %\n")
    assert _plan(d) == [
        ("logs.a_qwen", ["a_qwen.log"], "verl console log"),
        ("logs.b_gemma", ["b_gemma.log", "c_gemma_resumed.log"], "verl console logs (2, resumed)"),
        ("logs", ["gpu.csv"], "1 file(s) of no single log"),  # telemetry of no single log: its own run
    ]


def test_one_log_or_a_resumed_pair_stays_one_run(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "train.log").write_text(_log(0))
    (d / "gpu.csv").write_text("timestamp, index, utilization.gpu [%]\n")
    assert [r.run_id for r in plan_runs(d)] == ["run"] and plan_runs(d)[0].only is None
    (d / "train_resumed.log").write_text(_log(50))
    assert [(r.run_id, r.only) for r in plan_runs(d)] == [("run", None)]


def test_wandb_folders_and_v2_directories_at_any_depth(tmp_path: Path) -> None:
    d = tmp_path / "project"
    for w in ("run-20251129_221801-i80f2v90", "run-20251130_144822-gjvwlq13"):
        (d / "wandb" / w / "files").mkdir(parents=True)
        (d / "wandb" / w / "files" / "output.log").write_text(_log(1))
    (d / "profile" / "20260610_092349").mkdir(parents=True)
    (d / "profile" / "20260610_092349" / "packed_lengths_step_0.jsonl").write_text("")
    (d / "profile" / "20260610_092349" / "sub").mkdir()  # below a unit: the unit's
    (d / "profile" / "20260610_092349" / "sub" / "packed_lengths_step_1.jsonl").write_text("")
    plans = plan_runs(d)
    assert [(r.run_id, r.path.relative_to(d).as_posix(), r.only, r.reason) for r in plans] == [
        ("20260610_092349", "profile/20260610_092349", None, "PolyTrace v2 log directory"),
        ("run-20251129_221801-i80f2v90", "wandb/run-20251129_221801-i80f2v90", None, "wandb run folder"),
        ("run-20251130_144822-gjvwlq13", "wandb/run-20251130_144822-gjvwlq13", None, "wandb run folder"),
    ]


def test_run_toml_forces_either(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.log").write_text(_log(0))
    (d / "b.log").write_text(_log(0))
    assert [r.run_id for r in plan_runs(d)] == ["logs.a", "logs.b"]
    (d / "run.toml").write_text('task = "math"\n')  # a run.toml describes one run
    assert [r.run_id for r in plan_runs(d)] == ["logs"]
    (d / "run.toml").write_text('split = "auto"\n')
    assert [r.run_id for r in plan_runs(d)] == ["logs.a", "logs.b"]
    (d / "run.toml").write_text('split = "none"\n')
    assert [r.run_id for r in plan_runs(d)] == ["logs"]
    (d / "b.log").unlink()
    (d / "run.toml").write_text('split = "each"\nrun_id = "mine"\n')  # one unit, split anyway
    assert [r.run_id for r in plan_runs(d)] == ["logs.a"]
    assert [r.run_id for r in plan_runs(d, run_id="forced")] == ["forced"]
    (d / "run.toml").write_text('split = "yes"\n')
    with pytest.raises(ManifestError, match="split: expected one of auto, none, each"):
        load_manifest(d)


def test_ids_that_clash_get_a_suffix(tmp_path: Path) -> None:
    d = tmp_path / "x"
    d.mkdir()
    (d / "a b.log").write_text(_log(0))  # both names make the id a_b
    (d / "a_b.log").write_text(_log(0))
    (d / "notes.txt").write_text("hello\n")
    assert [r.run_id for r in plan_runs(d)] == ["x.a_b", "x.a_b-2", "x"]


def test_first_step_of_plain_and_gzip_logs(tmp_path: Path) -> None:
    import gzip

    (tmp_path / "a.log").write_text("banner\n" * 1000 + _log(7))
    (tmp_path / "b.log.gz").write_bytes(gzip.compress(_log(3).encode()))
    (tmp_path / "c.log").write_text("no steps here\n")
    assert [first_step(tmp_path / n) for n in ("a.log", "b.log.gz", "c.log")] == [7, 3, None]


@pytest.mark.real_logs
def test_real_verl_directory_is_three_runs(real_file, tmp_path: Path) -> None:
    d = real_file("verl")
    wh = tmp_path / "wh"
    pt = PolyTrace(wh)
    reports = [pt.ingest_planned(r, refresh=False) for r in pt.plan_runs(d)]
    assert [r.run_id for r in reports] == ["verl.GUI-Cursor-Moving_verl_demo",
                                           "verl.Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567",
                                           "verl.gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640"]
    steps = scan_table(wh, "steps").group_by("run_id").len().sort("run_id").collect().rows()
    assert steps == [("verl.GUI-Cursor-Moving_verl_demo", 2), ("verl.Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567", 435),
                     ("verl.gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640", 106)]
    # nothing superseded any more: the Qwen rows are Qwen's
    assert scan_table(wh, "source_files").select(pl.col("rows_superseded").sum()).collect().item() == 0


@pytest.mark.real_logs
def test_real_polytrace_tree_every_file_in_exactly_one_run(real_file, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    d = real_file("polytrace")
    wh = tmp_path / "wh"
    assert main(["ingest", str(d), "--warehouse", str(wh)]) == 0
    out = capsys.readouterr().out
    assert f"{d}: 6 runs: 20260616_024512 (PolyTrace v2 log directory)" in out
    sf = scan_table(wh, "source_files").collect()
    assert sorted(sf["run_id"].unique()) == ["0617_0223", "20260609_033329", "20260610_092349", "20260614_023133",
                                             "20260616_024512", "polytrace"]
    # each run's paths are relative to its own directory; mapped back, they are the tree's files once each
    real = d.resolve()  # plans hold resolved paths (CI reaches ../shared through a symlink)
    roots = {r.run_id: r.path for r in plan_runs(d)}
    read = sorted((roots[rid] / path).relative_to(real).as_posix() for rid, path in sf.select("run_id", "path").rows())
    assert read == sorted(p.relative_to(real).as_posix() for p in discover_files(real, load_manifest(real)).files)
    # --run-id forces one run
    assert main(["ingest", str(d / "verl"), "--warehouse", str(tmp_path / "one"), "--run-id", "dapo", "-q"]) == 0
    assert scan_table(tmp_path / "one", "runs").collect()["run_id"].to_list() == ["dapo"]


def _two_logs(d: Path, second: str) -> Path:
    d.mkdir(parents=True)
    (d / "train.log").write_text(_log(0))
    (d / "eval.log").write_text(second)
    return d


def test_split_runs_of_two_directories_do_not_collide(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two directories each holding train.log and eval.log: the second's `train` silently replaced the
    first's (exit 0). Ids now carry the directory; and a run id the warehouse holds from another
    source is never published over unasked."""
    wh = tmp_path / "wh"
    a = _two_logs(tmp_path / "a" / "exp1", _log(0, 2))
    b = _two_logs(tmp_path / "b" / "exp2", _log(0, 5))
    assert main(["ingest", str(a), "--warehouse", str(wh), "-q"]) == 0
    assert main(["ingest", str(b), "--warehouse", str(wh), "-q"]) == 0
    got = dict(scan_table(wh, "steps").group_by("run_id").len().collect().rows())
    assert got == {"exp1.train": 3, "exp1.eval": 2, "exp2.train": 3, "exp2.eval": 5}
    # two directories of one name: the same ids, so the second is refused with one line, exit 2
    c = _two_logs(tmp_path / "c" / "exp1", _log(0, 4))
    capsys.readouterr()
    assert main(["ingest", str(c), "--warehouse", str(wh), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run 'exp1.eval' in the warehouse came from {a / 'eval.log'}; {c / 'eval.log'}" in err[0]
    assert "--replace" in err[0]
    assert scan_table(wh, "steps", ["exp1.eval"]).collect().height == 2  # untouched
    assert main(["ingest", str(c), "--warehouse", str(wh), "-q", "--replace"]) == 0
    assert scan_table(wh, "steps", ["exp1.eval"]).collect().height == 4
    # the same source again (a log that grew) and the same content elsewhere (a moved directory) are the same run
    (c / "eval.log").write_text(_log(0, 6))
    assert main(["ingest", str(c), "--warehouse", str(wh), "-q"]) == 0
    moved = tmp_path / "moved" / "exp1"
    moved.parent.mkdir()
    c.rename(moved)
    assert main(["ingest", str(moved), "--warehouse", str(wh), "-q"]) == 0
    # a single-path ingest over a split run's id from elsewhere is refused too
    other = tmp_path / "other.log"
    other.write_text(_log(0, 1))
    assert main(["ingest", str(other), "--run-id", "exp2.train", "--warehouse", str(wh), "-q"]) == 2


def test_split_run_id_is_the_directory_and_the_log() -> None:
    from analyses.manifest import RUN_ID_MAX
    from analyses.run_split import split_run_id

    assert split_run_id("exp 1", "train") == "exp_1.train"
    assert split_run_id("...", "train") == "train"  # nothing usable in the directory's name
    long = split_run_id("d" * 200, "t" * 20)
    assert len(long) == RUN_ID_MAX and long.endswith("." + "t" * 20)
