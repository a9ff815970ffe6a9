"""One dynamic partition per run: the partition key IS the warehouse ``run_id``.

Keys are added by the logs-root sensor (or the demo) as run directories appear; a directory
holding several separate logs gives one key per log (:mod:`analyses.run_split`). Because the
key equals the run id (``run_id`` from its run.toml, or the directory or log name made to follow
the run-id rule of :mod:`analyses.manifest`), a partition
in the UI is the same string users write in SQL (``WHERE run_id = '...'``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from dagster import DynamicPartitionsDefinition, PreviewWarning

from analyses.ingest import iter_run_dirs
from analyses.manifest import ManifestError, RunIdError, validate_run_id
from analyses.run_split import PlannedRun, plan_runs

# Checks are partitioned like their assets so that each run keeps its own check status (an
# unpartitioned check on a partitioned asset shows only the latest run's result). Dagster 1.13
# flags partitioned checks as preview; we accept that and silence only that one warning.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=PreviewWarning
)

RUNS_PARTITIONS_NAME = "runs"
runs_partitions = DynamicPartitionsDefinition(name=RUNS_PARTITIONS_NAME)

FINGERPRINT_META = "source_fingerprint"  # on the `runs` materialization: the directory as ingested

def is_valid_key(key: str) -> bool:
    """Whether ``key`` follows the run-id rule (so it is also a valid Dagster partition key)."""
    try:
        validate_run_id(key)
    except RunIdError:
        return False
    return True


def scan_runs(logs_root: Path) -> tuple[dict[str, PlannedRun], dict[str, str]]:
    """Every usable run under ``logs_root`` by its run id: each directory's runs as
    :func:`analyses.run_split.plan_runs` finds them (one, or one per separate log); and each
    unusable directory (by name) with why: a broken run.toml, a name with no usable run id, or an
    id another directory already has (the first in name order keeps it). One bad directory costs
    only itself."""
    out: dict[str, PlannedRun] = {}
    problems: dict[str, str] = {}
    if not logs_root.is_dir():
        return out, problems
    for d in iter_run_dirs(logs_root):
        try:
            plans = plan_runs(d)
        except (ManifestError, RunIdError, OSError) as exc:
            problems[d.name] = str(exc)
            continue
        for plan in plans:
            if plan.run_id in out:
                problems[d.name] = (f"run id {plan.run_id!r} is already {out[plan.run_id].path.name!r}'s; give this one "
                                    "another run_id in run.toml")
                continue
            out[plan.run_id] = plan
    return out, problems


def runs_by_id(logs_root: Path) -> dict[str, PlannedRun]:
    """Every usable run under ``logs_root`` by its run id (see :func:`scan_runs`)."""
    return scan_runs(logs_root)[0]


def find_run(logs_root: Path, run_id: str) -> PlannedRun | None:
    """The run behind a partition key (cheap when it is a directory's own name and only run)."""
    direct = logs_root / run_id
    try:
        if direct.is_dir():
            plans = plan_runs(direct)
            if len(plans) == 1 and plans[0].run_id == run_id:
                return plans[0]
    except (ManifestError, RunIdError, OSError):
        pass
    return runs_by_id(logs_root).get(run_id)


@dataclass(frozen=True)
class DirFingerprint:
    """What changes when a run directory's content changes: file count, bytes, newest mtime."""

    files: int
    bytes: int
    newest_mtime_ns: int

    @property
    def key(self) -> str:
        return f"{self.files}f-{self.bytes}b-{self.newest_mtime_ns}"


def run_fingerprint(plan: PlannedRun) -> DirFingerprint:
    """What changes when a run's inputs change: its directory's fingerprint, or for a run that is
    part of a directory (several logs in one), its own files' count, bytes and newest mtime."""
    if plan.only is None:
        return dir_fingerprint(plan.path) if plan.path.is_dir() else _files_fingerprint([plan.path], plan.path.stat().st_mtime_ns)
    return _files_fingerprint(sorted(plan.only), plan.path.stat().st_mtime_ns)


def _files_fingerprint(files: list[Path], newest: int) -> DirFingerprint:
    total = 0
    n = 0
    for f in files:
        try:
            st = f.stat()
        except OSError:  # deleted since the plan: the next tick sees it
            continue
        n += 1
        total += st.st_size
        newest = max(newest, st.st_mtime_ns)
    return DirFingerprint(n, total, newest)


def dir_fingerprint(run_dir: Path) -> DirFingerprint:
    """Fingerprint of the files the ingest would read (hidden files and directories skipped).

    Directory mtimes count too, so deleting a file changes the fingerprint. Stats only; no
    file is opened.
    """
    files = total = 0
    newest = run_dir.stat().st_mtime_ns
    for dirpath, dirnames, filenames in os.walk(run_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        newest = max(newest, os.stat(dirpath).st_mtime_ns)
        for name in filenames:
            if name.startswith("."):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:  # a dangling symlink or a file deleted mid-walk: not an input
                continue
            files += 1
            total += st.st_size
            newest = max(newest, st.st_mtime_ns)
    return DirFingerprint(files, total, newest)
