"""Each ``polytrace`` command imports only what it uses (issue 29, target 1): in a fresh process,
``--version`` and ``--help`` load neither DuckDB, Polars nor pyarrow, and ``query`` and ``runs``
neither scipy, plotly, dagster, the fits nor the export formats, nor Polars, pyarrow or numpy
(DuckDB prints their results); ``ingest`` of small step files loads neither pyarrow nor numpy, nor
any reader module but the one its files need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyses.cli import main

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "sample_logs"

# runs the command as `polytrace` does (argv from the command line, its own process: `query`
# lands itself in Landlock), then prints the modules it loaded as the last line of stdout
PROBE = """
import json, sys
from analyses.cli import main
sys.argv = ["polytrace", *sys.argv[1:]]
try:
    code = main()
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

HEAVY = ("scipy", "plotly", "dagster", "analyses.fit", "analyses.export", "analyses.report", "analyses.figures",
         "analyses.ingest", "analyses.readers", "sklearn", "rich")
DATA = ("duckdb", "polars", "pyarrow", "numpy")


def _loaded(*args: str) -> tuple[str, set[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    *printed, last = out.stdout.splitlines()
    res = json.loads(last)
    assert res["code"] in (0, None), out.stderr
    return "\n".join(printed), set(res["modules"])


def _under(mods: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.fixture(scope="module")
def demo_wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wh = tmp_path_factory.mktemp("imports") / "wh"
    assert main(["ingest", str(LOGS / "verl-gsm8k-ppo-v0.1"), str(LOGS / "polytrace-math-dapo"), "--warehouse", str(wh),
                 "-q"]) == 0
    return wh


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_load_no_data_library(args: list[str]) -> None:
    printed, mods = _loaded(*args)
    assert printed.startswith("polytrace " if args == ["--version"] else "usage: polytrace")
    assert "analyses.cli.query" in mods  # every command is listed: the probe sees what was imported
    assert _under(mods, HEAVY + DATA) == []


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_query_loads_duckdb_and_the_catalog_only(demo_wh: Path, fmt: str) -> None:
    printed, mods = _loaded("query", "SELECT 41 + 1 AS answer, 'x' AS s, run_id FROM runs LIMIT 1", "--format", fmt,
                            "--warehouse", str(demo_wh))
    assert "42" in printed
    assert {"duckdb", "analyses.catalog", "analyses.sandbox", "analyses.views"} <= mods
    # every derived view is created, yet no Arrow hand-over and no frame: DuckDB's rows are printed
    assert _under(mods, (*HEAVY, "polars", "pyarrow", "numpy")) == []


def test_runs_loads_no_fit_report_or_reader(demo_wh: Path) -> None:
    printed, mods = _loaded("runs", "--warehouse", str(demo_wh))
    assert printed.splitlines()[0].startswith("polytrace-math-dapo: task=math")
    assert {"duckdb", "analyses.catalog"} <= mods
    # base tables only, their rows as plain values: no view group, no Arrow hand-over to Polars
    assert _under(mods, (*HEAVY, "analyses.views", "polars", "pyarrow", "numpy")) == []


def test_ingest_of_small_step_files_loads_neither_pyarrow_nor_numpy(tmp_path: Path) -> None:
    """Issue 29, target 3: a run of small PolyTrace step files is read, staged and published with
    Polars and DuckDB alone (pyarrow and numpy cost ~0.2-0.3 s of imports, a third of it)."""
    wh = tmp_path / "wh"
    _printed, mods = _loaded("ingest", str(LOGS / "polytrace-math-dapo"), "--warehouse", str(wh), "-q")
    assert {"duckdb", "polars", "analyses.ingest", "analyses.readers.polytrace_v2"} <= mods
    assert (wh / "manifests" / "polytrace-math-dapo.json").is_file()
    assert _under(mods, ("pyarrow", "numpy", "scipy", "plotly", "dagster", "analyses.fit", "analyses.export",
                         "analyses.report")) == []
    # detection imports the readers it asks only: the heads lack the signatures of the four before
    # the step files' reader (analyses.readers.READER_SPECS), and no reader after it is asked
    from analyses.readers import READER_SPECS

    reader_modules = {s.target.split(":")[0] for s in READER_SPECS}
    assert sorted(reader_modules & mods) == ["analyses.readers.polytrace_v2"]
    assert "analyses.trace.model" not in mods  # the Kineto reader's trace model


def test_a_command_gets_its_own_arguments_only() -> None:
    from analyses.cli import build_parser

    sub = next(a for a in build_parser(["runs"])._actions if a.dest == "command")  # noqa: SLF001
    assert {a.dest for a in sub.choices["runs"]._actions} >= {"warehouse"}  # noqa: SLF001
    assert {a.dest for a in sub.choices["export"]._actions} == {"help"}  # noqa: SLF001


# the installed command (console) with numpy imported as it ends: which BLAS thread setting it saw,
# and how many threads the process has then
BLAS_PROBE = """
import atexit, os, sys
def report():
    import numpy  # noqa: F401
    print(os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task")), flush=True)
atexit.register(report)
sys.argv = ["polytrace", "--version"]
from analyses.cli import console
console()
"""


def test_console_starts_numpy_without_spinning_blas_threads() -> None:
    # OpenBLAS's server threads spin ~70 ms of CPU each as numpy loads, on a machine whose cores
    # an ingest or a fit keeps busy (analyses.cli.quiet_blas_threads)
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", BLAS_PROBE], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env=env)
    setting, threads = out.stdout.split()[-2:]
    assert setting == "1", out.stderr
    assert threads == "1"  # the main thread only: no BLAS server thread


def test_a_users_blas_thread_setting_is_kept() -> None:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", BLAS_PROBE], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env=env)
    assert out.stdout.split()[-2] == "2", out.stderr


def test_ingest_without_run_toml_reads_no_toml_and_looks_up_no_library(tmp_path: Path) -> None:
    """tomllib only for a run.toml; libc and libcrypto are found in the process itself: ctypes.util's
    find_library ran `ldconfig -p` in a subprocess three times an ingest (malloc_reuse twice,
    resumable_sha256 once), ~10 ms of its start."""
    run = tmp_path / "steps"
    run.mkdir()
    for src in sorted((LOGS / "polytrace-math-dapo").glob("packed_lengths_step_*.jsonl"))[:3]:
        (run / src.name).write_bytes(src.read_bytes())
    _printed, mods = _loaded("ingest", str(run), "--warehouse", str(tmp_path / "wh"), "-q")
    assert "analyses.readers.polytrace_v2" in mods
    assert sorted({"tomllib", "ctypes.util"} & mods) == []
