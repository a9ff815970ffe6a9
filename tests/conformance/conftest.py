"""Conformance fixtures: build a warehouse from the real PolyTrace runs through the CLI, fit, export every
format with default options, and run each consumer's driver once over every exported file.

Everything expensive is done once per test run: session-scoped, and under xdist shared by the workers
through a file lock and a directory beside their base temp dirs (``harness.once``). The ``xdist_group``
mark keeps these tests on one worker under ``--dist loadgroup`` (``tests/conftest.py`` renames the node
ids, which xdist 3.8 no longer can under pytest 9.2), so the other worker runs other tests instead of
waiting on the lock; the lock keeps the build once whatever the scheduling.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from _ci import skip_or_fail

from . import consumers
from .harness import EXPORT_FORMATS, REPORT_ENV, Build, Verdicts, cli, once
from .realruns import ALL_RUN_IDS, REAL_RUNS, STEP_ONLY_RUNS


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller picks the log; xdist workers inherit it
        d = consumers.cache_root() / "reports"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"run-{os.getpid()}.jsonl"
        path.unlink(missing_ok=True)
        os.environ[REPORT_ENV] = str(path)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Each consumer's verdict and each measured ratio, one line per check and run (``make conformance``)."""
    path = Path(os.environ.get(REPORT_ENV, ""))
    if hasattr(config, "workerinput") or not path.is_file():
        return
    tr = terminalreporter
    tr.section("conformance: verdicts and measurements")
    for c in consumers.info():
        tr.write_line(f"consumer {c['tool']}=={c['version']} at {c['env']}" +
                      (f" ({c['size_mb']} MB, installed in {c['install_s']} s)" if c.get("installed") else " (not installed)"))
    for line in path.read_text().splitlines():
        row = json.loads(line)
        tr.write_line(f"{row.pop('check'):<24} {row.pop('run', ''):<11} " + json.dumps(row)[:400])
    last = path.with_name("last.jsonl")
    shutil.copyfile(path, last)
    tr.write_line(f"(also in {last})")



@pytest.fixture(scope="session")
def build(real_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Build:
    """Ingest each real run (``polytrace ingest DIR --run-id ID``) and each step-only one, fit them all (the
    step-only runs from their per-step summaries), export every format (once per test run, shared by the
    xdist workers)."""

    def make(root: Path) -> dict[str, Any]:
        wh = root / "warehouse"
        for run in [*REAL_RUNS, *STEP_ONLY_RUNS]:
            d = real_logs / run.rel_path
            if not d.exists():
                skip_or_fail(f"real run not found: {d}")
            cli("ingest", d, "--run-id", run.run_id, "--warehouse", wh, "--quiet")
        logs = [cli("fit", "--warehouse", wh, "--out", root / "spec.json").stdout]
        for fmt in EXPORT_FORMATS:
            logs.append(cli("export", "--spec", root / "spec.json", "--format", fmt, "--out", root / "exports" / fmt).stdout)
        return {"logs": logs}

    root, made = once(tmp_path_factory, "build", make)
    return Build(root, root / "warehouse", root / "spec.json", json.loads((root / "spec.json").read_text()),
                 {fmt: root / "exports" / fmt for fmt in EXPORT_FORMATS}, made["logs"])


@pytest.fixture(scope="session")
def cli_formats() -> list[str]:
    """The ``--format`` choices ``polytrace export --help`` offers."""
    text = cli("export", "--help").stdout
    m = re.search(r"--format \{([^}]*)\}", text)
    assert m, text
    return m.group(1).split(",")


def _consumer(name: str) -> consumers.Consumer:
    c = consumers.CONSUMERS[name]
    try:
        consumers.ensure(c)
    except consumers.ConsumerUnavailable as exc:  # fails under CI=true, skips elsewhere
        skip_or_fail(f"cannot install {name}=={c.version} into {c.env_dir}: {exc}")
    return c


@pytest.fixture(scope="session")
def aiperf() -> consumers.Consumer:
    return _consumer("aiperf")


@pytest.fixture(scope="session")
def vidur() -> consumers.Consumer:
    return _consumer("vidur")


def _files(build: Build, fmt: str, pattern: str) -> dict[str, list[Path]]:
    return {rid: sorted(build.export_dir(fmt, rid).glob(pattern)) for rid in ALL_RUN_IDS}


@pytest.fixture(scope="session")
def aiperf_files(build: Build) -> dict[str, list[Path]]:
    return {rid: [p for p in ps if p.suffix in (".txt", ".json")] for rid, ps in _files(build, "aiperf", "*").items()}


@pytest.fixture(scope="session")
def mooncake_files(build: Build) -> dict[str, list[Path]]:
    return _files(build, "mooncake", "*.jsonl")


@pytest.fixture(scope="session")
def vidur_files(build: Build) -> dict[str, list[Path]]:
    return _files(build, "vidur", "*.csv")


def _run(tmp_path_factory: pytest.TempPathFactory, name: str, c: consumers.Consumer,
         jobs: list[dict[str, Any]]) -> Verdicts:
    """One driver run over ``jobs`` per test run (shared by the xdist workers)."""
    _, verdicts = once(tmp_path_factory, name, lambda _d: consumers.run_driver(c, jobs))
    return {(j["check"], j["file"]): v for j, v in zip(jobs, verdicts, strict=True)}


@pytest.fixture(scope="session")
def aiperf_verdicts(aiperf: consumers.Consumer, aiperf_files: dict[str, list[Path]],
                    mooncake_files: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Verdicts:
    jobs = [{"check": "sequence_distribution", "file": str(p)} for ps in aiperf_files.values() for p in ps]
    jobs += [{"check": "mooncake", "file": str(p)} for ps in mooncake_files.values() for p in ps]
    return _run(tmp_path_factory, "aiperf_verdicts", aiperf, jobs)


VIDUR_CHECKS = ("trace_replay", "request_length", "request_interval")


@pytest.fixture(scope="session")
def vidur_verdicts(vidur: consumers.Consumer, vidur_files: dict[str, list[Path]],
                   tmp_path_factory: pytest.TempPathFactory) -> Verdicts:
    jobs = [{"check": c, "file": str(p)} for ps in vidur_files.values() for p in ps for c in VIDUR_CHECKS]
    return _run(tmp_path_factory, "vidur_verdicts", vidur, jobs)
