"""A run's commit is atomic and serialized: killed at any step, readers see the previous version
or the new one whole; two writers of one run id never mix; stale staging goes at the next ingest;
a version that fails a blocking check never replaces the previous one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import polars as pl
import pytest

import analyses.ingest as ingest_mod
from analyses.api import PolyTrace
from analyses.ingest import ingest_run
from analyses.schema import TABLES
from analyses.warehouse import (
    ENV_KILL_AT,
    STAGING,
    CommitRefused,
    RunLocked,
    parquet_root,
    published_runs,
    read_published,
    run_lock,
    scan_table,
)

REPO = Path(__file__).resolve().parents[1]


def _verl_log(n: int, gen: float) -> str:
    return "".join(f"step:{s} - timing_s/gen:{gen + s} - timing_s/step:{2 * gen + s} - response_length/mean:{100 + s}\n"
                   for s in range(1, n + 1))


def _version(tmp: Path, name: str, n: int, gen: float) -> Path:
    d = tmp / name / "r"
    d.mkdir(parents=True)
    (d / "train.log").write_text(_verl_log(n, gen))
    (d / "run.toml").write_text('run_id = "r"\n')
    return d


def _snapshot(root: Path) -> dict[str, pl.DataFrame]:
    return {t: scan_table(root, t).collect().drop("path", strict=False) for t in TABLES}


def _same(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> bool:
    # source_files carries per-file timings? no: only content; sha256 differs between versions
    return all(a[t].equals(b[t]) for t in TABLES)


_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from analyses.ingest import ingest_run
    ingest_run(Path(sys.argv[1]), Path(sys.argv[2]), replace=True)
""")


def _ingest_in_child(run: Path, root: Path, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, POLARS_MAX_THREADS="1", PYTHONPATH=str(REPO))
    env.pop(ENV_KILL_AT, None)
    if kill_at:
        env[ENV_KILL_AT] = kill_at
    return subprocess.run([sys.executable, "-c", _CHILD, str(run), str(root)], env=env, capture_output=True,
                          text=True, timeout=300)


KILL_POINTS = ["read", "staged", "compacted", "checked", *(f"moved:{t}" for t in TABLES), "published", "catalog",
               "cleaned", "done"]
AFTER_PUBLISH = {"published", "catalog", "cleaned", "done"}


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The tables of versions 1, 2 and 3 of run r, each ingested alone (the expected states). They
    stand for one run directory whose logs changed, so the tests re-ingest them with ``replace``
    (a run id published from one directory is otherwise never replaced from another)."""
    tmp = tmp_path_factory.mktemp("versions")
    out: dict[str, object] = {}
    for i, (n, gen) in enumerate([(3, 10.0), (5, 20.0), (2, 30.0)], start=1):
        d = _version(tmp, f"v{i}", n, gen)
        root = tmp / f"wh{i}"
        ingest_run(d, root)
        out[f"v{i}"] = d
        out[f"tables{i}"] = _snapshot(root)
    return out


@pytest.mark.parametrize("step", KILL_POINTS)
def test_a_kill_at_any_commit_step_leaves_one_whole_version(tmp_path: Path, versions: dict, step: str) -> None:
    root = tmp_path / "wh"
    ingest_run(versions["v1"], root, replace=True)
    res = _ingest_in_child(versions["v2"], root, kill_at=step)
    assert res.returncode == -9, res.stderr  # SIGKILL, as a crash or an OOM kill would
    seen = _snapshot(root)
    expected = versions["tables2"] if step in AFTER_PUBLISH else versions["tables1"]
    assert _same(seen, expected), f"killed at {step}: neither the old nor the new version whole"
    # the catalog a DuckDB client opens agrees with what polytrace reads
    con = PolyTrace(root).connect()
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == expected["steps"].height
    con.close()
    del con  # a live connection is a reader: the files of the version it bound would be kept for it
    # the next ingest cleans what the killed one left and publishes whole
    ingest_run(versions["v3"], root, replace=True)
    assert _same(_snapshot(root), versions["tables3"])
    assert not any((root / STAGING).iterdir())
    published = {root / f.path for f in read_published(root, "r").files()}
    assert set(parquet_root(root).rglob("*.parquet")) == published


def test_two_writers_of_one_run_are_serialized_never_mixed(tmp_path: Path, versions: dict) -> None:
    root = tmp_path / "wh"
    env = dict(os.environ, POLARS_MAX_THREADS="1", PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(versions[v]), str(root)], env=env,
                              stderr=subprocess.PIPE, text=True) for v in ("v1", "v2", "v1", "v2")]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errs
    seen = _snapshot(root)
    assert _same(seen, versions["tables1"]) or _same(seen, versions["tables2"])
    published = {root / f.path for f in read_published(root, "r").files()}
    assert set(parquet_root(root).rglob("*.parquet")) == published
    assert not any((root / STAGING).iterdir())


def test_a_held_run_lock_is_waited_for_then_refused(tmp_path: Path, versions: dict) -> None:
    root = tmp_path / "wh"
    waits: list[str] = []
    with run_lock(root, "r"):
        with pytest.raises(RunLocked, match=r"run r is being written by pid \d+"):
            ingest_run(versions["v1"], root, replace=True, lock_wait_s=0.3,
                       progress=lambda kind, d: waits.append(d["message"]) if kind == "lock_wait" else None)
    assert len(waits) == 1 and "waiting for the lock on run r" in waits[0]
    assert published_runs(root) == {}
    # the CLI says it in one line and exits 2
    with run_lock(root, "r"):
        res = subprocess.run([sys.executable, "-m", "analyses.cli", "ingest", str(versions["v1"]), "--warehouse",
                              str(root), "--wait", "0"], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "being written by" in res.stderr


def test_a_second_writer_waits_and_then_lands(tmp_path: Path, versions: dict) -> None:
    root = tmp_path / "wh"
    ingest_run(versions["v1"], root, replace=True)
    held = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with run_lock(root, "r"):
            held.set()
            time.sleep(1.0)
        done.set()

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    ingest_run(versions["v2"], root, replace=True, lock_wait_s=30)
    assert done.is_set()  # it waited for the holder
    t.join()
    assert _same(_snapshot(root), versions["tables2"])


def test_stale_staging_is_removed_at_the_next_ingest(tmp_path: Path, versions: dict) -> None:
    root = tmp_path / "wh"
    ingest_run(versions["v1"], root, replace=True)
    stale = root / STAGING / "20200101T000000000000Z-deadbeef--r"
    (stale / "steps").mkdir(parents=True)
    (stale / "steps" / "part-000000.parquet").write_bytes(b"x" * 1000)
    (stale / "owner.json").write_text(json.dumps({"run_id": "r", "pid": 1, "host": "gone"}))
    orphan = parquet_root(root) / "steps" / "run_id=r" / "20200101T000000000000Z-deadbeef.parquet"
    orphan.write_bytes(b"half a file")
    ingest_run(versions["v2"], root, replace=True)
    assert not stale.exists() and not orphan.exists()
    assert _same(_snapshot(root), versions["tables2"])


def test_a_version_failing_a_blocking_check_is_kept_aside(tmp_path: Path, versions: dict,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "wh"
    ingest_run(versions["v1"], root, replace=True)
    before = read_published(root, "r")
    monkeypatch.setattr(ingest_mod, "blocking_problems", lambda files: ["steps: injected by the test"])
    with pytest.raises(CommitRefused, match="blocking check failed: steps: injected") as info:
        ingest_run(versions["v2"], root, replace=True)
    assert read_published(root, "r") == before  # the previous version stays published
    assert _same(_snapshot(root), versions["tables1"])
    kept = info.value.kept
    assert json.loads((kept / "problems.json").read_text())["problems"] == ["steps: injected by the test"]
    assert pl.read_parquet(kept / "steps.parquet").height == 5  # the refused version, for a look
    assert not any((root / STAGING).iterdir())


def test_cli_exits_1_and_says_so_when_a_run_is_refused(tmp_path: Path, versions: dict) -> None:
    root = tmp_path / "wh"
    code = textwrap.dedent(f"""
        import sys
        import analyses.ingest as m
        m.blocking_problems = lambda files: ["steps: injected"]
        from analyses.cli import main
        sys.exit(main(["ingest", {str(versions["v1"])!r}, "--warehouse", {str(root)!r}]))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 1
    assert "run r: not published, blocking check failed: steps: injected" in res.stderr
    assert "Traceback" not in res.stderr
