"""Ingest many runs at once: one task per run, on local processes or on a Ray cluster.

Each task is an ordinary :func:`analyses.ingest.ingest_run` of one run, so each run is staged
privately and published atomically by its own manifest, exactly as in a serial ingest (runs with
different ids never touch the same files; see :mod:`analyses.warehouse`). The parent only
schedules the tasks and aggregates what comes back, as each finishes: the same tables as the
serial ingest, in a different order of completion.

Ray is optional (``pip install polytrace[ray]``) and imported only when ``--ray`` is given. The
warehouse root must be reachable under the same name from every worker: a local directory for
``--workers`` and a single-node Ray, a shared file system or an ``s3://`` root for a Ray cluster.
"""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyses.ingest import RunReport
from analyses.run_split import PlannedRun


@dataclass(frozen=True)
class RunTask:
    """One run to ingest: its source path and run id, the warehouse root, the lock wait."""

    path: str
    run_id: str
    warehouse: str
    lock_wait_s: float
    only: tuple[str, ...] | None = None  # a run that is part of a directory: its files (analyses.run_split)
    report_skipped: bool = True
    skip_under: tuple[str, ...] = ()
    leftover: bool = False
    replace: bool = False  # publish even over a run of this id from another source

    @classmethod
    def of(cls, plan: PlannedRun, warehouse: str, lock_wait_s: float, replace: bool = False) -> RunTask:
        """A planned run as plain strings (what crosses a process or Ray boundary)."""
        return cls(str(plan.path), plan.run_id, warehouse, lock_wait_s,
                   None if plan.only is None else tuple(sorted(str(p) for p in plan.only)),
                   plan.report_skipped, tuple(str(p) for p in plan.skip_under), plan.leftover, replace)

    def plan(self) -> PlannedRun:
        return PlannedRun(self.run_id, Path(self.path), None if self.only is None else frozenset(Path(p) for p in self.only),
                          self.report_skipped, tuple(Path(p) for p in self.skip_under), leftover=self.leftover)


@dataclass
class RunOutcome:
    """What a task came back with: its report, or why nothing was published (``kind`` says which:
    ``"locked"`` another writer held the run, ``"source_conflict"`` the warehouse holds the run id
    from another source, ``"refused"`` a blocking check failed, ``"unwritable"`` the warehouse could not
    be written (a full disk), ``"error"``)."""

    run_id: str
    report: RunReport | None = None
    kind: str = "ok"
    message: str = ""


class RayUnavailable(Exception):
    """Ray is not installed, or the address does not answer: one line saying which."""


def ingest_task(task: RunTask) -> RunOutcome:
    """Ingest one run; runs in a worker process (local or Ray). Exceptions come back as data so a
    task's failure never takes down the others and never needs pickling an exception class."""
    from analyses.api import PolyTrace  # imported in the worker: the module is the unit shipped
    from analyses.atomic_output import WriteFailed
    from analyses.ingest import RunSourceConflict
    from analyses.warehouse import CommitRefused, RunLocked

    try:
        rep = PolyTrace(task.warehouse).ingest_planned(task.plan(), refresh=False, lock_wait_s=task.lock_wait_s,
                                                       replace=task.replace)
    except RunLocked as exc:
        return RunOutcome(task.run_id, kind="locked", message=str(exc))
    except RunSourceConflict as exc:
        return RunOutcome(task.run_id, kind="source_conflict", message=str(exc))
    except CommitRefused as exc:
        return RunOutcome(task.run_id, kind="refused", message=str(exc))
    except WriteFailed as exc:
        return RunOutcome(task.run_id, kind="unwritable", message=f"not published: {exc}")
    except Exception as exc:  # a bug or an unreadable input: reported for this run only
        return RunOutcome(task.run_id, kind="error", message=f"{type(exc).__name__}: {exc}")
    return RunOutcome(task.run_id, report=rep)


OnDone = Callable[[RunOutcome], None]


def ingest_local(tasks: Sequence[RunTask], workers: int, on_done: OnDone | None = None) -> list[RunOutcome]:
    """Run ``tasks`` on ``workers`` local processes; ``on_done`` sees each outcome as it lands.
    Outcomes come back in the order of ``tasks``."""
    # spawn, not fork: Polars and DuckDB hold thread pools that a forked child inherits locked
    ctx = multiprocessing.get_context("spawn")
    done: dict[str, RunOutcome] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        pending = {pool.submit(ingest_task, t) for t in tasks}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                out = f.result()
                done[out.run_id] = out
                if on_done is not None:
                    on_done(out)
    return [done[t.run_id] for t in tasks]


def connect_ray(address: str) -> Any:
    """Connect to the Ray cluster at ``address`` (``auto``: the one running on this machine)."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("--ray needs Ray: pip install 'polytrace[ray]'") from exc
    if ray.is_initialized():
        return ray
    if address != "auto":
        _probe(address)  # ray.init retries an address that does not answer for minutes
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RayUnavailable(f"no Ray cluster answers at {address!r}: {first}") from exc
    return ray


def _probe(address: str, timeout_s: float = 3.0) -> None:
    """Raise :class:`RayUnavailable` unless something accepts TCP connections at ``host:port``."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise RayUnavailable(f"--ray {address!r}: expected HOST:PORT or 'auto'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnavailable(f"no Ray cluster answers at {address!r}: {exc.strerror or exc}") from exc


def ingest_ray(tasks: Sequence[RunTask], address: str, on_done: OnDone | None = None) -> list[RunOutcome]:
    """Run ``tasks`` as Ray tasks (one CPU each) on the cluster at ``address``."""
    ray = connect_ray(address)
    remote = ray.remote(num_cpus=1, max_retries=0)(ingest_task)
    try:
        refs = {remote.remote(t): t.run_id for t in tasks}
        done: dict[str, RunOutcome] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                out = ray.get(r)
                done[out.run_id] = out
                if on_done is not None:
                    on_done(out)
        return [done[t.run_id] for t in tasks]
    finally:
        ray.shutdown()  # disconnects this driver; the cluster keeps running
