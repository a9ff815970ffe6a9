"""The export formats, declared once: each module of :mod:`analyses.export.formats` defines
``FORMAT = ExportFormat(...)``; :func:`export_formats` finds them. The CLI's choices, the docs
table, the Dagster asset and the conformance suite all read this list.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from analyses.atomic_output import staged_dir, writing
from analyses.export import formats as formats_pkg
from analyses.fit.sampler import Generated, generate, steps_for


class ExportError(ValueError):
    """A spec that lacks what a format needs: one line naming the missing part."""


# upstream PolyTrace's benchmark configs replay up to 4 steps (step_groups "0;1;2;3"): an export of a
# run with fewer full steps (Search-R1 kept one) still holds that many
MIN_EXPORT_STEPS = 4


@dataclass
class ExportJob:
    """One workload of a spec to write in one format under ``out``."""

    key: str
    workload: dict[str, Any]
    spec: dict[str, Any]
    out: Path
    seed: int = 0
    steps: int | None = None
    step_interval_s: float | None = None
    options: dict[str, Any] = field(default_factory=dict)  # format-specific (vidur_date, task, ...)
    # the draws of this spec's workloads already made for another format (see :func:`export`)
    drawn: dict[tuple[Any, ...], Generated] | None = None

    @cached_property
    def generated(self) -> Generated:
        """The workload's steps drawn with the seeded sampler (same seed, same bytes): ``steps``, by
        default the source run's full steps and at least :data:`MIN_EXPORT_STEPS`; with the
        ``records_per_step`` option, that many samples (trajectories) per step."""
        w = self.workload
        n = self.steps if self.steps is not None else max(int(w["batch"].get("n_steps", 1)), MIN_EXPORT_STEPS)
        per = self.options.get("records_per_step")
        if per is not None:
            k = int(w["batch"].get("samples_per_prompt") or 1)
            if int(per) < 1 or int(per) % k:
                raise ExportError(f"--records-per-step {per}: must be a positive multiple of the workload's {k} samples "
                                  "per prompt")
            w = {**w, "batch": {**w["batch"], "prompts_per_step": int(per) // k}}
        memo_key = (self.key, self.seed, n, per)
        if self.drawn is not None and memo_key in self.drawn:
            return self.drawn[memo_key]
        g = generate(w, steps_for(w, n), self.seed, key=self.key)
        if self.drawn is not None:
            self.drawn[memo_key] = g
        return g


@dataclass(frozen=True)
class ExportFormat:
    """An output format and the tool that reads it.

    ``files`` names what is written (per workload directory); ``consumer`` and ``loader`` say
    which tool and which of its functions or classes read the files; ``try_it`` is a command a
    user can run to check a file with that tool. ``check`` is our own structural check of a written
    workload directory (:mod:`analyses.export.structure`): the problems found, empty when the files
    are laid out as the consumer's loader reads them.
    """

    name: str
    order: int
    description: str
    files: str
    consumer: str
    loader: str
    try_it: str
    write: Callable[[ExportJob], list[Path]]
    check: Callable[[Path], list[str]]
    checked_against: str  # the consumer version the conformance suite checks (analyses.export.consumer_versions)


@cache
def export_formats() -> tuple[ExportFormat, ...]:
    """Every format of :mod:`analyses.export.formats`, in documentation order."""
    found = []
    for info in pkgutil.iter_modules(formats_pkg.__path__):
        fmt = getattr(importlib.import_module(f"{formats_pkg.__name__}.{info.name}"), "FORMAT", None)
        if isinstance(fmt, ExportFormat):
            found.append(fmt)
    return tuple(sorted(found, key=lambda f: (f.order, f.name)))


def format_names() -> tuple[str, ...]:
    return tuple(f.name for f in export_formats())


def export_format(name: str) -> ExportFormat:
    for f in export_formats():
        if f.name == name:
            return f
    raise ValueError(f"unknown format {name!r}; one of {', '.join(format_names())}")


def workload_dirs(spec: dict[str, Any], out: Path, only: str | None = None) -> list[tuple[str, dict[str, Any], Path]]:
    """(key, workload, directory) per workload: ``out`` itself when there is one."""
    items = [(k, w) for k, w in spec["workloads"].items() if only is None or k == only or w.get("run_id") == only]
    if not items:
        raise KeyError(f"no workload {only!r} in the spec" if only else "the spec has no workloads")
    if len(items) == 1:
        return [(items[0][0], items[0][1], out)]
    return [(k, w, out / re.sub(r"[^A-Za-z0-9_.-]+", "_", k)) for k, w in items]


def export(spec: dict[str, Any], fmt: str, out: Path, *, steps: int | None = None, seed: int = 0,
           workload: str | None = None, step_interval_s: float | None = None, owned: bool = False,
           drawn: dict[tuple[Any, ...], Generated] | None = None, **options: Any) -> list[Path]:
    """Write ``fmt`` for every workload of ``spec`` under ``out``; returns the files written.

    ``out`` appears whole or not at all (:func:`analyses.atomic_output.staged_dir`): everything is
    written into a private directory beside it, which then replaces ``out`` in one rename; a kill
    at any moment leaves the previous ``out`` (or none) and staging that the next export removes. A
    spec that lacks what the format needs raises :class:`ExportError` and leaves ``out`` as it was.
    An existing ``out`` is replaced only when polytrace wrote it or it is empty, unless ``owned``
    (the warehouse's own ``exports/``); else :class:`~analyses.atomic_output.OutputRefused`.
    ``options`` are the format's own (``vidur_date``, ``task``, ``records_per_step``, ...).
    ``drawn``: a dict kept across the formats of one ``spec`` (empty at first), so that each
    workload's steps are drawn once rather than once per format (the same draws either way)."""
    f = export_format(fmt)
    dirs = workload_dirs(spec, out, workload)
    written: list[Path] = []
    with staged_dir(out, f"export {fmt}", owned=owned) as stage:
        for key, w, d in dirs:
            sd = stage.path / d.relative_to(out)
            sd.mkdir(parents=True, exist_ok=True)
            try:
                with writing(out):
                    files = f.write(ExportJob(key, w, spec, sd, seed, steps, step_interval_s, dict(options), drawn))
            except KeyError as exc:
                if (w.get("source") or {}).get("kind") == "summaries":
                    raise ExportError(f"{fmt}: workload {key!r} has no {exc.args[0]!r}, which this format needs: the "
                                      "run's per-step summaries do not hold it") from exc
                raise ExportError(f"{fmt}: workload {key!r} of the spec has no {exc.args[0]!r}, which this format "
                                  "needs (fit the run again with this version)") from exc
            written += [out / p.relative_to(stage.path) for p in files]
    return written


def consumer_table() -> str:
    """The docs/spec.md table: format -> consumer -> loader -> command to try it -> checked against."""
    rows = ["| `--format` | consumer | loader | try it | checked against |", "|---|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.consumer} | `{f.loader}` | `{f.try_it}` | {f.checked_against} |" for f in export_formats()]
    return "\n".join(rows)


@dataclass
class FormatVerdict:
    """Our structural check of one format over every run's export directory (``exports/<run>/<format>``)."""

    fmt: ExportFormat
    problems: dict[str, list[str]]  # run id -> problems ([] = as the consumer reads it)
    expected: list[str] = field(default_factory=list)  # runs that have a workload (empty: not said)

    @property
    def passed(self) -> list[str]:
        return [r for r, p in self.problems.items() if not p]

    @property
    def uncovered(self) -> list[str]:
        """Runs with a workload this format wrote no files for (its logs lack a variable it needs)."""
        return [r for r in self.expected if r not in self.problems]

    def line(self) -> str:
        """One line: the format, its declared consumer, how many of the runs with a workload it
        covered, and which runs' files passed our check."""
        n, ok = len(self.problems), self.passed
        head = f"{self.fmt.name:<17} -> {self.fmt.consumer}: "
        cover = f"covered {n}/{len(self.expected)} run(s) with a workload" + (
            f" (not {', '.join(self.uncovered)})" if self.uncovered else "") + "; " if self.expected else ""
        if not n:
            return head + cover + "no exported files"
        bad = {r: p[0] for r, p in self.problems.items() if p}
        tail = "" if not bad else "; failed " + ", ".join(f"{r} ({why})" for r, why in sorted(bad.items()))
        return head + cover + f"structural check passed for {len(ok)}/{n} run(s){tail}"


def check_exports(exports: Path, expected: list[str] | None = None) -> list[FormatVerdict]:
    """Every format's :attr:`ExportFormat.check` over ``exports/<run>/<format>/`` (runs without that
    directory are left out); ``expected``: the runs that have a workload, each format's coverage
    is counted against them."""
    runs = sorted(p for p in exports.iterdir() if p.is_dir()) if exports.is_dir() else []
    return [FormatVerdict(f, {r.name: f.check(r / f.name) for r in runs if (r / f.name).is_dir()}, list(expected or []))
            for f in export_formats()]
