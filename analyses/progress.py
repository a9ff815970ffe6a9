"""Terminal progress for long ingests: files, bytes and rows per second (rich), or nothing."""

from __future__ import annotations

import time
from typing import Any


class IngestProgress:
    """Consumes :func:`analyses.ingest.ingest_run` progress events; silent when disabled."""

    def __init__(self, enabled: bool, console: Any = None) -> None:
        self.enabled = enabled
        self._console = console  # a rich Console; default: stderr
        self._progress: Any = None
        self._task: Any = None
        self._rows = 0
        self._t0 = time.perf_counter()
        self._files = 0

    def __enter__(self) -> IngestProgress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TransferSpeedColumn,
            )
            from rich.table import Column

            # one line that fits an 80-column terminal: a long run id is cut with an ellipsis
            self._progress = Progress(
                TextColumn("[bold]{task.description}", table_column=Column(max_width=16, no_wrap=True, overflow="ellipsis")),
                BarColumn(bar_width=10),
                DownloadColumn(),
                TransferSpeedColumn(),
                TextColumn("{task.fields[files]}f {task.fields[rows]:,} rows"),
                TimeElapsedColumn(),
                transient=True,
                **({"console": self._console} if self._console is not None else {}),
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def event(self, kind: str, data: dict) -> None:
        if self._progress is None:
            return
        if kind == "run_start":
            self._files = 0
            self._task = self._progress.add_task(data["run_id"], total=data["bytes"] or 1, files=0, rows=0, rps=0.0)
        elif kind == "file_progress" and self._task is not None:
            self._progress.update(self._task, rows=self._rows + data["rows"], rps=self._rate(self._rows + data["rows"]))
        elif kind == "file_done" and self._task is not None:
            rep = data["report"]
            self._rows += rep.rows_out
            self._files += 1
            self._progress.update(
                self._task, advance=rep.bytes, files=self._files, rows=self._rows, rps=self._rate(self._rows)
            )
        elif kind == "run_done" and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None

    def _rate(self, rows: int) -> float:
        return rows / max(time.perf_counter() - self._t0, 1e-9)
