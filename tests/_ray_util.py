"""A Ray head on 127.0.0.1 started and stopped by a test (shared by the fan-out and Dagster-on-Ray tests)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from _ci import skip_or_fail
from _warehouse_util import free_port, wait_for_port

REPO = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 3.0


@dataclass(frozen=True)
class RayHead:
    address: str  # HOST:PORT of the cluster (ray.init / --ray)
    dashboard: str | None  # http://HOST:PORT of its job-submission API, when started with one


@contextmanager
def ray_head(dashboard: bool = False) -> Iterator[RayHead]:
    """A two-CPU Ray head on 127.0.0.1 (its own temp dir and ports; the dashboard, which serves
    Ray's job API, only when asked), stopped with its whole process group at the end; never
    ``ray stop``, which would stop every Ray on the machine."""
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        skip_or_fail(f"ray is not installed in {Path(sys.executable).parent} (make install installs it)")
    tmp = tempfile.mkdtemp(prefix="/tmp/rayt")  # short: Ray's unix sockets live under it
    port, dash_port = free_port(), free_port()
    ports = [free_port() for _ in range(6)]
    dash = (["--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port)]
            if dashboard else ["--include-dashboard", "false"])
    # the job driver of a Dagster step runs `python -m dagster`: the venv's bin first on its PATH
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
         "--port", str(port), "--temp-dir", tmp, *dash, "--disable-usage-stats",
         "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
         "--dashboard-agent-listen-port", str(ports[2]), "--dashboard-agent-grpc-port", str(ports[3]),
         "--metrics-export-port", str(ports[4]), "--runtime-env-agent-port", str(ports[5])],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, proc, 120, "ray start")
        if dashboard:
            wait_for_port(dash_port, proc, 120, "the Ray dashboard")
        yield RayHead(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash_port}" if dashboard else None)
    finally:
        # `ray start --block` often takes the whole 30 s to stop its daemons and workers on SIGTERM
        # (one Ray test's teardown was 30 s of `make test`): a few seconds' grace, then the group is killed
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
