"""What a run may read and how it may be named: files only inside the run directory (symlinks
out are recorded as skipped), one run-id rule everywhere, and one line with exit 2 for a bad id
or a bad run.toml, with nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.warehouse import published_runs, scan_table

REPO = Path(__file__).resolve().parents[1]
LOG = "step:1 - timing_s/gen:1.0 - timing_s/step:2.0\nstep:2 - timing_s/gen:1.5 - timing_s/step:2.5\n"
SECRET = "step:99 - secret/outside:1.0\nTOP SECRET LINE OUTSIDE THE RUN\n"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyses.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)


def test_symlinks_out_of_the_run_are_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.log").write_text(SECRET)
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "train.log").write_text(LOG)
    (run / "leak.log").symlink_to(outside / "secret.log")
    (run / "alias.log").symlink_to(run / "train.log")  # inside the run: read like any file
    (run / "linked_dir").symlink_to(outside, target_is_directory=True)
    (run / "dangling.log").symlink_to(tmp_path / "nowhere.log")
    rep = ingest_run(run, tmp_path / "wh")
    by_path = {f.path: f for f in rep.files}
    assert by_path["leak.log"].status == "skipped" and "outside the run directory" in (by_path["leak.log"].error or "")
    assert by_path["linked_dir"].status == "skipped" and "not followed" in (by_path["linked_dir"].error or "")
    assert by_path["dangling.log"].status == "skipped"
    assert by_path["alias.log"].status == "ok" and by_path["train.log"].status == "ok"
    sf = scan_table(tmp_path / "wh", "source_files").collect()
    assert sf.filter(pl.col("status") == "skipped").height == 3
    for table in ("step_metrics", "rejects"):
        text = scan_table(tmp_path / "wh", table).collect().write_csv()
        assert "secret" not in text.lower()


def test_a_tokenizer_outside_the_run_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(LOG)
    (run / "run.toml").write_text('tokenizer = "../../../etc/passwd"\n')
    res = _cli("ingest", str(run), "--warehouse", str(tmp_path / "wh"))
    assert res.returncode == 2 and "tokenizer" in res.stderr and "outside the run directory" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("run_id", "toml", "says"),
    [
        ("éé", None, "is not allowed"),
        ("x" * 300, None, "at most 128"),
        ("...", None, "is not allowed"),
        ("../../x", None, "is not allowed"),
        (None, "run_id = 5\n", "must be a string"),
        (None, 'run_id = "../x"\n', "is not allowed"),
        (None, 'started_at = "yesterday"\n', "started_at"),
        (None, "started_at = 1e300\n", "started_at"),
        (None, 'tags = "x"\n', "tags"),
        (None, "n_gpus = -1\n", "n_gpus"),
    ],
)
def test_bad_ids_and_manifests_exit_2_with_one_line(tmp_path: Path, run_id: str | None, toml: str | None,
                                                    says: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(LOG)
    if toml is not None:
        (run / "run.toml").write_text(toml)
    wh = tmp_path / "wh"
    res = _cli("ingest", str(run), "--warehouse", str(wh), *(["--run-id", run_id] if run_id is not None else []))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert published_runs(wh) == {}  # nothing written


def test_a_bad_run_among_several_stops_before_any_is_written(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    for d in (good, bad):
        d.mkdir()
        (d / "train.log").write_text(LOG)
    (bad / "run.toml").write_text("run_id = 5\n")
    res = _cli("ingest", str(good), str(bad), "--warehouse", str(tmp_path / "wh"))
    assert res.returncode == 2 and "bad" in res.stderr
    assert published_runs(tmp_path / "wh") == {}


def test_two_paths_with_one_run_id_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "train.log").write_text(LOG)
        (d / "run.toml").write_text('run_id = "same"\n')
    res = _cli("ingest", str(a), str(b), "--warehouse", str(tmp_path / "wh"))
    assert res.returncode == 2 and "both hold run 'same'" in res.stderr
