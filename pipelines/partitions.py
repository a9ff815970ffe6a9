"""One dynamic partition per run: the partition key IS the warehouse ``run_id``.

Keys are added by the logs-root sensor (or the demo) as run directories appear. Because the
key equals the run id (directory name, or ``run_id`` from its run.toml, sanitized), a partition
in the UI is the same string users write in SQL (``WHERE run_id = '...'``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from dagster import DynamicPartitionsDefinition, PreviewWarning

from analyses.ingest import iter_run_dirs, resolve_run_id
from analyses.manifest import ManifestError, load_manifest, sanitize_run_id

# Checks are partitioned like their assets so that each run keeps its own check status (an
# unpartitioned check on a partitioned asset shows only the latest run's result). Dagster 1.13
# flags partitioned checks as preview; we accept that and silence only that one warning.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=PreviewWarning
)

RUNS_PARTITIONS_NAME = "runs"
runs_partitions = DynamicPartitionsDefinition(name=RUNS_PARTITIONS_NAME)

FINGERPRINT_META = "source_fingerprint"  # on the `runs` materialization: the directory as ingested

# Dagster refuses partition keys containing these; sanitized run ids can still hold "..."
_BAD_KEY_PARTS = ("...",)


def run_id_for_dir(run_dir: Path) -> str:
    """The run id (= partition key) the ingest will give ``run_dir``.

    A broken run.toml falls back to the directory name, so the partition still appears and
    its run fails with the manifest error rather than the directory vanishing silently.
    """
    try:
        return resolve_run_id(run_dir, load_manifest(run_dir), None)
    except ManifestError:
        return sanitize_run_id(run_dir.name)


def is_valid_key(key: str) -> bool:
    return bool(key) and not any(part in key for part in _BAD_KEY_PARTS)


def run_dirs_by_id(logs_root: Path) -> dict[str, Path]:
    """Every run directory under ``logs_root`` by its run id; the first (sorted) wins a clash."""
    out: dict[str, Path] = {}
    if not logs_root.is_dir():
        return out
    for d in iter_run_dirs(logs_root):
        out.setdefault(run_id_for_dir(d), d)
    return out


def find_run_dir(logs_root: Path, run_id: str) -> Path | None:
    """The directory under ``logs_root`` whose run id is ``run_id`` (cheap when it is the name)."""
    direct = logs_root / run_id
    if direct.is_dir() and run_id_for_dir(direct) == run_id:
        return direct
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
