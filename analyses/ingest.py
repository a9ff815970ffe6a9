"""Ingest one run: discover its files, sniff each, stream it through its reader, stage the
rows, derive ``steps``, account for every line in ``source_files``, and swap the run in.

A file that cannot be read at all is recorded with its status and error; the other files and
runs still land. Nothing in an input file is ever executed or ``eval``-ed.
"""

from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analyses.alignment import derive_step_windows
from analyses.catalog import refresh_catalog
from analyses.manifest import MANIFEST_NAME, RunManifest, load_manifest, sanitize_run_id
from analyses.readers import detect, read_file
from analyses.readers.base import FileContext, UnreadableFile, read_head
from analyses.readers.lines import looks_binary
from analyses.schema import RUNS, SOURCE_FILES, STEP_METRICS
from analyses.steps import derive_steps
from analyses.warehouse import RunStaging

BINARY_SNIFF = 8192


@dataclass
class FileReport:
    path: str
    format: str
    bytes: int
    lines: int = 0
    rows_ok: int = 0
    rows_rejected: int = 0
    rows_skipped: int = 0
    rows_out: int = 0
    rows_superseded: int = 0  # step metrics another file of the run also carries (kept once, from the better source)
    status: str = "ok"
    error: str | None = None
    sha256: str = ""
    seconds: float = 0.0


@dataclass
class RunReport:
    run_id: str
    source: str
    files: list[FileReport] = field(default_factory=list)
    table_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def rows_rejected(self) -> int:
        return sum(f.rows_rejected for f in self.files)


ProgressFn = Callable[[str, dict], None]


def discover_files(run_path: Path, manifest: RunManifest) -> list[Path]:
    """Input files of a run: every regular file below it but the manifest, its tokenizer, and
    hidden files/directories (editor swap files, ``.git``)."""
    if run_path.is_file():
        return [run_path]
    tok = manifest.tokenizer_path()
    out = []
    for p in sorted(run_path.rglob("*")):
        rel = p.relative_to(run_path)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        if rel.as_posix() == MANIFEST_NAME or (tok is not None and p.resolve() == tok.resolve()):
            continue
        out.append(p)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(BINARY_SNIFF)
    return not head.startswith(b"\x1f\x8b") and looks_binary(head)


def resolve_run_id(run_path: Path, manifest: RunManifest, run_id: str | None) -> str:
    raw = run_id or manifest.run_id or (run_path.name if run_path.is_dir() else run_path.stem)
    return sanitize_run_id(raw)


def ingest_run(
    run_path: Path,
    root: Path,
    run_id: str | None = None,
    progress: ProgressFn | None = None,
    refresh: bool = True,
) -> RunReport:
    """Ingest ``run_path`` (a directory or one file) as one run into the warehouse at ``root``.

    Re-ingesting replaces the run's partitions whole; the same inputs give identical tables.
    """
    t0 = time.perf_counter()
    run_path = run_path.resolve()
    manifest = load_manifest(run_path)
    rid = resolve_run_id(run_path, manifest, run_id)
    report = RunReport(run_id=rid, source=str(run_path))
    staging = RunStaging(root, rid)
    emit = progress or (lambda _e, _d: None)
    try:
        files = discover_files(run_path, manifest)
        emit("run_start", {"run_id": rid, "files": len(files), "bytes": sum(p.stat().st_size for p in files)})
        for idx, path in enumerate(files):
            rel = path.name if run_path.is_file() else path.relative_to(run_path).as_posix()
            fr = _ingest_file(idx, path, rel, rid, manifest, staging, emit)
            report.files.append(fr)
        _finish_run(staging, report, manifest, run_path)
        staging.commit()
    except BaseException:
        staging.abort()
        raise
    if refresh:
        refresh_catalog(root)
    report.seconds = time.perf_counter() - t0
    emit("run_done", {"run_id": rid, "seconds": report.seconds})
    return report


def _ingest_file(
    idx: int, path: Path, rel: str, run_id: str, manifest: RunManifest, staging: RunStaging, emit: ProgressFn
) -> FileReport:
    t0 = time.perf_counter()
    fr = FileReport(path=rel, format="unknown", bytes=0)
    emit("file_start", {"path": rel, "bytes": _size(path)})
    prefix = f"f{idx:05d}"
    # one guard for everything done with this file (stat, hash, sniff, read, stage): whatever
    # goes wrong (a reader bug, RecursionError, MemoryError, a polars PanicException, which is a
    # BaseException) fails this file alone; an interrupt or exit still stops the ingest
    try:
        fr.bytes = path.stat().st_size
        fr.sha256 = _sha256(path)
        if fr.bytes == 0:
            fr.status, fr.error = "empty", "file is empty"
            return _done(fr, t0, emit)
        head = read_head(path)
        reader = detect(path, head)
        if reader is None:
            fr.status = "unsupported"
            fr.error = "binary file that no reader recognizes" if _looks_binary(path) else "no reader recognizes this file"
            return _done(fr, t0, emit)
        fr.format = reader.name
        ctx = FileContext(run_id=run_id, path=path, rel_path=rel, manifest=manifest)
        for chunk in read_file(reader, ctx):
            fr.lines += chunk.lines
            fr.rows_ok += chunk.rows_ok
            fr.rows_rejected += chunk.rows_rejected
            fr.rows_skipped += chunk.rows_skipped
            for table, df in chunk.tables.items():
                if table == "steps":  # reader-provided per-step attributes, merged in _finish_run
                    _stage_attrs(staging, df, prefix)
                    continue
                fr.rows_out += staging.add(table, df.with_columns(path=pl.lit(rel)) if _has_path(table) else df, prefix)
            if chunk.rejects is not None and chunk.rejects.height:
                staging.add("rejects", chunk.rejects.with_columns(path=pl.lit(rel)), prefix)
            emit("file_progress", {"path": rel, "lines": fr.lines, "rows": fr.rows_out})
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:
        _discard(staging, prefix)
        fr.status, fr.error, fr.rows_out = "error", _describe(exc), 0
        return _done(fr, t0, emit)
    fr.status = "partial" if fr.rows_rejected else "ok"
    return _done(fr, t0, emit)


_ERROR_MAX_CHARS = 500
_EXPECTED = (UnreadableFile, UnicodeDecodeError, EOFError, OSError, pl.exceptions.PolarsError)


def _describe(exc: BaseException) -> str:
    """One line for ``source_files.error``: the exception, and where it was raised when it is
    not one of the expected input errors (a reader bug must be findable)."""
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    if not isinstance(exc, _EXPECTED):
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:
            f = frames[-1]
            msg += f" | {Path(f.filename).name}:{f.lineno} in {f.name}"
    return msg if len(msg) <= _ERROR_MAX_CHARS else msg[: _ERROR_MAX_CHARS - 3] + "..."


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


_PATH_TABLES = {"step_metrics", "samples", "filter_batches"}


def _has_path(table: str) -> bool:
    return table in _PATH_TABLES


def _stage_attrs(staging: RunStaging, df: pl.DataFrame, prefix: str) -> None:
    d = staging.dir / "_step_attrs"
    d.mkdir(exist_ok=True)
    keep = [c for c in ("step", "ts", "truncated_line") if c in df.columns]
    df.select(keep).write_parquet(d / f"{prefix}-{len(list(d.glob(prefix + '-*')))}.parquet")


def _discard(staging: RunStaging, prefix: str) -> None:
    for p in staging.dir.glob(f"*/{prefix}-*.parquet"):
        p.unlink()


def _done(fr: FileReport, t0: float, emit: ProgressFn) -> FileReport:
    fr.seconds = time.perf_counter() - t0
    emit("file_done", {"report": fr})
    return fr


# Which file's copy of a step metric is kept when two files of a run carry it (a wandb run directory
# holds both the binary history and the console's output.log): exact float64 history first,
# structured JSON next, console text (printed with rounding) last. Between files of one kind (a
# resumed run's second log re-logs steps) the last in (path, line) order wins, as in `steps`.
_METRIC_SOURCE_RANK = {"wandb_offline": 0, "verl_jsonl": 1}
_CONSOLE_RANK = 2


def _dedupe_step_metrics(staging: RunStaging, report: RunReport) -> None:
    """Keep one row per step-metric key across the run's files; count the rest per file."""
    sm = staging.scan("step_metrics")
    paths = sm.select(pl.col("path").unique()).collect()["path"].to_list()
    if len(paths) < 2:
        return
    fmt = {f.path: f.format for f in report.files}
    rank = {p: _METRIC_SOURCE_RANK.get(fmt.get(p, ""), _CONSOLE_RANK) for p in paths}
    key = list(STEP_METRICS.key[1:])  # within one run
    full = sm.collect()
    kept = (
        full.lazy().with_columns(_rank=pl.col("path").replace_strict(rank, return_dtype=pl.Int64))
        .sort("_rank", "path", "line_no", descending=[False, True, True], nulls_last=True)
        .unique(subset=key, keep="first", maintain_order=True)
        .drop("_rank")
        .collect()
    )
    if full.height == kept.height:
        return
    before = dict(full.group_by("path").len().iter_rows())
    after = dict(kept.group_by("path").len().iter_rows())
    staging.replace("step_metrics", kept)
    for f in report.files:
        dropped = before.get(f.path, 0) - after.get(f.path, 0)
        if dropped:
            f.rows_superseded = dropped
            f.rows_out -= dropped


def _finish_run(staging: RunStaging, report: RunReport, manifest: RunManifest, run_path: Path) -> None:
    attrs_dir = staging.dir / "_step_attrs"
    attrs = None
    if attrs_dir.exists() and any(attrs_dir.glob("*.parquet")):
        attrs = pl.scan_parquet(sorted(attrs_dir.glob("*.parquet")), missing_columns="insert", extra_columns="ignore",
                                schema={"step": pl.Int64, "ts": pl.Datetime("us", "UTC"), "truncated_line": pl.Boolean})
    _dedupe_step_metrics(staging, report)
    steps = derive_steps(staging.scan("step_metrics"), attrs, n_gpus=manifest.n_gpus)
    staging.replace("steps", steps)
    staging.replace("step_windows", derive_step_windows(steps, manifest))
    if attrs_dir.exists():
        import shutil

        shutil.rmtree(attrs_dir)
    sf = pl.DataFrame(
        [
            {
                "path": f.path, "sha256": f.sha256, "bytes": f.bytes, "format": f.format, "lines": f.lines,
                "rows_ok": f.rows_ok, "rows_rejected": f.rows_rejected, "rows_skipped": f.rows_skipped,
                "rows_out": f.rows_out, "rows_superseded": f.rows_superseded, "status": f.status, "error": f.error,
            }
            for f in report.files
        ],
        schema={k: v for k, v in SOURCE_FILES.stored_columns.items()},
    )
    staging.replace("source_files", sf)
    runs = pl.DataFrame(
        [
            {
                "task": manifest.task, "framework": manifest.framework, "model": manifest.model,
                "n_gpus": manifest.n_gpus, "max_response_length": manifest.max_response_length,
                "max_prompt_length": manifest.max_prompt_length, "started_at": manifest.started_at,
                "source_dir": str(run_path), "tags": manifest.tags_json,
                "n_files": len(report.files),
            }
        ],
        schema=RUNS.stored_columns,
    )
    staging.replace("runs", runs)
    for name in ("step_metrics", "steps", "samples", "turns", "tool_calls", "rank_times", "gpu_samples",
                 "filter_batches", "rejects"):
        report.table_rows[name] = staging.scan(name).select(pl.len()).collect().item()


def iter_run_dirs(root: Path) -> Iterator[Path]:
    """Immediate subdirectories of ``root`` (each one run), hidden ones excluded."""
    for p in sorted(root.iterdir()):
        if p.is_dir() and not p.name.startswith("."):
            yield p
