"""The `polytrace` command line: exit codes, output formats, read-only queries."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyses.api import PolyTrace
from analyses.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def _log(tmp_path: Path) -> Path:
    d = tmp_path / "runs" / "demo"
    d.mkdir(parents=True)
    (d / "train.log").write_text("".join(f"step:{s} - timing_s/step:{s}.5 - timing_s/gen:1.0\n" for s in range(3)))
    return d


def test_ingest_query_runs_roundtrip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wh = tmp_path / "wh"
    assert main(["ingest", str(_log(tmp_path)), "--warehouse", str(wh)]) == 0
    out = capsys.readouterr().out
    assert "train.log: verl_console" in out and "parsed=3" in out and "rejected=0" in out
    assert main(["query", "SELECT step, step_time_s FROM steps ORDER BY step", "--warehouse", str(wh), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{"step": 0, "step_time_s": 0.5}, {"step": 1, "step_time_s": 1.5}, {"step": 2, "step_time_s": 2.5}]
    assert main(["query", "SELECT count(*) AS n FROM step_metrics", "--warehouse", str(wh), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "6"]
    assert main(["runs", "--warehouse", str(wh)]) == 0
    assert "demo: " in capsys.readouterr().out


def test_root_ingests_each_subdirectory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _log(tmp_path).parent
    (root / "second").mkdir()
    (root / "second" / "x.log").write_text("step:7 - timing_s/step:1.0\n")
    wh = tmp_path / "wh"
    assert main(["ingest", "--root", str(root), "--warehouse", str(wh), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    main(["query", "SELECT run_id FROM runs ORDER BY 1", "--warehouse", str(wh), "--format", "csv"])
    assert capsys.readouterr().out.split() == ["run_id", "demo", "second"]


def test_env_warehouse_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POLYTRACE_WAREHOUSE", str(tmp_path / "envwh"))
    assert main(["ingest", str(_log(tmp_path)), "-q"]) == 0
    assert (tmp_path / "envwh" / "polytrace.duckdb").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ingest", "/no/such/dir"], "no such file or directory"),
        (["ingest"], "nothing to ingest"),
        (["ingest", "--root", "/no/such/root"], "not a directory"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_query_is_read_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wh = tmp_path / "wh"
    main(["ingest", str(_log(tmp_path)), "--warehouse", str(wh), "-q"])
    assert main(["query", "DROP VIEW steps", "--warehouse", str(wh)]) == 2
    assert "read-only" in capsys.readouterr().err
    assert main(["query", "SELEC nonsense", "--warehouse", str(wh)]) == 2
    assert main(["query", "SELECT count(*) FROM steps", "--warehouse", str(wh), "--format", "csv"]) == 0
    assert capsys.readouterr().out.split()[-1] == "3"


def test_runs_counts_a_run_of_worker_times_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a PAI-style per-worker timing file has no steps, samples or telemetry: the run is not all zeros
    d = tmp_path / "pai"
    d.mkdir()
    shutil.copy(FIXTURES / "telemetry" / "worker_times_quirks.csv", d)
    wh = tmp_path / "wh"
    assert main(["ingest", str(d), "--warehouse", str(wh), "-q"]) == 0
    capsys.readouterr()
    assert main(["runs", "--warehouse", str(wh)]) == 0
    line = capsys.readouterr().out.strip()
    n = PolyTrace(wh).connect().sql("SELECT count(*) FROM rank_times").fetchall()[0][0]
    assert n > 0 and f"rank_times={n} " in line and "steps=0 samples=0" in line


def test_query_csv_writes_lists_and_structs_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # step_variance.outlier_steps is a list column: CSV has no lists, so it is the JSON text
    wh = tmp_path / "wh"
    main(["ingest", str(_log(tmp_path)), "--warehouse", str(wh), "-q"])
    capsys.readouterr()
    sql = "SELECT [3, 17] AS steps, {'a': 1, 'b': 'x'} AS s, CAST(NULL AS INT[]) AS none"
    assert main(["query", sql, "--warehouse", str(wh), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["steps,s,none", '"[3,17]","{""a"":1,""b"":""x""}",']


def test_every_command_has_help_with_an_example() -> None:
    for cmd in ("ingest", "query", "runs"):
        out = subprocess.run([sys.executable, "-m", "analyses.cli", cmd, "--help"], capture_output=True, text=True)
        assert out.returncode == 0
        assert "example" in out.stdout, cmd


def test_progress_on_a_terminal_counts_files_bytes_and_rows(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from analyses.ingest import ingest_run
    from analyses.progress import IngestProgress

    root = _log(tmp_path).parent
    (root / "second").mkdir()
    (root / "second" / "a.log").write_text("step:1 - timing_s/step:1.0\n")
    (root / "second" / "b.log").write_text("step:2 - timing_s/step:1.0\n")
    buf = io.StringIO()
    progress = IngestProgress(enabled=True, console=Console(file=buf, force_terminal=True, width=160))
    with progress:  # two runs in a row: task ids outlive removed tasks
        for run in (root / "demo", root / "second"):
            ingest_run(run, tmp_path / "wh", progress=progress.event)
    # files restart per run (the second has 2); rows add up over the session:
    # 3 step lines x 2 metrics in the first run + 2 lines x 1 metric in the second
    assert progress._files == 2 and progress._rows == 8
    assert " rows" in buf.getvalue()


def test_progress_line_fits_80_columns(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from analyses.progress import IngestProgress

    buf = io.StringIO()
    progress = IngestProgress(enabled=True, console=Console(file=buf, force_terminal=True, width=80))
    with progress:
        progress.event("run_start", {"run_id": "x" * 128, "files": 3, "bytes": 300 * 2**20})
        progress.event("file_progress", {"path": "a.log", "lines": 10**6, "rows": 12_345_678})
        progress._progress.refresh()
    lines = [ln for ln in buf.getvalue().replace("\r", "\n").splitlines() if ln.strip()]
    visible = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ln) for ln in lines]
    assert visible and all(len(v) <= 80 for v in visible), visible
    assert any("12,345,678 rows" in v for v in visible)


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "analyses.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and re.fullmatch(r"polytrace \S+\n", out.stdout)



CONSOLE = """
import atexit, sys, threading
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(1)
pool.submit(lambda: None).result()  # an idle worker thread, as the ingest's pools leave them
atexit.register(lambda: print("atexit ran", flush=True))
sys.argv = ["polytrace", *sys.argv[1:]]
from analyses.cli import console
console()
print("not reached")
"""


@pytest.mark.parametrize(("args", "code", "out"), [(["--version"], 0, "polytrace "), (["no-such-command"], 2, "")])
def test_console_exit_keeps_status_output_and_atexit(args: list[str], code: int, out: str) -> None:
    """The installed command leaves without the interpreter's teardown (analyses.cli.console):
    the exit status, the flushed output and the atexit handlers are those of a normal exit, and
    idle pool threads do not keep it waiting."""
    run = subprocess.run([sys.executable, "-c", CONSOLE, *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == code, run.stderr
    assert run.stdout.startswith(out) and run.stdout.endswith("atexit ran\n") and "not reached" not in run.stdout
    assert ("invalid choice" in run.stderr) == (code == 2)


def test_the_command_collects_garbage_less_often_than_python_by_default() -> None:
    """``console`` raises the youngest generation's threshold for the process it owns (an import of
    Polars and DuckDB alone was ~100 collections at Python's 700); a caller importing
    :mod:`analyses.cli` keeps its own."""
    import gc

    from analyses.cli import GC_THRESHOLD

    assert gc.get_threshold()[0] < GC_THRESHOLD  # this process never ran console()
    code = CONSOLE.replace('atexit.register(lambda: print("atexit ran", flush=True))',
                           'import gc; atexit.register(lambda: print("threshold", gc.get_threshold()[0], flush=True))')
    run = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.endswith(f"threshold {GC_THRESHOLD}\n"), run.stdout


def test_console_under_a_profiler_exits_normally_so_the_profile_is_written(tmp_path: Path) -> None:
    """``python -m cProfile -o F -m analyses.cli ...`` (and coverage, a debugger): the fast exit
    would skip the profiler's own exit handling, so under one the command exits as usual."""
    out = tmp_path / "cli.prof"
    run = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "analyses.cli", "--version"],
                         capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0 and run.stdout.startswith("polytrace "), run.stderr
    assert out.stat().st_size > 0
