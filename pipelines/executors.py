"""Where a Dagster run's steps execute, chosen by configuration (``$POLYTRACE_EXECUTOR``):

``in_process`` (the default)
    every step of a run in the run's own process: a run is one ingest partition or the cross-run
    refresh, whose steps are short and mostly sequential, so a process per step would mostly pay
    imports. ``make demo`` and ``make ui`` use it.
``ray``
    every step as a job on a Ray cluster, through ``dagster-ray``'s executor (``polytrace[ray]``):
    ``$POLYTRACE_RAY_ADDRESS`` is the cluster's job-submission (dashboard) address, e.g.
    ``http://head:8265`` (unset: Ray's own ``$RAY_ADDRESS``). The step jobs run ``python -m dagster
    api execute_step`` on the cluster with the variables of :data:`FORWARDED_ENV` and every
    ``POLYTRACE_*`` variable (limits included) copied from the run's process, so they find the same Dagster instance (``$DAGSTER_HOME``: on several machines a
    Postgres-backed instance), warehouse and logs root. The cluster needs the dashboard
    (``ray[default]``) and this project installed where its jobs run.

The choice is read when the definitions load, so ``dagster dev`` / the daemon pick it up from
their environment.
"""

from __future__ import annotations

import os

from dagster import ExecutorDefinition, in_process_executor

from analyses.warehouse import ENV_WAREHOUSE
from pipelines.resources import ENV_LOGS_ROOT

ENV_EXECUTOR = "POLYTRACE_EXECUTOR"
ENV_RAY_ADDRESS = "POLYTRACE_RAY_ADDRESS"
EXECUTORS = ("in_process", "ray")

# what a step needs to see the same instance, warehouse, logs and object store as the run
FORWARDED_ENV = (
    "DAGSTER_HOME", ENV_WAREHOUSE, ENV_LOGS_ROOT, "PYTHONPATH",
    "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP",
)


class ExecutorConfigError(ValueError):
    """``$POLYTRACE_EXECUTOR`` names no executor, or the chosen one is not installed."""


def executor_from_env(environ: dict[str, str] | None = None) -> ExecutorDefinition:
    """The executor ``$POLYTRACE_EXECUTOR`` names (default ``in_process``)."""
    env = os.environ if environ is None else environ
    name = (env.get(ENV_EXECUTOR) or "in_process").strip()
    if name == "in_process":
        return in_process_executor
    if name == "ray":
        forwarded = [*FORWARDED_ENV, *sorted(k for k in env if k.startswith("POLYTRACE_") and k not in FORWARDED_ENV)]
        return ray_step_executor(env.get(ENV_RAY_ADDRESS) or None, forwarded)
    raise ExecutorConfigError(f"${ENV_EXECUTOR}={name!r}: expected one of {', '.join(EXECUTORS)}")


def ray_step_executor(address: str | None, forwarded_env: list[str]) -> ExecutorDefinition:
    """``dagster-ray``'s executor on the cluster at ``address`` (its job-submission address), its
    step jobs given the run process's values of ``forwarded_env``."""
    try:
        from dagster_ray import ray_executor
    except ImportError as exc:  # an optional extra: say which one
        raise ExecutorConfigError(f"${ENV_EXECUTOR}=ray needs polytrace[ray] (dagster-ray): {exc}") from exc
    return ray_executor.configured({"ray": {"address": address, "env_vars": forwarded_env}}, name="ray")
