"""Ingest one run: discover its files, sniff each, stream it through its reader, stage the
rows, derive ``steps``, account for every line in ``source_files``, and swap the run in.

A file that cannot be read at all is recorded with its status and error; the other files and
runs still land. Nothing in an input file is ever executed or ``eval``-ed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from analyses.alignment import derive_step_windows
from analyses.atomic_output import WriteFailed, writing
from analyses.catalog import refresh_catalog
from analyses.config_dump import config_entries
from analyses.manifest import MANIFEST_NAME, RunManifest, load_manifest, run_id_from_name, validate_run_id
from analyses.readers import detect, read_file, reader_by_name
from analyses.readers.base import FileContext, UnreadableFile, read_head
from analyses.readers.lines import looks_binary
from analyses.run_facts import (
    CONFIG_HEAD_BYTES,
    ConfigFacts,
    RunFacts,
    config_dump_file_facts,
    framework_of,
    infer_run_facts,
    with_truncation,
)
from analyses.schema import RUN_CONFIG, RUNS, SOURCE_FILES, STEP_METRICS
from analyses.steps import StepsAccumulator, derive_steps
from analyses.table_checks import blocking_problems
from analyses.warehouse import (
    DEFAULT_LOCK_WAIT_S,
    RunStaging,
    clean_stale,
    kill_point,
    read_published,
    run_lock,
)

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
    rows_superseded: int = 0  # step metrics also carried by a later line or a better file of the run (kept once)
    rows_repeated: int = 0  # of those, the ones a later line of this same file logged again
    status: str = "ok"
    error: str | None = None
    sha256: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        """The file's format and line accounting on one line."""
        err = f"  [{self.status}: {self.error}]" if self.error else (f"  [{self.status}]" if self.status != "ok" else "")
        return (f"{self.path}: {self.format}  lines={self.lines} parsed={self.rows_ok} rejected={self.rows_rejected} "
                f"skipped={self.rows_skipped} rows={self.rows_out}"
                + (f" superseded={self.rows_superseded}" if self.rows_superseded else "")
                + (f" (repeated in this file: {self.rows_repeated})" if self.rows_repeated else "") + err)


@dataclass
class RunReport:
    run_id: str
    source: str
    files: list[FileReport] = field(default_factory=list)
    table_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def rows_rejected(self) -> int:
        return sum(f.rows_rejected for f in self.files)

    @property
    def has_data(self) -> bool:
        """Whether any file of the run gave a parsed line. A run of nothing (junk, binary files,
        logs of no known format) still lands, so that its files say why, but is no success."""
        return any(f.rows_ok for f in self.files)

    def no_data_line(self) -> str:
        """One line saying that the run has no data, and each file's reason."""
        why = "; ".join(f"{f.path}: {f.status}" + (f" ({f.error})" if f.error else "") for f in self.files)
        return (f"run {self.run_id}: no data: none of its {len(self.files)} file(s) gave a parsed line"
                + (f" [{why}]" if why else ""))

    def summary_lines(self) -> list[str]:
        """What ``polytrace ingest`` prints and the Dagster run log shows: the run, then a line per file."""
        tables = ", ".join(f"{k}={v}" for k, v in self.table_rows.items() if v)
        return [f"run {self.run_id}: {len(self.files)} file(s); {tables or 'no rows'}", *(f"  {f.line()}" for f in self.files),
                *(f"  warning: {w}" for w in self.warnings)]


ProgressFn = Callable[[str, dict], None]


@dataclass(frozen=True)
class RunFiles:
    """A run's input files, and the entries below it that are not read, with why."""

    files: list[Path]
    skipped: list[tuple[str, str]]  # (path relative to the run, reason)


SKIP_HIDDEN_FILE = "hidden file (its name starts with '.'): not read"
SKIP_HIDDEN_DIR = "hidden directory (its name starts with '.'): not read, nor anything below it ({n} file(s))"
SKIP_MANIFEST = "the run's run.toml: read for the run's facts, not as a log"
SKIP_TOKENIZER = "the run's tokenizer (run.toml tokenizer): read for token counts, not as a log"


def discover_files(run_path: Path, manifest: RunManifest) -> RunFiles:
    """Input files of a run: every regular file below it, and every other entry below it with the
    reason it is not read, so that each file under a run directory is accounted for in
    ``source_files``: the run's ``run.toml`` and tokenizer (read, but not as logs), hidden files and
    directories (editor swap files, ``.git``: one entry per hidden directory), symlinks leaving the
    run directory, dangling links and directory symlinks (not followed)."""
    if run_path.is_file():
        return RunFiles([run_path], [])
    base = run_path.resolve()
    tok = manifest.tokenizer_path()
    tok = tok.resolve() if tok is not None else None
    files: list[Path] = []
    skipped: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(run_path, followlinks=False):
        here = Path(dirpath)
        for d in sorted(dirnames):
            rel = (here / d).relative_to(run_path).as_posix()
            if (here / d).is_symlink():  # os.walk lists it but never descends: say so
                skipped.append((rel, "directory symlink, not followed"))
            elif d.startswith("."):
                skipped.append((rel, SKIP_HIDDEN_DIR.format(n=_count_files(here / d))))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not (here / d).is_symlink())
        for name in sorted(filenames):
            p = here / name
            rel = p.relative_to(run_path).as_posix()
            if rel == MANIFEST_NAME:
                skipped.append((rel, SKIP_MANIFEST))
                continue
            if name.startswith("."):
                skipped.append((rel, SKIP_HIDDEN_FILE))
                continue
            try:
                real = p.resolve(strict=True)
            except (OSError, RuntimeError):
                skipped.append((rel, "dangling or looping symlink"))
                continue
            if not real.is_relative_to(base):
                skipped.append((rel, f"symlink to {real}, outside the run directory: not read"))
                continue
            if not real.is_file():
                skipped.append((rel, "not a regular file"))
                continue
            if tok is not None and real == tok:
                skipped.append((rel, SKIP_TOKENIZER))
                continue
            files.append(p)
    return RunFiles(sorted(files), sorted(skipped))


def _count_files(d: Path) -> int:
    n = 0
    for _dirpath, _dirnames, filenames in os.walk(d, followlinks=False):
        n += len(filenames)
    return n


HASH_IN_BACKGROUND_BYTES = 64 << 20
_HASH_POOL: ThreadPoolExecutor | None = None


def _hash_pool() -> ThreadPoolExecutor:
    global _HASH_POOL
    if _HASH_POOL is None:
        _HASH_POOL = ThreadPoolExecutor(1, thread_name_prefix="sha256")
    return _HASH_POOL


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
    """The run's id: ``run_id`` (checked against the rule), else run.toml's, else the name of the
    directory (or file) made to follow the rule; :class:`RunIdError` when none can."""
    if run_id is not None:
        return validate_run_id(run_id)
    if manifest.run_id is not None:
        return validate_run_id(manifest.run_id, "run_id in run.toml")
    return run_id_from_name(run_path.name if run_path.is_dir() else run_path.stem)


def ingest_run(
    run_path: Path,
    root: Path,
    run_id: str | None = None,
    progress: ProgressFn | None = None,
    lock_wait_s: float = DEFAULT_LOCK_WAIT_S,
    only: frozenset[Path] | None = None,
    report_skipped: bool = True,
    skip_under: tuple[Path, ...] = (),
    source: str | None = None,
    replace: bool = False,
    previous: dict | None = None,
) -> RunReport:
    """Ingest ``run_path`` (a directory or one file) as one run into the warehouse at ``root``.

    The run is staged privately and published atomically (:meth:`RunStaging.commit`): readers
    see the previous version or the new one, whatever happens. A second writer of the same run
    id waits up to ``lock_wait_s`` (told through ``progress`` as ``"lock_wait"``) and then raises
    :class:`~analyses.warehouse.RunLocked`. A version that fails the blocking checks is kept
    aside and raises :class:`~analyses.warehouse.CommitRefused`. Re-ingesting the same inputs
    gives identical tables. The catalog file's base-table views are refreshed on publish; its
    derived views are the facade's business (:meth:`analyses.api.PolyTrace.refresh_catalog`).

    ``only``, ``report_skipped`` and ``skip_under`` ingest part of a directory that holds several
    runs (:func:`analyses.run_split.plan_runs`): only those files, and the files discovery skipped
    (symlinks out, ...) reported by one of the runs, not below another run's directory.

    ``source`` says what the run is read from (default: ``run_path``; a part of a directory says which,
    :attr:`analyses.run_split.PlannedRun.source`); it is recorded in the run's manifest. When the
    warehouse already holds the run id from another source with other content, the ingest raises
    :class:`RunSourceConflict` before publishing, unless ``replace``. ``previous``: the published
    run's manifest ``info`` when the warehouse is elsewhere (an object store); else it is read here.
    """
    t0 = time.perf_counter()
    run_path = run_path.resolve()
    manifest = load_manifest(run_path)
    rid = resolve_run_id(run_path, manifest, run_id)
    report = RunReport(run_id=rid, source=str(run_path))
    emit = progress or (lambda _e, _d: None)
    with writing(root):
        clean_stale(root)
    with run_lock(root, rid, lock_wait_s, on_wait=lambda msg: emit("lock_wait", {"run_id": rid, "message": msg})):
        staging = RunStaging(root, rid)
        steps_acc = StepsAccumulator()
        try:
            found = discover_files(run_path, manifest)
            files = found.files if only is None else [f for f in found.files if f in only]
            skipped = [(rel, why) for rel, why in found.skipped
                       if report_skipped and not any((run_path / rel).is_relative_to(d) for d in skip_under)]
            emit("run_start", {"run_id": rid, "files": len(files), "bytes": sum(p.stat().st_size for p in files)})
            run_files = frozenset(files)
            for idx, path in enumerate(files):
                rel = path.name if run_path.is_file() else path.relative_to(run_path).as_posix()
                report.files.append(_ingest_file(idx, path, rel, rid, manifest, staging, steps_acc, emit, run_files))
                kill_point("read")
            report.files.extend(FileReport(path=rel, format="unknown", bytes=0, status="skipped", error=why)
                                for rel, why in skipped)
            # from here on every read and write is the warehouse's own: a failure (a full disk) is
            # WriteFailed, never a bad input; nothing is published and the staging goes
            with writing(root):
                _finish_run(staging, steps_acc, report, manifest, run_path)
                info = {"source": source or str(run_path), "fingerprint": content_fingerprint(report.files)}
                if not replace:
                    check_same_source(rid, info, _published_info(root, rid) if previous is None else previous,
                                      run_path)
                staging.commit(check=blocking_problems, holding_lock=True,
                               after_publish=lambda: _refresh(root, report), info=info)
        except BaseException:
            staging.abort()
            raise
    report.seconds = time.perf_counter() - t0
    emit("run_done", {"run_id": rid, "seconds": report.seconds})
    return report


class RunSourceConflict(Exception):
    """The warehouse holds the run id from another source, with other content: publishing would
    silently replace that run (``polytrace ingest`` exits 2 with this one line; ``--replace``)."""


def check_same_source(run_id: str, new: dict, old: dict | None, run_path: Path) -> None:
    """Refuse (:class:`RunSourceConflict`) to publish run ``run_id`` read from ``new["source"]`` over
    the published one read from ``old["source"]``, unless it is the same run: the same source, the
    same content wherever it lives now (a moved directory: equal fingerprints), or a run an older
    version recorded by its whole directory (``run_path``) before that directory was split."""
    if not old or not old.get("source"):
        return
    if old["source"] in (new["source"], str(run_path)) or old.get("fingerprint") == new["fingerprint"]:
        return
    raise RunSourceConflict(
        f"run {run_id!r} in the warehouse came from {old['source']}; {new['source']} holds other logs and would "
        "replace it: give one of them another run id (--run-id, or run_id in run.toml), or pass --replace")


def _published_info(root: Path, run_id: str) -> dict | None:
    try:
        pub = read_published(root, run_id)
    except (OSError, ValueError):  # an unreadable manifest is the commit's business, not ours
        return None
    return pub.info if pub is not None else None


def content_fingerprint(files: list[FileReport]) -> str:
    """A digest of what a run's inputs are: each file's path and sha256. The same files give the
    same fingerprint wherever they live, so unchanged runs can skip work keyed by it."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\0{f.status}\n".encode())
    return h.hexdigest()


def _refresh(root: Path, report: RunReport) -> None:
    """The catalog file follows the new version; failing that is reported, not fatal: queries
    through ``polytrace``/the facade never read the file."""
    try:
        refresh_catalog(root)
    except (TimeoutError, OSError, duckdb.Error) as exc:
        report.warnings.append(f"catalog file not refreshed ({exc}); run `polytrace ingest` again or open the "
                               "warehouse through polytrace")


def _ingest_file(
    idx: int, path: Path, rel: str, run_id: str, manifest: RunManifest, staging: RunStaging,
    steps_acc: StepsAccumulator, emit: ProgressFn, run_files: frozenset[Path] = frozenset(),
) -> FileReport:
    t0 = time.perf_counter()
    fr = FileReport(path=rel, format="unknown", bytes=0)
    emit("file_start", {"path": rel, "bytes": _size(path)})
    prefix = f"f{idx:05d}"
    # one guard for everything done with this file (stat, hash, sniff, read, stage): whatever
    # goes wrong (a reader bug, RecursionError, MemoryError, a polars PanicException, which is a
    # BaseException) fails this file alone; an interrupt or exit still stops the ingest
    hashing: Future[str] | None = None
    try:
        fr.bytes = path.stat().st_size
        if fr.bytes >= HASH_IN_BACKGROUND_BYTES:  # hashed on a thread while the file is read (hashlib frees the GIL)
            hashing = _hash_pool().submit(_sha256, path)
        else:
            fr.sha256 = _sha256(path)
        if fr.bytes == 0:
            fr.status, fr.error = "empty", "file is empty"
            return _done(fr, t0, emit)
        head = read_head(path)
        reader = detect(path, head)
        if reader is None:
            fr.status = "unsupported"
            fr.error = "binary file that no reader recognizes" if _looks_binary(path) else "no reader recognizes this file"
            fr.sha256 = hashing.result() if hashing is not None else fr.sha256
            return _done(fr, t0, emit)
        fr.format = reader.name
        ctx = FileContext(run_id=run_id, path=path, rel_path=rel, manifest=manifest, run_files=run_files)
        first_reason: str | None = None
        for chunk in read_file(reader, ctx):
            fr.lines += chunk.lines
            fr.rows_ok += chunk.rows_ok
            fr.rows_rejected += chunk.rows_rejected
            fr.rows_skipped += chunk.rows_skipped
            if chunk.step_attrs is not None:
                steps_acc.add_attrs(chunk.step_attrs, rel)
            sm = chunk.tables.get("step_metrics")
            if sm is not None:
                steps_acc.add(sm, rel)
            for table, df in chunk.tables.items():
                fr.rows_out += staging.append(table, df.with_columns(path=pl.lit(rel)) if _has_path(table) else df, prefix)
            if chunk.rejects is not None and chunk.rejects.height:
                staging.append("rejects", chunk.rejects.with_columns(path=pl.lit(rel)), prefix)
                first_reason = first_reason or chunk.rejects["reason"][0]
            emit("file_progress", {"path": rel, "lines": fr.lines, "rows": fr.rows_out})
        staging.seal(prefix)
        fr.sha256 = hashing.result() if hashing is not None else fr.sha256
    except (KeyboardInterrupt, SystemExit, GeneratorExit, WriteFailed):
        raise  # WriteFailed: the warehouse could not be written (a full disk), which is no fault of this file
    except BaseException as exc:
        staging.discard(prefix)
        steps_acc.discard(rel)
        # nothing of the file lands (its staged rows and rejects are discarded): its counts say so;
        # `lines` keeps how far it was read
        fr.status, fr.error, fr.rows_out = "error", _describe(exc), 0
        fr.rows_ok = fr.rows_rejected = fr.rows_skipped = 0
        if hashing is not None and not fr.sha256:
            try:
                fr.sha256 = hashing.result()
            except OSError:
                pass
        return _done(fr, t0, emit)
    if not fr.rows_ok:  # read to the end, but nothing in it was data: not a success
        fr.status = "no_data"
        fr.error = _no_data_reason(fr, first_reason)
    else:
        fr.status = "partial" if fr.rows_rejected else "ok"
        if fr.rows_rejected:  # a partial file says why in source_files too, not only in rejects
            fr.error = f"{fr.rows_rejected:,} line(s) rejected; first: {first_reason} (see rejects)"[:_ERROR_MAX_CHARS]
    return _done(fr, t0, emit)


def _no_data_reason(fr: FileReport, first_reason: str | None) -> str:
    """Why a file read to its end gave no parsed line, for ``source_files.error``."""
    if not fr.lines:
        return f"read as {fr.format}, but it holds no line or record"
    parts = []
    if fr.rows_skipped:
        parts.append(f"{fr.rows_skipped:,} skipped by the {fr.format} rules (not data lines)")
    if fr.rows_rejected:
        parts.append(f"{fr.rows_rejected:,} rejected (first: {first_reason}; see rejects)")
    return f"read as {fr.format}: none of its {fr.lines:,} line(s) parsed: {', '.join(parts)}"[:_ERROR_MAX_CHARS]


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


def _done(fr: FileReport, t0: float, emit: ProgressFn) -> FileReport:
    fr.seconds = time.perf_counter() - t0
    emit("file_done", {"report": fr})
    return fr


# the dedupe's DuckDB: bounded memory, spilling to the run's staging directory beyond it
DEDUPE_MEMORY_LIMIT = "256MB"


def _dedupe_step_metrics(staging: RunStaging, paths: list[str], repeated: list[str], report: RunReport) -> None:
    """Keep one row per step-metric key (step, metric, is_validation) of the run (the rule is in
    docs/integrity.md, "Repeated steps"): within a file, the later line wins (then the later row of
    that line): a step logged again (a resumed run re-logging its steps into the same log, a log
    concatenated to itself) keeps its last values, as ``steps`` does; across files, the more exact
    source (:data:`analyses.readers.base.METRIC_SOURCE_BINARY` first), then the later file by path.
    Each file's lost rows count as its ``rows_superseded``; those lost to a later copy in the same
    file also as its ``rows_repeated``.

    ``paths``: the files that gave step metrics; ``repeated``: those in which a key may occur more
    than once (:attr:`analyses.steps.StepsAccumulator.repeated_paths`, found while reading). One file
    without repeats is left alone (and not re-read). In DuckDB over the staged parts, in bounded
    memory (a fuzzed gzip of 2.5 M repeated metric rows took 0.9 GB sorted in Polars), as two hash
    aggregates and no sort of the rows: per file and key, then per key."""
    parts = [str(p) for p in sorted(staging.table_dir("step_metrics").glob("*.parquet"))]
    if not parts or (len(paths) < 2 and not repeated):
        return
    spill = staging.dir / "_spill"
    spill.mkdir(exist_ok=True)
    con = duckdb.connect(config={"memory_limit": DEDUPE_MEMORY_LIMIT, "temp_directory": str(spill), "threads": 2})
    out = staging.dir / "_dedupe.parquet"
    key = ", ".join(STEP_METRICS.key[1:])  # within one run
    cols = ", ".join(f'"{c}"' for c in STEP_METRICS.stored_columns)
    try:
        con.execute("SET enable_progress_bar = false")
        con.register("_staged", con.read_parquet(parts, filename=True, file_row_number=True))
        fmt = {f.path: f.format for f in report.files}
        ranks = pl.DataFrame({"path": paths, "_rank": [reader_by_name(fmt[p]).metric_source for p in paths]},
                             schema={"path": pl.String, "_rank": pl.Int64})
        con.register("_ranks", ranks.to_arrow())
        # per file and key: how many copies, and the last (line, then row as staged)
        con.execute(f"""
            CREATE TEMP TABLE _per_file AS
            SELECT {key}, path, count(*) AS n,
                   max_by(struct_pack({cols}, filename, file_row_number),
                          (coalesce(line_no, -1), filename, file_row_number)) AS w
            FROM _staged GROUP BY {key}, path""")
        counts = con.sql("SELECT path, sum(n), count(*) FROM _per_file GROUP BY path").fetchall()
        before = {p: int(n) for p, n, _k in counts}
        repeats = {p: int(n) - int(k) for p, n, k in counts if int(n) > int(k)}
        # per key, the best file's row, written in the order the rows were staged (file, then row)
        con.execute(f"""
            COPY (
                SELECT {", ".join(f'w."{c}" AS "{c}"' for c in STEP_METRICS.stored_columns)} FROM (
                    SELECT max_by(w, (-r._rank, p.path)) AS w FROM _per_file p JOIN _ranks r USING (path)
                    GROUP BY {key}
                ) ORDER BY w.filename, w.file_row_number
            ) TO '{out}' (FORMAT parquet)""")
        after = dict(con.read_parquet(str(out)).aggregate("path, count(*)", "path").fetchall())
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    if sum(after.values()) == sum(before.values()):
        out.unlink()
        return
    staging.replace_with_file("step_metrics", out)
    for f in report.files:
        dropped = before.get(f.path, 0) - after.get(f.path, 0)
        if dropped:
            f.rows_superseded = dropped
            f.rows_repeated = repeats.get(f.path, 0)
            f.rows_out -= dropped


def _dedupe_gpu_samples(staging: RunStaging, report: RunReport) -> None:
    """One telemetry sample once: a scrape that two files of the run both hold (a DCGM scrape saved
    as ``.prom`` and quoted in a ``.md``) has identical rows (host, gpu, ts, metric, value); the
    first file's are kept, the others' count as ``rows_superseded`` of their file."""
    parts = sorted(staging.table_dir("gpu_samples").glob("*.parquet"))
    if len({p.name.split("-", 1)[0] for p in parts}) < 2:
        return
    key = ["host", "gpu", "ts", "metric", "value"]
    lf = pl.scan_parquet(parts, include_file_paths="_part")
    n_dup = lf.select(pl.len() - pl.struct(key).n_unique()).collect().item()
    if not n_dup:
        return
    full = lf.with_columns(_file=pl.col("_part").str.extract(r"f(\d{5})-[^/]*$").cast(pl.Int64)).collect()
    kept = full.sort("_file", maintain_order=True).unique(subset=key, keep="first", maintain_order=True)
    dropped = (full.group_by("_file").len().join(kept.group_by("_file").len(), on="_file", how="left", suffix="_kept")
               .with_columns(d=pl.col("len") - pl.col("len_kept").fill_null(0)))
    staging.replace("gpu_samples", kept.drop("_part", "_file"))
    for idx, d in dropped.select("_file", "d").iter_rows():
        if d and idx is not None and idx < len(report.files):
            report.files[idx].rows_superseded += d
            report.files[idx].rows_out -= d


def _finish_run(
    staging: RunStaging, steps_acc: StepsAccumulator, report: RunReport, manifest: RunManifest, run_path: Path
) -> None:
    _dedupe_step_metrics(staging, steps_acc.metric_paths, steps_acc.repeated_paths, report)
    _dedupe_gpu_samples(staging, report)
    config, facts = _infer_facts(staging, report, manifest, run_path)
    staging.replace("run_config", _config_rows(report, run_path))
    if facts.max_response_length is not None and manifest.max_response_length is None:
        samples = staging.scan("samples")
        if samples.select(pl.col("truncated").is_null().any()).collect().item():
            staging.replace("samples", with_truncation(samples, facts.max_response_length).collect())
    # the common case (one file of metrics, read in line order): steps were derived chunk by
    # chunk as the file was read; otherwise from the staged (deduplicated) rows
    if steps_acc.exact:
        steps = steps_acc.finish(n_gpus=facts.n_gpus)
    else:
        steps = derive_steps(staging.scan("step_metrics"), steps_acc.step_attrs(), n_gpus=facts.n_gpus)
    staging.replace("steps", steps)
    staging.replace("step_windows", derive_step_windows(steps, manifest))
    sf = pl.DataFrame(
        [
            {
                "path": f.path, "sha256": f.sha256, "bytes": f.bytes, "format": f.format, "lines": f.lines,
                "rows_ok": f.rows_ok, "rows_rejected": f.rows_rejected, "rows_skipped": f.rows_skipped,
                "rows_out": f.rows_out, "rows_superseded": f.rows_superseded, "rows_repeated": f.rows_repeated,
                "status": f.status, "error": f.error,
            }
            for f in report.files
        ],
        schema={k: v for k, v in SOURCE_FILES.stored_columns.items()},
    )
    staging.replace("source_files", sf)
    runs = pl.DataFrame(
        [
            {
                "task": manifest.task, "framework": manifest.framework or _framework(report),
                "model": manifest.model or config.model,
                "n_gpus": facts.n_gpus, "n_gpus_source": facts.n_gpus_source,
                "max_response_length": facts.max_response_length,
                "max_response_length_source": facts.max_response_length_source,
                "max_prompt_length": facts.max_prompt_length, "started_at": manifest.started_at,
                "train_batch_size": facts.train_batch_size, "rollout_n": facts.rollout_n,
                "samples_per_step": facts.samples_per_step, "batch_source": facts.batch_source,
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


def _framework(report: RunReport) -> str | None:
    formats = {f.format for f in report.files if f.rows_ok}
    return framework_of([(f.format, f.rows_ok) for f in report.files],
                        {fmt: reader_by_name(fmt).framework for fmt in formats})


# readers whose files may hold a config (a verl config dump, a transformers banner or trainer state: analyses.run_facts)
_CONFIG_DUMP_FORMATS = ("verl_console", "trl_console", "trl_trainer_state")
# readers whose files may state a config run_config lists key by key (analyses.config_dump)
_CONFIG_TABLE_FORMATS = ("verl_console",)


def _infer_facts(staging: RunStaging, report: RunReport, manifest: RunManifest,
                 run_path: Path) -> tuple[ConfigFacts, RunFacts]:
    """What a config dump says, and the run's cap and GPU count: run.toml, else what its logs imply
    (:mod:`analyses.run_facts`)."""
    config = ConfigFacts()
    for f in report.files:
        if f.format in _CONFIG_DUMP_FORMATS and f.status in ("ok", "partial"):
            try:
                found = config_dump_file_facts(run_path if run_path.is_file() else run_path / f.path)
            except OSError:  # the input went away since it was read: its facts are simply not known
                continue
            config = config.merged(found)
    declared = ConfigFacts(max_prompt_length=manifest.max_prompt_length, train_batch_size=manifest.train_batch_size,
                           rollout_n=manifest.rollout_n)
    return config, infer_run_facts(manifest.max_response_length, manifest.n_gpus, config, staging.scan("samples"),
                                   staging.scan("step_metrics"), staging.scan("gpu_samples"), declared)


def _config_rows(report: RunReport, run_path: Path) -> pl.DataFrame:
    """``run_config``: the config the run's first console log with one states (analyses.config_dump)."""
    for f in report.files:
        if f.format in _CONFIG_TABLE_FORMATS and f.status in ("ok", "partial"):
            try:
                head = read_head(run_path if run_path.is_file() else run_path / f.path, CONFIG_HEAD_BYTES)
            except UnreadableFile:
                continue
            rows = config_entries(head)
            if rows:
                return pl.DataFrame([{"key": k, "value": v, "source": s, "path": f.path} for k, v, s in rows],
                                    schema=RUN_CONFIG.stored_columns)
    return RUN_CONFIG.empty().drop("run_id")


def iter_run_dirs(root: Path) -> Iterator[Path]:
    """Immediate subdirectories of ``root`` (each one run), hidden ones excluded."""
    for p in sorted(root.iterdir()):
        if p.is_dir() and not p.name.startswith("."):
            yield p
