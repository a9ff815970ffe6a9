"""What the conformance fixtures and tests share: the CLI runner, the build of exports, the formats under
test, and the measurement log that ``make conformance`` prints at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .consumers import REPORT_ENV, _locked, measure  # noqa: F401 - measure: the tests import it from here
from .realruns import REPO

# Every format the CLI exports, and the consumer that judges it (a new CLI format fails
# test_every_cli_format_is_covered until it is added here with its checks).
EXPORT_FORMATS: dict[str, str] = {
    "polytrace-v2": "upstream PolyTrace suite.py --validate + Generator.py readers + multi-turn replay (model)",
    "polytrace-v1": "upstream PolyTrace Generator.py v1 reader (model)",
    "polytrace-params": "upstream PolyTrace parameter file (task keys, scipy marginals)",
    "aiperf": "aiperf DistributionParser.parse",
    "mooncake": "aiperf MooncakeTrace + MooncakeTraceDatasetLoader",
    "vidur": "vidur TraceReplayRequestGenerator / TraceRequestLengthGenerator / TraceRequestIntervalGenerator",
}
CLI_TIMEOUT_S = 900


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m analyses.cli ARGS`` from this worktree; raises with its output when it fails."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "analyses.cli", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"polytrace {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class Build:
    root: Path
    warehouse: Path
    spec_path: Path
    spec: dict[str, Any]
    exports: dict[str, Path] = field(default_factory=dict)  # format -> --out directory
    logs: list[str] = field(default_factory=list)

    def workload(self, run_id: str) -> dict[str, Any]:
        hits = [w for w in self.spec["workloads"].values() if w.get("run_id") == run_id]
        assert len(hits) == 1, f"{len(hits)} workloads for run {run_id} in the spec"
        return hits[0]

    def export_dir(self, fmt: str, run_id: str) -> Path:
        """Where ``fmt``'s files for ``run_id`` are: one subdirectory per workload when the spec has several
        (our run ids are plain, so the subdirectory is the run id)."""
        out = self.exports[fmt]
        if len(self.spec["workloads"]) == 1:
            return out
        d = out / run_id
        assert d.is_dir(), f"no {fmt} export directory for {run_id} under {out}: {sorted(p.name for p in out.iterdir())}"
        return d


Verdicts = dict[tuple[str, str], dict[str, Any]]  # (check, file) -> a consumer driver's verdict


def once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> tuple[Path, Any]:
    """``make(directory)`` once per test run, its JSON-able result shared by every xdist worker: the first
    to take the lock makes it, the others wait and read it. Returns (directory, result)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers' base temp dirs are siblings: popen-gw0, popen-gw1
    d = base / "conformance-shared" / name
    done = d.with_name(name + ".json")
    with _locked(d.with_name(name + ".lock")):
        if not done.exists():
            d.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps(make(d)))
    return d, json.loads(done.read_text())
