"""Readers racing re-ingests: N writer processes re-ingest one run (three versions whose tables are
told apart by their content) while M reader processes query it, for a fixed time. Every read is one
whole version, across tables, and no read ends in a traceback; when the readers are gone, the
replaced versions' files go too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from analyses.api import PolyTrace
from analyses.ingest import ingest_run
from analyses.warehouse import parquet_root, read_published, reader_lease, readers_active

REPO = Path(__file__).resolve().parents[1]
WRITERS, READERS, SECONDS = 2, 2, 10.0

# one read spanning four tables: a mix of two versions cannot give any version's row
SIGNATURE = ("SELECT (SELECT count(*) FROM steps WHERE run_id = 'r') AS steps, "
             "(SELECT round(sum(value), 6) FROM step_metrics WHERE run_id = 'r') AS metrics, "
             "(SELECT min(sha256) FROM source_files WHERE run_id = 'r') AS sha, "
             "(SELECT count(*) FROM step_windows WHERE run_id = 'r') AS windows")

# every process signals it is ready (imports done: seconds on a loaded machine), then all start at
# once on the go file, which holds the common deadline
_START = """
    import sys, time
    from pathlib import Path
    def start(sync, me):
        (Path(sync) / f"ready-{me}").touch()
        while not (Path(sync) / "go").exists():
            time.sleep(0.01)
        return float((Path(sync) / "go").read_text())
"""

_WRITER = textwrap.dedent(_START + """
    from analyses.ingest import ingest_run
    root, sync, first = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    runs = [Path(p) for p in sys.argv[4:]]
    deadline = start(sync, f"w{first}")
    n = 0
    while time.time() < deadline:
        ingest_run(runs[(first + n) % len(runs)], root, replace=True)  # versions of one directory
        n += 1
    print(n)
""")

# each read is a whole `polytrace query` (the CLI's sandboxed path) or a facade connection; any
# exception escaping either is what a user sees as a traceback
_READER = textwrap.dedent(_START + """
    import contextlib, io, json, traceback
    from analyses.api import PolyTrace
    from analyses.cli import main
    root, sync, sql, me = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    deadline = start(sync, f"r{me}")
    i = 0
    while time.time() < deadline:
        try:
            if i % 2 == 0:
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    rc = main(["query", sql, "--format", "json", "--warehouse", root])
                row = json.loads(out.getvalue())[0] if rc == 0 else {"rc": rc, "stderr": err.getvalue()}
                print(json.dumps({"cli": row}), flush=True)
            else:
                con = PolyTrace(root).connect()
                cols = [d[0] for d in con.execute(sql).description]
                row = dict(zip(cols, con.fetchone()))
                con.close()
                print(json.dumps({"api": row}), flush=True)
        except BaseException:
            print(json.dumps({"traceback": traceback.format_exc()}), flush=True)
        i += 1
""")


def _version(tmp: Path, name: str, n: int, gen: float) -> Path:
    d = tmp / name / "r"
    d.mkdir(parents=True)
    (d / "train.log").write_text("".join(
        f"step:{s} - timing_s/gen:{gen + s} - timing_s/step:{2 * gen + s} - response_length/mean:{100 + s}\n"
        for s in range(1, n + 1)))
    (d / "run.toml").write_text('run_id = "r"\n')
    return d


def _signature(root: Path) -> dict:
    con = PolyTrace(root).connect()
    cols = [d[0] for d in con.execute(SIGNATURE).description]
    return dict(zip(cols, con.fetchone(), strict=True))


@pytest.mark.slow
def test_readers_racing_reingests_see_one_whole_version_and_never_a_traceback(tmp_path: Path) -> None:
    versions = [_version(tmp_path, f"v{i}", n, gen) for i, (n, gen) in enumerate([(3, 10.0), (5, 20.0), (2, 30.0)])]
    expected = []
    for i, v in enumerate(versions):
        ingest_run(v, tmp_path / f"alone{i}")
        expected.append(_signature(tmp_path / f"alone{i}"))
    assert len({json.dumps(e, sort_keys=True) for e in expected}) == 3
    root = tmp_path / "wh"
    ingest_run(versions[0], root, replace=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), POLARS_MAX_THREADS="1")
    sync = tmp_path / "sync"
    sync.mkdir()
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(root), str(sync), str(w), *map(str, versions)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for w in range(WRITERS)]
    readers = [subprocess.Popen([sys.executable, "-c", _READER, str(root), str(sync), SIGNATURE, str(r)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(READERS)]
    procs = writers + readers
    t0 = time.monotonic()
    while len(list(sync.glob("ready-*"))) < len(procs) and time.monotonic() - t0 < 300:
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.05)
    (sync / "go").write_text(str(time.time() + SECONDS))
    outs = [p.communicate(timeout=SECONDS + 300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    publishes = sum(int(out.strip()) for out, _ in outs[:WRITERS])
    reads = [json.loads(line) for out, _ in outs[WRITERS:] for line in out.splitlines()]
    tracebacks = [r["traceback"] for r in reads if "traceback" in r]
    failed = [r for r in reads if "cli" in r and "rc" in r["cli"]]
    # the race did happen (on 2 cores under a load of 18: 4 publishes and 9 reads in the 10 s)
    assert publishes >= 3 and len(reads) >= 6, (publishes, len(reads))
    assert not tracebacks, f"{len(tracebacks)} of {len(reads)} reads ended in a traceback:\n{tracebacks[0]}"
    assert not failed, f"{len(failed)} of {len(reads)} queries failed: {failed[0]}"
    mixed = [r for r in reads if next(iter(r.values())) not in expected]
    assert not mixed, f"{len(mixed)} of {len(reads)} reads are no one version: {mixed[0]} (versions: {expected})"
    # with no reader left, the next ingest removes every replaced version's files
    ingest_run(versions[1], root, replace=True)
    published = {root / f.path for f in read_published(root, "r").files()}
    assert set(parquet_root(root).rglob("*.parquet")) == published


def test_a_replaced_version_stays_while_a_reader_holds_it(tmp_path: Path) -> None:
    """The mechanism, in one process: a reader lease keeps the replaced files; without readers they go."""
    v1, v2 = _version(tmp_path, "v1", 3, 10.0), _version(tmp_path, "v2", 5, 20.0)
    root = tmp_path / "wh"
    ingest_run(v1, root, replace=True)
    con = PolyTrace(root).connect()  # holds a lease while it lives: it may read v1's files at any time
    old = {root / f.path for f in read_published(root, "r").files()}
    ingest_run(v2, root, replace=True)
    assert all(p.exists() for p in old)  # kept for the reader
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 3  # still the version it bound
    con.close()
    del con
    with reader_lease(root):  # another reader does not keep files no one can hold any more from going
        pass
    ingest_run(v1, root, replace=True)  # the next commit, with no reader, removes every replaced version
    published = {root / f.path for f in read_published(root, "r").files()}
    assert set(parquet_root(root).rglob("*.parquet")) == published
    assert PolyTrace(root).connect().execute("SELECT count(*) FROM steps").fetchone()[0] == 3


@pytest.mark.parametrize("what", ["fit", "report"])
def test_long_readers_hold_their_version_for_all_of_their_reading(tmp_path: Path, what: str) -> None:
    """A fit or a report reads for seconds: a re-ingest meanwhile keeps the files it may still open."""
    root = tmp_path / "wh"
    ingest_run(REPO / "sample_logs" / "polytrace-math-dapo", root)
    pt = PolyTrace(root)
    seen: list[bool] = []

    def progress(kind: str, data: dict) -> None:
        seen.append(readers_active(root))

    if what == "fit":
        pt.fit(progress=progress, cache=False)
    else:
        pt.report(out=tmp_path / "r.html", png=False, progress=progress)
    assert len(seen) >= 2 and all(seen)
    assert not readers_active(root)  # and given back when done
