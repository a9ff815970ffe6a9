"""A full disk is not a bad input: on a real small filesystem (tmpfs) that fills while a run is
staged, nothing is published, the previous version stays, the staging goes, and the command says
``no space left on <warehouse>`` in one line with exit 1. The outputs (a spec, an export) keep their
previous content whole when the disk is full.

Mounting needs root (this suite runs as root in CI); where it is impossible the tests skip, and
under CI=true they fail.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ci import skip_or_fail

from analyses.atomic_output import WriteFailed
from analyses.cli import main
from analyses.schema import TABLES
from analyses.warehouse import STAGING, parquet_root, read_published, scan_table

SIZE = "1m"


@pytest.fixture
def small_fs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs of :data:`SIZE` (or the test's parameter) mounted for this test alone."""
    size = getattr(request, "param", SIZE)
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        skip_or_fail("mounting a small tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _big_run(d: Path) -> Path:
    """Nine verl JSONL files whose step metrics (random values: they barely compress) stage to ~1.1 MB."""
    d.mkdir(parents=True)
    rng = random.Random(6)
    for f in range(9):
        with open(d / f"metrics_{f}.jsonl", "w") as fh:
            for step in range(1, 401):
                fh.write(json.dumps({"step": step, "data": {f"m{f}/k{k}": rng.random() for k in range(40)}}) + "\n")
    (d / "run.toml").write_text('run_id = "r"\n')
    return d


def _small_run(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "train.log").write_text("".join(f"step:{s} - timing_s/gen:{s} - response_length/mean:{100 + s}\n"
                                         for s in range(1, 6)))
    (d / "run.toml").write_text('run_id = "r"\n')
    return d


def _ingest(run: Path, wh: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    rc = main(["ingest", str(run), "--warehouse", str(wh), "-q"])
    return rc, capsys.readouterr().err.strip().splitlines()


def _leftovers(wh: Path) -> list[Path]:
    """Staging, half-written files and files no manifest names."""
    named = {wh / f.path for f in (read_published(wh, "r").files() if read_published(wh, "r") else [])}
    staged = list((wh / STAGING).iterdir()) if (wh / STAGING).exists() else []
    unnamed = [p for p in parquet_root(wh).rglob("*") if p.is_file() and p not in named] if parquet_root(wh).exists() else []
    tmp = [p for p in wh.rglob("*.tmp")]
    return staged + unnamed + tmp


# 512 KiB fill while a file's rows are staged (the files after it were once recorded as errors and the
# run published); 1 MiB while the files' step metrics are merged (DuckDB's write fails)
@pytest.mark.parametrize("small_fs", ["512k", "1m"], ids=["full-while-staging-a-file", "full-while-merging"],
                         indirect=True)
def test_a_first_ingest_that_fills_the_disk_publishes_nothing(small_fs: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run = _big_run(tmp_path / "in" / "r")
    wh = small_fs / "wh"
    rc, err = _ingest(run, wh, capsys)
    assert rc == 1, err
    assert len(err) == 1 and f"no space left on {wh}" in err[0] and "run r: not published" in err[0], err
    assert read_published(wh, "r") is None  # no run with 4 of its 9 files marked as errors
    assert _leftovers(wh) == []
    # the space is back: the same command now lands the whole run
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_fs)], check=True)
    rc, err = _ingest(run, wh, capsys)
    assert rc == 0, err
    files = scan_table(wh, "source_files").collect()
    # the nine logs land; run.toml is accounted for as skipped (read for the run's facts)
    assert files.height == 10 and files.group_by("status").len().sort("status").rows() == [("ok", 9), ("skipped", 1)]


def test_a_reingest_that_fills_the_disk_keeps_the_previous_version(small_fs: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    wh = small_fs / "wh"
    assert _ingest(_small_run(tmp_path / "v1" / "r"), wh, capsys)[0] == 0
    before = read_published(wh, "r")
    tables = {t: scan_table(wh, t).collect() for t in TABLES}
    rc, err = _ingest(_big_run(tmp_path / "v2" / "r"), wh, capsys)
    assert rc == 1 and len(err) == 1 and f"no space left on {wh}" in err[0], err
    assert "previous version stays" in err[0]
    assert read_published(wh, "r") == before
    assert all(scan_table(wh, t).collect().equals(tables[t]) for t in TABLES)
    assert _leftovers(wh) == []


def test_a_full_disk_keeps_the_previous_spec_and_export_whole(small_fs: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from _fit_synth import synth_samples

    from analyses.export.spec import build_spec, write_spec
    from analyses.fit.workload import fit_workload

    w = fit_workload(synth_samples(steps=3, prompts=8, n=4, cap=1000, seed=2, first_step=1), run_id="s", task="math")
    spec_doc = build_spec({"s": w}, ["s"])
    spec = write_spec(spec_doc, small_fs / "spec.json")
    old_spec = spec.read_bytes()
    out = small_fs / "gen"
    argv = ["export", "--spec", str(spec), "--format", "polytrace-v2", "--out", str(out), "--steps", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    old_export = {p.name: p.read_bytes() for p in out.iterdir()}
    # fill the disk to its last few KiB
    with open(small_fs / "filler", "wb", buffering=0) as fh, pytest.raises(OSError):
        while True:
            fh.write(b"\0" * 4096)
    assert main([*argv[:-1], "400"]) == 1  # a larger export does not fit
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no space left on {small_fs}" in err[0], err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old_export
    bigger = build_spec({f"s{i}": {**w, "run_id": f"s{i}"} for i in range(40)}, [f"s{i}" for i in range(40)])
    with pytest.raises(WriteFailed, match=f"no space left on {small_fs}"):
        write_spec(bigger, spec)
    assert spec.read_bytes() == old_spec  # not truncated
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler", "gen", "spec.json"]
