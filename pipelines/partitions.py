"""One dynamic partition per run: the partition key IS the warehouse ``run_id``.

Keys are added by the logs-root sensor (or the demo) as run directories appear. Because the
key equals the run id (``run_id`` from its run.toml, or the directory name made to follow the
run-id rule of :mod:`analyses.manifest`), a partition
in the UI is the same string users write in SQL (``WHERE run_id = '...'``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from dagster import DynamicPartitionsDefinition, PreviewWarning

from analyses.ingest import iter_run_dirs, resolve_run_id
from analyses.manifest import ManifestError, RunIdError, load_manifest, validate_run_id

# Checks are partitioned like their assets so that each run keeps its own check status (an
# unpartitioned check on a partitioned asset shows only the latest run's result). Dagster 1.13
# flags partitioned checks as preview; we accept that and silence only that one warning.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=PreviewWarning
)

RUNS_PARTITIONS_NAME = "runs"
runs_partitions = DynamicPartitionsDefinition(name=RUNS_PARTITIONS_NAME)

FINGERPRINT_META = "source_fingerprint"  # on the `runs` materialization: the directory as ingested

def run_id_for_dir(run_dir: Path) -> str:
    """The run id (= partition key) the ingest will give ``run_dir``: run.toml's ``run_id``, else
    the directory name made to follow the rule. Raises ManifestError / RunIdError when it has none."""
    return resolve_run_id(run_dir, load_manifest(run_dir), None)


def is_valid_key(key: str) -> bool:
    """Whether ``key`` follows the run-id rule (so it is also a valid Dagster partition key)."""
    try:
        validate_run_id(key)
    except RunIdError:
        return False
    return True


def scan_run_dirs(logs_root: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Every usable run directory under ``logs_root`` by its run id, and each unusable one (by
    directory name) with why: a broken run.toml, a name with no usable run id, or an id another
    directory already has (the first in name order keeps it). One bad directory costs only itself."""
    out: dict[str, Path] = {}
    problems: dict[str, str] = {}
    if not logs_root.is_dir():
        return out, problems
    for d in iter_run_dirs(logs_root):
        try:
            rid = run_id_for_dir(d)
        except (ManifestError, RunIdError, OSError) as exc:
            problems[d.name] = str(exc)
            continue
        if rid in out:
            problems[d.name] = f"run id {rid!r} is already {out[rid].name!r}'s; give this one another run_id in run.toml"
            continue
        out[rid] = d
    return out, problems


def run_dirs_by_id(logs_root: Path) -> dict[str, Path]:
    """Every usable run directory under ``logs_root`` by its run id (see :func:`scan_run_dirs`)."""
    return scan_run_dirs(logs_root)[0]


def find_run_dir(logs_root: Path, run_id: str) -> Path | None:
    """The directory under ``logs_root`` whose run id is ``run_id`` (cheap when it is the name)."""
    direct = logs_root / run_id
    try:
        if direct.is_dir() and run_id_for_dir(direct) == run_id:
            return direct
    except (ManifestError, RunIdError, OSError):
        pass
    return run_dirs_by_id(logs_root).get(run_id)


@dataclass(frozen=True)
class DirFingerprint:
    """What changes when a run directory's content changes: file count, bytes, newest mtime."""

    files: int
    bytes: int
    newest_mtime_ns: int

    @property
    def key(self) -> str:
        return f"{self.files}f-{self.bytes}b-{self.newest_mtime_ns}"


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
