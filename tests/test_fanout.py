"""Parallel ingest (``--workers N``, ``--ray ADDRESS``) publishes exactly the tables the serial
ingest does; a Ray address that does not answer is a one-line usage error."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _warehouse_util import assert_same_tables, free_port

from analyses.cli import main
from analyses.warehouse import STAGING, published_runs

REPO = Path(__file__).resolve().parents[1]


def _runs(tmp: Path, n: int) -> Path:
    """``n`` small verl console runs, each with its own numbers, under one root."""
    root = tmp / "logs"
    for i in range(n):
        d = root / f"run-{i}"
        d.mkdir(parents=True)
        (d / "train.log").write_text("".join(
            f"step:{s} - timing_s/gen:{i + s / 10} - timing_s/step:{2 * i + s} - response_length/mean:{100 + i * s}\n"
            for s in range(1, 6)))
    return root


def test_workers_publish_the_same_tables_as_serial(tmp_path: Path) -> None:
    logs = _runs(tmp_path, 4)
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "serial"), "-q"]) == 0
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "par"), "-q", "--workers", "2"]) == 0
    assert sorted(published_runs(tmp_path / "par")) == [f"run-{i}" for i in range(4)]
    assert_same_tables(tmp_path / "serial", tmp_path / "par")
    assert not any((tmp_path / "par" / STAGING).iterdir())  # every worker cleaned up after itself


def test_workers_on_the_sample_logs_match_serial(tmp_path: Path) -> None:
    logs = REPO / "sample_logs"
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "serial"), "-q"]) == 0
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "par"), "-q", "--workers", "2"]) == 0
    assert_same_tables(tmp_path / "serial", tmp_path / "par")


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers must be >= 1"),
    (["--ray", "127.0.0.1:1"], "no Ray cluster answers at '127.0.0.1:1'"),
    (["--ray", "nonsense"], "expected HOST:PORT or 'auto'"),
])
def test_bad_fanout_options_exit_2_with_one_line(tmp_path: Path, argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    logs = _runs(tmp_path, 1)
    wh = tmp_path / "wh"
    assert main(["ingest", "--root", str(logs), "--warehouse", str(wh), "-q", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not published_runs(wh)


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A two-CPU Ray head on 127.0.0.1 (its own temp dir and ports), stopped with its whole process
    group at the end; never ``ray stop``, which would stop every Ray on the machine."""
    pytest.importorskip("ray")
    ray_bin = Path(sys.executable).with_name("ray")
    tmp = tempfile.mkdtemp(prefix="/tmp/rayt")  # short: Ray's unix sockets live under it
    port = free_port()
    ports = [free_port() for _ in range(6)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
         "--port", str(port), "--temp-dir", tmp, "--include-dashboard", "false", "--disable-usage-stats",
         "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
         "--dashboard-agent-listen-port", str(ports[2]), "--dashboard-agent-grpc-port", str(ports[3]),
         "--metrics-export-port", str(ports[4]), "--runtime-env-agent-port", str(ports[5])],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"ray start failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ray_ingest_of_two_runs_matches_serial(tmp_path: Path, ray_cluster: str) -> None:
    logs = _runs(tmp_path, 2)
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "serial"), "-q"]) == 0
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "ray"), "-q", "--ray", ray_cluster]) == 0
    assert sorted(published_runs(tmp_path / "ray")) == ["run-0", "run-1"]
    assert_same_tables(tmp_path / "serial", tmp_path / "ray")
