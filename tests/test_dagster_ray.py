"""The per-run ingest job with its steps on a Ray cluster (``POLYTRACE_EXECUTOR=ray``, dagster-ray's
executor): a partition lands exactly as with the default in-process executor, and every step ran as
a Ray job. Every step is a fresh Ray job importing Dagster (about 9 s each on 2 cores), so the test
runs what it needs once:

* one partition of two: a second doubled the test's minutes and proved nothing the first does not
  (partitions are independent runs; their parallel ingest is tested in-process);
* two of the job's ten steps, the ingest (every table's Parquet) and the catalog after it (the
  DuckDB file): one step's output reaches the next through the cluster. The eight asset checks
  left out are steps of the same kind; with them the test was 94 s of ``make test``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _ray_util import REPO, ray_head
from _warehouse_util import assert_same_tables

from analyses.warehouse import published_runs
from pipelines.definitions import build_defs
from pipelines.executors import ENV_EXECUTOR, ENV_RAY_ADDRESS, ExecutorConfigError, executor_from_env
from pipelines.partitions import RUNS_PARTITIONS_NAME
from pipelines.resources import WarehouseResource
from pipelines.sensors import INGEST_JOB_NAME

RUN_IDS = ["run-0", "run-1"]
MATERIALIZED = ["run-1"]  # the partition the job runs; run-0 is a partition that must stay untouched
STEPS = ["ingest_run", "warehouse_catalog"]  # the job's steps it runs (the checks are left out)


def _logs(root: Path) -> Path:
    for i, rid in enumerate(RUN_IDS):
        d = root / rid
        d.mkdir(parents=True)
        (d / "train.log").write_text("".join(
            f"step:{s} - timing_s/gen:{i + s / 10} - timing_s/step:{2 * i + s} - response_length/mean:{100 + i * s}\n"
            for s in range(1, 6)))
    return root


def _materialize(env: dict[str, str], dagster_home: Path) -> None:
    """Each partition of the ingest job as `dagster job execute` runs it (a fresh process that
    loads the definitions, and so the executor, from its environment)."""
    from dagster import DagsterInstance

    dagster_home.mkdir(exist_ok=True)
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, RUN_IDS)
    for rid in MATERIALIZED:
        proc = subprocess.run(
            [sys.executable, "-m", "dagster", "job", "execute", "-m", "pipelines.definitions", "-j", INGEST_JOB_NAME,
             "--op-selection", ",".join(STEPS), "--tags", json.dumps({"dagster/partition": rid})],
            env={**env, "DAGSTER_HOME": str(dagster_home)}, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _materialize_in_process(logs: Path, warehouse: Path) -> None:
    """The reference: the same partitions and steps with the default in-process executor, in this
    process (a second `dagster job execute` would only pay Dagster's imports again)."""
    from dagster import DagsterInstance

    defs = build_defs(WarehouseResource(root=str(warehouse), logs_root=str(logs)))
    assert defs.resolve_job_def(INGEST_JOB_NAME).executor_def.name == "in_process"
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, RUN_IDS)
        for rid in MATERIALIZED:
            res = defs.resolve_job_def(INGEST_JOB_NAME).execute_in_process(partition_key=rid, instance=instance,
                                                                          op_selection=STEPS)
            assert res.success
            assert {e.step_key for e in res.get_step_success_events()} == set(STEPS)


def test_executor_is_chosen_by_configuration() -> None:
    assert executor_from_env({}).name == "in_process"
    assert executor_from_env({ENV_EXECUTOR: "ray", ENV_RAY_ADDRESS: "http://127.0.0.1:8265"}).name == "ray"
    with pytest.raises(ExecutorConfigError, match="expected one of in_process, ray"):
        executor_from_env({ENV_EXECUTOR: "spark"})


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ingest_partitions_on_ray_land_as_in_process(tmp_path: Path) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient

    logs = _logs(tmp_path / "logs")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("POLYTRACE_", "DAGSTER_"))}
    base.update(POLYTRACE_LOGS_ROOT=str(logs), PYTHONPATH=str(REPO))
    _materialize_in_process(logs, tmp_path / "local")
    with ray_head(dashboard=True) as head:
        assert head.dashboard is not None
        _materialize({**base, "POLYTRACE_WAREHOUSE": str(tmp_path / "ray"), ENV_EXECUTOR: "ray",
                      ENV_RAY_ADDRESS: head.dashboard}, tmp_path / "home-ray")
        jobs = [j for j in JobSubmissionClient(head.dashboard).list_jobs() if (j.metadata or {}).get("dagster/job")]
    assert sorted(published_runs(tmp_path / "ray")) == MATERIALIZED
    assert_same_tables(tmp_path / "local", tmp_path / "ray")
    # every step the run executed was a Ray job, one each
    assert set(STEPS) <= {n.name for n in build_defs().resolve_job_def(INGEST_JOB_NAME).graph.node_defs}
    assert len(jobs) == len(MATERIALIZED) * len(STEPS) and {j.status for j in jobs} == {JobStatus.SUCCEEDED}
    assert {j.metadata["dagster/job"] for j in jobs} == {INGEST_JOB_NAME}
