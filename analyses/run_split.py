"""One directory, several runs: when the files of a directory are separate runs, each becomes one.

``polytrace ingest DIR`` takes DIR as one run, except when DIR holds several runs side by side
(:func:`plan_runs`), found in this order:

``wandb_run_folders``
    two or more wandb run folders (``run-YYYYMMDD_HHMMSS-<id>``, ``offline-run-...``) directly in
    DIR or one level down (``wandb/``): each folder is a run, its id the folder name;
``workload_dirs``
    two or more directories holding PolyTrace v2 step files (``packed_lengths_step_N.jsonl``,
    ``multiturn_workload_step_N.jsonl``): each is a run, its id ``<DIR name>-<directory name>``;
``console_logs``
    two or more verl console logs whose step sequences each start over (first step 0 or 1): each
    log is a run, its id the file name without extension. A log that starts later is a resume:
    with one log from the start it is one resumed run (as before); with several, which run it
    resumes is ambiguous, and DIR stays one run with a note.

A split happens only when every input file of DIR belongs to one of the runs found (nothing is
left out silently). ``run.toml`` in DIR forces either: ``split_runs = true`` or ``false``; a
``run_id`` there means one run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from analyses.ingest import discover_files
from analyses.manifest import MANIFEST_NAME, load_manifest, run_id_from_name
from analyses.readers import detect
from analyses.readers.base import read_head
from analyses.readers.polytrace_v2 import MULTITURN_NAME, PACKED_NAME

WANDB_RUN_DIR = re.compile(r"^(offline-)?run-\d{8}_\d{6}-[A-Za-z0-9]+$")
WORKLOAD_STEP_FILES = (re.compile(PACKED_NAME), re.compile(MULTITURN_NAME))
CONSOLE_FORMATS = ("verl_console",)
# the first step line of a console log is looked for in its first bytes only
FIRST_STEP_HEAD_BYTES = 16 * 1024 * 1024
_FIRST_STEP = re.compile(r"(?:^|[\s)\]m])step:(\d+) - ", re.M)
START_STEPS = (0, 1)  # a log whose first step is one of these starts a run; a later first step resumes one


@dataclass(frozen=True)
class PlannedRun:
    path: Path  # a directory or a single file
    run_id: str


@dataclass(frozen=True)
class RunPlan:
    """``runs`` empty: ingest the path as one run; else one run each. ``reason`` says why."""

    runs: tuple[PlannedRun, ...] = ()
    reason: str | None = None
    note: str | None = None  # why a possible split was not made

    @property
    def split(self) -> bool:
        return bool(self.runs)


def plan_runs(path: Path) -> RunPlan:
    """How ``path`` splits into runs (see the module doc); a file is always one run."""
    if not path.is_dir():
        return RunPlan()
    manifest = load_manifest(path)
    forced = manifest.split_runs
    if forced is False or (manifest.run_id is not None and forced is not True):
        return RunPlan()
    files = [f for f in discover_files(path, manifest).files if f.name != MANIFEST_NAME]
    for finder in (_wandb_folders, _workload_dirs, _console_logs):
        plan = finder(path, files)
        if plan is not None:
            return plan
    return RunPlan()


def _covers(groups: list[Path], files: list[Path]) -> bool:
    return all(any(f == g or f.is_relative_to(g) for g in groups) for f in files)


def _wandb_folders(path: Path, files: list[Path]) -> RunPlan | None:
    found = sorted({p for p in [*path.glob("*"), *path.glob("*/*")] if p.is_dir() and WANDB_RUN_DIR.match(p.name)})
    if len(found) < 2:
        return None
    if not _covers(found, files):
        return RunPlan(note=f"{len(found)} wandb run folders, but other files beside them: ingested as one run")
    return RunPlan(tuple(PlannedRun(p, run_id_from_name(p.name)) for p in found),
                   f"{len(found)} wandb run folders")


def _workload_dirs(path: Path, files: list[Path]) -> RunPlan | None:
    dirs = sorted({f.parent for f in files if any(rx.match(f.name) for rx in WORKLOAD_STEP_FILES)})
    if len(dirs) < 2:
        return None
    if not _covers(dirs, files):
        return RunPlan(note=f"{len(dirs)} PolyTrace workload directories, but other files beside them: ingested as one run")
    return RunPlan(tuple(PlannedRun(d, run_id_from_name(f"{path.name}-{d.name}")) for d in dirs),
                   f"{len(dirs)} PolyTrace workload directories")


def first_step(path: Path) -> int | None:
    """The first ``step:N - `` of a console log (within its first :data:`FIRST_STEP_HEAD_BYTES`)."""
    m = _FIRST_STEP.search(re.sub(r"\x1b\[[0-9;]*m", "", read_head(path, FIRST_STEP_HEAD_BYTES)))
    return int(m.group(1)) if m else None


def _console_logs(path: Path, files: list[Path]) -> RunPlan | None:
    logs = [f for f in files if (r := detect(f)) is not None and r.name in CONSOLE_FORMATS]
    if len(logs) < 2:
        return None
    starts = {f: first_step(f) for f in logs}
    fresh = [f for f in logs if starts[f] in START_STEPS]
    if len(fresh) < 2:
        return None  # one run, resumed over several logs
    if len(fresh) < len(logs) or len(logs) < len(files):
        return RunPlan(note=f"{len(fresh)} console logs start from step 0/1, but other files (a resumed log?) lie "
                       "beside them: ingested as one run (set split_runs in run.toml, or ingest the logs one by one)")
    return RunPlan(tuple(PlannedRun(f, run_id_from_name(f.stem)) for f in fresh),
                   f"{len(fresh)} console logs whose steps each start over")
