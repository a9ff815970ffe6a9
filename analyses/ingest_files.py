"""Reading a run's files into its staging area, and the per-run tables built from what was read.

Shared by the full ingest (:func:`analyses.ingest.ingest_run`) and the append-only refresh
(:mod:`analyses.append_ingest`): file discovery, one file's read and line accounting
(:func:`ingest_file`, :class:`FileReport`), and the tables rebuilt from the reports and the run's
facts (``source_files``, ``runs``, ``run_config``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from analyses import resumable_sha256
from analyses.append_state import file_state, partial_line
from analyses.atomic_output import WriteFailed
from analyses.config_dump import config_entries
from analyses.manifest import MANIFEST_NAME, RunManifest
from analyses.readers import detect, read_file, reader_by_name
from analyses.readers.base import Chunk, FileContext, Reader, UnreadableFile, read_head
from analyses.readers.lines import looks_binary
from analyses.run_facts import (
    CONFIG_HEAD_BYTES,
    ConfigFacts,
    RunFacts,
    config_dump_file_facts,
    framework_of,
    infer_run_facts,
)
from analyses.schema import RUN_CONFIG, RUNS, SOURCE_FILES
from analyses.steps import StepsAccumulator
from analyses.warehouse import (
    RunStaging,
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
    # what an append-only refresh needs to continue this file (analyses.append_state); None when it
    # cannot (the file changed while it was read, ...)
    state: dict | None = field(default=None, repr=False)
    tables: set[str] = field(default_factory=set, repr=False)  # tables it gave rows to
    first_reason: str | None = field(default=None, repr=False)

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
    mode: str = "full"  # "append": only the lines appended since the previous version were read
    refresh_notes: list[str] = field(default_factory=list)  # why a refresh read everything again
    # the catalog file was refreshed with every derived view after this run was published (a
    # refresh asked for again finds nothing to do: it is skipped)
    catalog_views: bool = False

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
        how = "; appended lines only" if self.mode == "append" else ""
        return [f"run {self.run_id}: {len(self.files)} file(s); {tables or 'no rows'}{how}",
                *(f"  {f.line()}" for f in self.files), *(f"  note: {n}" for n in self.refresh_notes),
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
        # a file's path relative to the run, joined as text (pathlib's relative_to and joins cost
        # ~10 us each, per file of a run of hundreds)
        where = here.relative_to(run_path).as_posix()
        under = "" if where == "." else f"{where}/"
        for d in sorted(dirnames):
            rel = (here / d).relative_to(run_path).as_posix()
            if (here / d).is_symlink():  # os.walk lists it but never descends: say so
                skipped.append((rel, "directory symlink, not followed"))
            elif d.startswith("."):
                skipped.append((rel, SKIP_HIDDEN_DIR.format(n=_count_files(here / d))))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not (here / d).is_symlink())
        for name in sorted(filenames):
            p = here / name
            rel = under + name
            if rel == MANIFEST_NAME:
                skipped.append((rel, SKIP_MANIFEST))
                continue
            if name.startswith("."):
                skipped.append((rel, SKIP_HIDDEN_FILE))
                continue
            try:
                st = os.lstat(p)
                # the walk follows no directory link: only a link itself leads elsewhere (resolving
                # every path cost a stat per component of it)
                real = p.resolve(strict=True) if stat.S_ISLNK(st.st_mode) else None
            except (OSError, RuntimeError):
                skipped.append((rel, "dangling or looping symlink"))
                continue
            if real is not None and not real.is_relative_to(base):
                skipped.append((rel, f"symlink to {real}, outside the run directory: not read"))
                continue
            if not (real.is_file() if real is not None else stat.S_ISREG(st.st_mode)):
                skipped.append((rel, "not a regular file"))
                continue
            if tok is not None and (real if real is not None else base / rel) == tok:
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


def file_sha256(path: Path, size: int | None = None) -> str:
    """The file's sha256 (of its first ``size`` bytes when given); with the hash state an
    append-only refresh continues from (``"<digest>:<state>"``) when OpenSSL's is available."""
    if size is not None and resumable_sha256.available():
        state = resumable_sha256.extend_file(None, path, 0, size)
        return f"{resumable_sha256.digest(state)}:{state}"
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def bytes_sha256(data: bytes) -> str:
    """:func:`file_sha256` of a file whose bytes are ``data`` (read whole already)."""
    if resumable_sha256.available():
        state = resumable_sha256.extend(None, data)
        return f"{resumable_sha256.digest(state)}:{state}"
    return hashlib.sha256(data).hexdigest()


def _split_sha(value: str) -> tuple[str, str | None]:
    digest, _, state = value.partition(":")
    return digest, state or None


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(BINARY_SNIFF)
    return not head.startswith(b"\x1f\x8b") and looks_binary(head)


def content_fingerprint(files: list[FileReport]) -> str:
    """A digest of what a run's inputs are: each file's path and sha256. The same files give the
    same fingerprint wherever they live, so unchanged runs can skip work keyed by it."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\0{f.status}\n".encode())
    return h.hexdigest()


DETECT = object()  # ingest_file's reader: detect it


def ingest_file(
    idx: int, path: Path, rel: str, run_id: str, manifest: RunManifest, staging: RunStaging,
    steps_acc: StepsAccumulator, emit: ProgressFn, run_files: frozenset[Path] = frozenset(),
    reader: Reader | None | object = DETECT,
) -> FileReport:
    """Read one file into the staging and account for its lines (``reader``: the one detection
    found already, None for none; by default it is detected here)."""
    t0 = time.perf_counter()
    fr = FileReport(path=rel, format="unknown", bytes=0)
    emit("file_start", {"path": rel, "bytes": _size(path)})
    prefix = f"f{idx:05d}"
    # one guard for everything done with this file (stat, hash, sniff, read, stage): whatever
    # goes wrong (a reader bug, RecursionError, MemoryError, a polars PanicException, which is a
    # BaseException) fails this file alone; an interrupt or exit still stops the ingest
    hashing: Future[str] | None = None
    try:
        before = path.stat()
        fr.bytes = before.st_size
        if fr.bytes >= HASH_IN_BACKGROUND_BYTES:  # hashed on a thread while the file is read (hashlib frees the GIL)
            hashing = _hash_pool().submit(file_sha256, path, fr.bytes)
        else:
            fr.sha256 = file_sha256(path, fr.bytes)
        if fr.bytes == 0:
            fr.status, fr.error = "empty", "file is empty"
            return file_done(fr, t0, emit)
        if reader is DETECT:
            reader = detect(path, read_head(path))
        if reader is None:
            fr.status = "unsupported"
            fr.error = "binary file that no reader recognizes" if _looks_binary(path) else "no reader recognizes this file"
            fr.sha256 = hashing.result() if hashing is not None else fr.sha256
            fr.state = file_state(path, fr, before, None)
            return file_done(fr, t0, emit)
        fr.format = reader.name  # type: ignore[union-attr]
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
                steps_acc.add(sm, rel, chunk.step_summary)
            stage_chunk(chunk, rel, prefix, staging, fr)
            first_reason = fr.first_reason
            emit("file_progress", {"path": rel, "lines": fr.lines, "rows": fr.rows_out})
        staging.seal(prefix)
        fr.sha256 = hashing.result() if hashing is not None else fr.sha256
        set_status(fr, first_reason)
        fr.state = file_state(path, fr, before, reader)
        if fr.state is not None and getattr(reader, "resumable", False) and not fr.state["newline_end"] \
                and not fr.state["gzip"]:
            fr.state["partial"] = partial_line(path, ctx, reader, fr.bytes, fr.lines)
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
        return file_done(fr, t0, emit)
    return file_done(fr, t0, emit)


def set_status(fr: FileReport, first_reason: str | None) -> None:
    """A file read to its end: ok, partial (with the count of rejected lines and the first reason),
    or no_data (nothing in it parsed: not a success)."""
    fr.error = None
    if not fr.rows_ok:
        fr.status = "no_data"
        fr.error = _no_data_reason(fr, first_reason)
    else:
        fr.status = "partial" if fr.rows_rejected else "ok"
        if fr.rows_rejected:  # a partial file says why in source_files too, not only in rejects
            fr.error = f"{fr.rows_rejected:,} line(s) rejected; first: {first_reason} (see rejects)"[:_ERROR_MAX_CHARS]


def stage_chunk(chunk: Chunk, rel: str, prefix: str, staging: RunStaging, fr: FileReport) -> None:
    """Stage a reader chunk's rows and rejects under ``prefix`` and count them into ``fr``."""
    # the path as a categorical: the staging writer passes it to the Parquet encoder as a one-value
    # dictionary instead of a string per row (the same file: analyses.parquet_parts)
    path = pl.lit(rel, dtype=pl.Categorical)
    for table, df in chunk.tables.items():
        n = staging.append(table, df.with_columns(path=path) if _has_path(table) else df, prefix)
        fr.rows_out += n
        if n:
            fr.tables.add(table)
    if chunk.rejects is not None and chunk.rejects.height:
        staging.append("rejects", chunk.rejects.with_columns(path=pl.lit(rel)), prefix)
        fr.tables.add("rejects")
        fr.first_reason = fr.first_reason or chunk.rejects["reason"][0]


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


PATH_TABLES = frozenset({"step_metrics", "samples", "filter_batches"})  # their rows say their file: path


def _has_path(table: str) -> bool:
    return table in PATH_TABLES


def file_done(fr: FileReport, t0: float, emit: ProgressFn) -> FileReport:
    fr.sha256, sha_state = _split_sha(fr.sha256)
    if fr.state is not None:
        fr.state.update(sha256=fr.sha256, sha_state=sha_state, status=fr.status, error=fr.error)
    fr.seconds = time.perf_counter() - t0
    emit("file_done", {"report": fr})
    return fr


def needs_truncation(facts: RunFacts, manifest: RunManifest) -> bool:
    """Samples whose ``truncated`` is unknown get it from the inferred cap (run.toml's is applied by the readers)."""
    return facts.max_response_length is not None and manifest.max_response_length is None


def finish_run_tables(staging: RunStaging, report: RunReport, manifest: RunManifest, config: ConfigFacts,
                      facts: RunFacts, run_path: Path, scan: Callable[[str], pl.LazyFrame] | None = None,
                      run_config: bool = True) -> None:
    """Stage ``source_files``, ``runs`` and ``run_config`` (unless not ``run_config``: the caller
    keeps the previous version's), and count each table's rows into the report (``scan``: how to
    read a table whole; default: what is staged)."""
    if run_config:
        staging.replace("run_config", _config_rows(report, run_path))
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
    scan = scan or staging.scan
    names = ("step_metrics", "steps", "samples", "turns", "tool_calls", "rank_times", "gpu_samples",
             "filter_batches", "rejects")
    # one query for all of them (a collect each cost ~2 ms of fixed overhead, a run of small files' 20 ms)
    counts = pl.collect_all([scan(name).select(pl.len()) for name in names])
    for name, df in zip(names, counts, strict=True):
        report.table_rows[name] = df.item()


def append_info(report: RunReport, config: ConfigFacts, facts: RunFacts) -> dict:
    """What the manifest keeps for the next append-only refresh (analyses.append_ingest): each
    file's state with its final counts (after the run's deduplication), and the run's facts."""
    files = {}
    for f in report.files:
        if f.status == "skipped":
            continue
        if f.state is not None:
            f.state.update(rows_out=f.rows_out, rows_superseded=f.rows_superseded, rows_repeated=f.rows_repeated)
        files[f.path] = f.state
    return {"files": files, "config": asdict(config), "facts": asdict(facts)}


def _framework(report: RunReport) -> str | None:
    formats = {f.format for f in report.files if f.rows_ok}
    return framework_of([(f.format, f.rows_ok) for f in report.files],
                        {fmt: reader_by_name(fmt).framework for fmt in formats})


# readers whose files may hold a config (a verl config dump, a transformers banner or trainer state: analyses.run_facts)
_CONFIG_DUMP_FORMATS = ("verl_console", "trl_console", "trl_trainer_state")
# readers whose files may state a config run_config lists key by key (analyses.config_dump)
_CONFIG_TABLE_FORMATS = ("verl_console",)


def infer_facts(scan: Callable[[str], pl.LazyFrame], report: RunReport, manifest: RunManifest,
                run_path: Path, known: ConfigFacts | None = None) -> tuple[ConfigFacts, RunFacts]:
    """What a config dump says (``known``: what it said when the heads of the files were last
    read, when they have not changed since), and the run's cap and GPU count: run.toml, else what
    its logs imply (:mod:`analyses.run_facts`)."""
    config = ConfigFacts()
    for f in report.files if known is None else ():
        if f.format in _CONFIG_DUMP_FORMATS and f.status in ("ok", "partial"):
            try:
                found = config_dump_file_facts(run_path if run_path.is_file() else run_path / f.path)
            except OSError:  # the input went away since it was read: its facts are simply not known
                continue
            config = config.merged(found)
    config = config if known is None else known
    declared = ConfigFacts(max_prompt_length=manifest.max_prompt_length, train_batch_size=manifest.train_batch_size,
                           rollout_n=manifest.rollout_n)
    return config, infer_run_facts(manifest.max_response_length, manifest.n_gpus, config, scan("samples"),
                                   scan("step_metrics"), scan("gpu_samples"), declared)


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


