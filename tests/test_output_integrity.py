"""Outputs appear whole or not at all: ``polytrace export``, ``fit`` and ``report`` killed with
SIGKILL (the whole process group, Chromium included) at seeded points leave the previous output or
the new one, never part of one, and the next run removes the dead writer's staging.

Two kinds of kill point, a handful each: a seeded fraction of a full run's duration (anywhere in
the command), and the moment the command starts writing (a new entry appears where it writes) plus
a seeded few milliseconds, since a write is a small part of a run that random delays rarely hit.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from analyses.api import PolyTrace
from analyses.atomic_output import MARKER, SUFFIX, OutputRefused, clean_stale, staged_dir, staged_file
from analyses.cli import main
from analyses.export.registry import export
from analyses.export.spec import read_spec
from analyses.ingest import ingest_run
from analyses.report import find_browser

REPO = Path(__file__).resolve().parents[1]
RUN = "polytrace-math-dapo"
SEED = 25
EXPORT_STEPS = "300"  # 601 files, as in the report of the partial directory


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A warehouse with one run that has per-sample lengths, and its spec."""
    tmp = tmp_path_factory.mktemp("outputs")
    wh = tmp / "wh"
    ingest_run(REPO / "sample_logs" / RUN, wh)
    spec = tmp / "spec.json"
    PolyTrace(wh).fit(out=spec)
    return {"wh": wh, "spec": spec}


def _popen(argv: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), POLARS_MAX_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "analyses.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def _kill(proc: subprocess.Popen) -> bool:
    """SIGKILL the command and everything it started; False when it had already finished."""
    if proc.poll() is not None:
        return False
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return True


def _timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    proc = _popen(argv)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 0, err.decode()[-2000:]
    return time.monotonic() - t0


def _listing(dirs: list[Path]) -> set[str]:
    out = set()
    for d in dirs:
        try:
            out |= {str(p) for p in d.iterdir()}
        except OSError:
            pass
    return out


def kill_at_seeded_points(argv: list[str], watch: list[Path], full_s: float, check: Callable[[str], None],
                          before_each: Callable[[], None] = lambda: None, n_delays: int = 2, n_writes: int = 2) -> None:
    """Run ``argv`` once per seeded kill point, SIGKILL it there and ``check`` the output (told
    where the kill landed). ``watch``: directories whose new entries mean the command started
    writing; ``before_each`` sets up the state each run starts from."""
    rng = random.Random(SEED)
    for i in range(n_delays + n_writes):
        before_each()
        proc = _popen(argv)
        if i < n_delays:
            delay = rng.uniform(0.4, 1.0) * full_s
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                pass
            what = f"after {delay:.2f}s"
        else:
            before = _listing(watch)
            extra = rng.uniform(0.0, 0.05)
            deadline = time.monotonic() + 5 * full_s
            while proc.poll() is None and _listing(watch) == before and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(extra)
            what = f"{extra * 1000:.0f} ms into its writing"
        check(what if _kill(proc) else f"{what} (it had finished)")


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != MARKER}


def _partials(*dirs: Path) -> list[Path]:
    return [p for d in dirs if d.exists() for p in d.rglob("*") if p.name.endswith(SUFFIX) or p.name.endswith(".tmp")
            or (p.name.startswith(".") and p.name != MARKER)]


def test_a_killed_export_leaves_the_old_directory_or_the_new_one_whole(fitted: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    spec = read_spec(fitted["spec"])
    old = _tree(Path(_ref(spec, tmp_path / "ref-old", seed=1)))
    new = _tree(Path(_ref(spec, tmp_path / "ref-new", seed=2)))
    assert old != new and len(new) == 601
    work = tmp_path / "work"
    out = work / "gen"
    argv = ["export", "--spec", str(fitted["spec"]), "--format", "polytrace-v2", "--out", str(out),
            "--steps", EXPORT_STEPS, "--seed", "2"]

    def reset() -> None:
        """The previous export, to be replaced, as ``export`` leaves it (the dead writer's staging removed,
        seed 1's files and marker): a copy of ref-old, a fifth of the export's CPU."""
        clean_stale(work, out.name)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tmp_path / "ref-old", out)

    reset()
    full_s = _timed(argv)
    assert _tree(out) == new

    def check(what: str) -> None:
        seen = _tree(out) if out.exists() else None
        assert seen in (None, old, new), f"killed {what}: {len(seen or {})} files, neither export whole"

    kill_at_seeded_points(argv, [work, out], full_s, check, reset)
    # the next export removes what the dead ones left beside the output, and lands whole
    assert main(argv) == 0
    assert _tree(out) == new
    assert sorted(p.name for p in work.iterdir()) == ["gen"], sorted(p.name for p in work.iterdir())


def _ref(spec: dict, out: Path, seed: int) -> Path:
    export(spec, "polytrace-v2", out, steps=int(EXPORT_STEPS), seed=seed)
    return out


def test_a_killed_fit_leaves_no_half_spec_and_no_half_cache_entry(fitted: dict[str, Path], tmp_path: Path) -> None:
    wh = fitted["wh"]
    spec_out = tmp_path / "specs" / "spec.json"
    cache_dir = wh / "fits" / "cache" / RUN
    argv = ["fit", "--warehouse", str(wh), "--out", str(spec_out), "-q"]
    full_s = _timed(argv)
    want = spec_out.read_bytes()
    assert json.loads(want)["workloads"]

    def check(what: str) -> None:
        if spec_out.exists():
            assert spec_out.read_bytes() == want, f"killed {what}: a partial spec"
        for p in cache_dir.glob("*.json"):
            doc = json.loads(p.read_text())  # a half-written entry would not parse
            assert set(doc) == {"key", "value"}, f"killed {what}: {p}"

    def fresh() -> None:  # every kill meets a fit that has to compute and write its cache entry again
        spec_out.unlink(missing_ok=True)
        for p in cache_dir.glob("*.json"):
            p.unlink()

    kill_at_seeded_points(argv, [spec_out.parent, cache_dir, cache_dir.parent], full_s, check, fresh)
    assert main(argv) == 0
    assert spec_out.read_bytes() == want
    assert not _partials(spec_out.parent, wh / "fits"), _partials(spec_out.parent, wh / "fits")


def _png_ok(p: Path) -> bool:
    data = p.read_bytes()
    return data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82")


@pytest.mark.slow
def test_a_killed_report_leaves_the_html_and_its_png_directory_whole_or_absent(fitted: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    wh = fitted["wh"]
    html = tmp_path / "rep" / "report.html"
    pngs = html.with_name("report_png")
    argv = ["report", "--warehouse", str(wh), "--out", str(html), "-q"]
    full_s = _timed(argv)
    text = html.read_text()
    n_figures = text.count("class='figure'")
    assert text.endswith("</html>\n") and n_figures > 0
    names = sorted(p.name for p in pngs.iterdir() if p.name != MARKER) if pngs.exists() else []
    if find_browser() is not None:
        assert names, "a browser was found but no PNG written"

    def check(what: str) -> None:
        if html.exists():
            t = html.read_text()
            assert t.endswith("</html>\n") and t.count("class='figure'") == n_figures, f"killed {what}: partial HTML"
        if pngs.exists():
            got = sorted(p.name for p in pngs.iterdir() if p.name != MARKER)
            assert got == names and all(_png_ok(pngs / n) for n in got), f"killed {what}: {len(got)} of {len(names)} PNGs"

    def fresh() -> None:  # absent before each kill: a directory with some of the PNGs is then a partial one
        html.unlink(missing_ok=True)
        shutil.rmtree(pngs, ignore_errors=True)

    # a report with its PNGs is the longest command: one kill at a delay, two while it writes
    kill_at_seeded_points(argv, [html.parent, pngs], full_s, check, fresh, n_delays=1)
    assert main(argv) == 0
    assert html.read_text().endswith("</html>\n")
    assert sorted(p.name for p in html.parent.iterdir()) == sorted(["report.html", *(["report_png"] if names else [])])


# ---------------------------------------------------------------------------- the building blocks


def test_a_directory_polytrace_did_not_write_is_never_replaced(fitted: dict[str, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    argv = ["export", "--spec", str(fitted["spec"]), "--format", "vidur", "--out", str(mine), "--steps", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds files polytrace did not write" in err[0]
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # and no staging left beside it
    # an empty directory, or one polytrace wrote, is replaced whole: stale files of a larger export go
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*argv[:-3], str(empty), "--steps", "2"]) == 0
    (empty / "left-by-an-older-export.csv").write_text("x\n")
    assert main([*argv[:-3], str(empty), "--steps", "2"]) == 0
    assert "left-by-an-older-export.csv" not in {p.name for p in empty.iterdir()}


def test_staging_of_a_live_writer_is_left_alone_and_a_dead_ones_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with staged_dir(out, "test") as live:
        (live.path / "a.txt").write_text("being written\n")
        # a dead writer's staging: a marker (it took its lock and started), no lock held any more
        dead = tmp_path / f".out.deadbeef{SUFFIX}"
        dead.mkdir()
        (dead / MARKER).write_text("{}\n")
        (dead / "half.txt").write_text("x")
        assert clean_stale(tmp_path, "out") == [dead]
        assert live.path.exists()
        # and a second writer of the same output meanwhile: it lands, the live one is not touched
        with staged_dir(out, "test") as other:
            (other.path / "b.txt").write_text("other\n")
        assert live.path.exists() and (out / "b.txt").exists()
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "a.txt"]  # the later rename wins, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(OutputRefused, match="not a directory"):
        (tmp_path / "file").write_text("x")
        with staged_dir(tmp_path / "file", "test"):
            pass


def test_a_writer_killed_between_mkstemp_and_flock_leaves_nothing_behind(tmp_path: Path) -> None:
    """Its entry is empty and unlocked: the next writer removes it at once (entries are created and
    locked under the parent's lock, so an unlocked one is never a live writer's)."""
    empty_file = tmp_path / f".spec.json.k1lled{SUFFIX}"
    empty_file.touch()
    empty_dir = tmp_path / f".gen.k1lled{SUFFIX}"
    empty_dir.mkdir()
    with staged_file(tmp_path / "spec.json") as fh:
        fh.write("{}\n")
    with staged_dir(tmp_path / "gen", "test"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen", "spec.json"]


def test_a_file_is_replaced_whole_and_a_failed_write_leaves_the_old_one(tmp_path: Path) -> None:
    p = tmp_path / "spec.json"
    p.write_text("old\n")
    with pytest.raises(RuntimeError), staged_file(p) as fh:
        fh.write("half of the new")
        raise RuntimeError("the writer fails midway")
    assert p.read_text() == "old\n" and sorted(x.name for x in tmp_path.iterdir()) == ["spec.json"]
    with staged_file(p) as fh:
        fh.write("new\n")
    assert p.read_text() == "new\n" and oct(p.stat().st_mode & 0o777) != oct(0o600)
