"""One directory, several runs: which runs a path given to ``polytrace ingest`` holds.

A directory of logs is one run, unless it holds several separate logs: then merging them would
mix unrelated steps (three verl console logs of different models in one run, their 4,260 Qwen
rows "superseded" by gemma's). A directory is split into one run per **unit**:

* a **wandb run folder** (``run-YYYYMMDD_HHMMSS-<id>``, ``offline-run-…``) anywhere below it;
* a **PolyTrace v2 log directory** (holding ``*_step_N.jsonl`` or ``dapo_filter_indices.jsonl``)
  anywhere below it;
* a **group of verl console logs** directly in it: each log whose first ``step:N`` is 0 or 1
  starts a run (the logs in name order); a log that starts later (a resumed run's second log)
  joins the run before it, so a resumed run split over two logs stays one run.

Auto mode splits when there are at least two units. Files that belong to no unit (telemetry
beside several logs, parameter files) become one more run named after the directory, so every
file is still read and accounted for, and the ingest says so. ``run.toml`` in the directory
forces the choice with ``split = "none"`` (one run, as before), ``"each"`` (every unit a run, even
a single one) or ``"auto"``; a directory with a ``run.toml`` that does not say ``split`` is one run
(its run.toml describes one run). Run ids come from the units' names, made to follow the run-id
rule: a group of console logs is ``<directory>.<first log's stem>`` (``exp1.train``: log files are
named ``train.log`` in many directories, so the stem alone made another directory's ``train``
replace this one's), a wandb folder and a PolyTrace v2 log directory keep their own names (a
wandb run id, a time stamp); a clash within the directory gets ``-2``, ``-3``, ... Whatever the
ids, an ingest never publishes over a run that came from another source without being told to
(:class:`analyses.ingest.RunSourceConflict`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from analyses.ingest import discover_files, resolve_run_id
from analyses.manifest import MANIFEST_NAME, load_manifest, run_id_from_name
from analyses.readers import detect
from analyses.readers.base import read_head

WANDB_RUN_DIR = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-[A-Za-z0-9]+")
V2_FILE = re.compile(r"(?:multiturn_workload|packed_lengths|reward_timings)_step_\d+\.jsonl(?:\.gz)?|dapo_filter_indices\.jsonl")
_FIRST_STEP = re.compile(rb"step:(\d+) - ")
CONSOLE_FORMAT = "verl_console"
FIRST_STEP_SCAN_BYTES = 256 << 20  # a console log with no step line in its first 256 MB starts nothing


@dataclass(frozen=True)
class PlannedRun:
    """One run of a path: ``path`` (a directory or file) read whole, or only ``only`` of it."""

    run_id: str
    path: Path
    only: frozenset[Path] | None = None  # the files of ``path`` this run reads (None: all)
    report_skipped: bool = True  # whether files discovery skipped (symlinks out, ...) are this run's to report
    skip_under: tuple[Path, ...] = ()  # skipped entries below these belong to other runs
    reason: str = ""
    leftover: bool = False  # the files of a split directory that belong to no single log

    @property
    def source(self) -> str:
        """What the run is read from, as the warehouse records it (``source`` in its manifest): the
        path, and for a run that is part of a directory, which part (its first log, or its files of
        no single log). Two different sources never publish one run id over each other unasked."""
        if self.only is None:
            return str(self.path)
        if self.leftover:
            return f"{self.path} (files of no single log)"
        return str(min(self.only))


def plan_runs(path: Path, run_id: str | None = None) -> list[PlannedRun]:
    """The runs ``path`` holds (see the module text); one run when it is a file, when ``run_id``
    is forced, or when the directory holds fewer than two units."""
    path = path.resolve()
    manifest = load_manifest(path)
    one = [PlannedRun(resolve_run_id(path, manifest, run_id), path)]
    if run_id is not None or not path.is_dir():
        return one
    mode = manifest.split or ("none" if (path / MANIFEST_NAME).exists() else "auto")
    if mode == "none":
        return one
    dirs = _unit_dirs(path)
    groups = _console_groups(path)
    n_units = len(dirs) + len(groups)
    if n_units == 0 or (mode == "auto" and n_units < 2):
        return one
    found = discover_files(path, manifest)
    in_units = {f for g in groups for f in g} | {f for f in found.files if any(f.is_relative_to(d) for d in dirs)}
    rest = frozenset(f for f in found.files if f not in in_units)
    taken: set[str] = set()
    planned = [PlannedRun(_unique(_dir_id(d), taken), d, reason=_dir_reason(d)) for d in dirs]
    for i, g in enumerate(groups):
        why = "verl console log" + (f"s ({len(g)}, resumed)" if len(g) > 1 else "")
        planned.append(PlannedRun(_unique(split_run_id(path.name, g[0].stem), taken), path, frozenset(g),
                                  report_skipped=not rest and i == 0, skip_under=tuple(dirs), reason=why))
    if rest:
        planned.append(PlannedRun(_unique(resolve_run_id(path, manifest, None), taken), path, rest, skip_under=tuple(dirs),
                                  reason=f"{len(rest)} file(s) of no single log", leftover=True))
    return planned


def _unit_dirs(path: Path) -> list[Path]:
    """wandb run folders and PolyTrace v2 log directories below ``path`` (not ``path`` itself),
    outermost first; nothing below a unit is looked at."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(path):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not (here / d).is_symlink())
        if here != path and (WANDB_RUN_DIR.fullmatch(here.name) or any(V2_FILE.fullmatch(f) for f in filenames)):
            out.append(here)
            dirnames[:] = []
    return out


def _console_groups(path: Path) -> list[list[Path]]:
    """verl console logs directly in ``path``, grouped into runs by where their steps start."""
    groups: list[list[Path]] = []
    for f in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".") and not p.is_symlink()):
        reader = detect(f, read_head(f))
        if reader is None or reader.name != CONSOLE_FORMAT:
            continue
        first = first_step(f)
        if first is None:
            continue
        if first <= 1 or not groups:
            groups.append([f])
        else:
            groups[-1].append(f)
    return groups


def first_step(path: Path) -> int | None:
    """The step of the first ``step:N - `` line of a console log (plain or .gz), None without one."""
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    seen = 0
    tail = b""
    try:
        with opener(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                m = _FIRST_STEP.search(tail + block)
                if m:
                    return int(m.group(1))
                tail = block[-64:]
                seen += len(block)
                if seen > FIRST_STEP_SCAN_BYTES:
                    return None
    except (OSError, EOFError):
        return None
    return None


def split_run_id(directory: str, unit: str) -> str:
    """The run id of one log of a split directory: ``<directory>.<unit>``, made to follow the run-id
    rule (the directory part shortened first when the two are too long)."""
    from analyses.manifest import RUN_ID_MAX, RunIdError

    unit_id = run_id_from_name(unit)
    try:
        dir_id = run_id_from_name(directory[:RUN_ID_MAX])
    except RunIdError:  # nothing usable in the directory's name: the log's alone
        return unit_id
    room = RUN_ID_MAX - len(unit_id) - 1
    return run_id_from_name(f"{dir_id[:room]}.{unit_id}") if room > 0 else unit_id[:RUN_ID_MAX]


def _dir_id(d: Path) -> str:
    manifest = load_manifest(d)
    return resolve_run_id(d, manifest, None)


def _dir_reason(d: Path) -> str:
    return "wandb run folder" if WANDB_RUN_DIR.fullmatch(d.name) else "PolyTrace v2 log directory"


def _unique(rid: str, taken: set[str]) -> str:
    out, n = rid, 1
    while out in taken:
        n += 1
        out = f"{rid}-{n}"
    taken.add(out)
    return out
