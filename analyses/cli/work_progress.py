"""Terminal progress for ``polytrace fit``, ``fidelity`` and ``report``: runs and rolling origins
(or the report's sections), elapsed and remaining time (rich), or nothing (``--quiet``, or stderr
not a terminal).

It consumes the events :func:`analyses.fit.runs.fit_runs` and :func:`analyses.fit.fidelity.fidelity`
send: ``start`` (``runs``), ``run_start`` (``run_id``, ``origins``; 0 when a run has none to
count), ``origin_done`` and ``run_done``.
"""

from __future__ import annotations

from typing import Any


class WorkProgress:
    """Two bars: runs done of all runs, and the current run's origins; silent when disabled."""

    def __init__(self, enabled: bool, runs: int, label: str, console: Any = None, unit: str = "runs") -> None:
        self.enabled = enabled
        self.runs = runs
        self.label = label
        self.unit = unit  # what the outer bar counts: runs (fit, fidelity), steps (report)
        self._console = console  # a rich Console; default: stderr
        self._progress: Any = None
        self._all: Any = None
        self._run: Any = None

    def __enter__(self) -> WorkProgress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("elapsed"),
                TimeElapsedColumn(),
                TextColumn("remaining"),
                TimeRemainingColumn(),
                transient=True,
                **({"console": self._console} if self._console is not None else {}),
            )
            self._progress.__enter__()
            self._all = self._progress.add_task(f"{self.label}: {self.unit}", total=max(self.runs, 1))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def event(self, kind: str, data: dict[str, Any]) -> None:
        if self._progress is None:
            return
        if kind == "start":
            self._progress.update(self._all, total=max(int(data["runs"]), 1))
        elif kind == "run_start":
            if self._run is not None:
                self._progress.remove_task(self._run)
            n = int(data.get("origins") or 0)
            self._run = self._progress.add_task(f"{data['run_id']}: origins" if n else str(data["run_id"]), total=n or None)
        elif kind == "origin_done" and self._run is not None:
            self._progress.advance(self._run)
        elif kind == "run_done":
            if self._run is not None:
                self._progress.remove_task(self._run)
                self._run = None
            self._progress.advance(self._all)
