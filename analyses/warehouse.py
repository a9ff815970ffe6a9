"""Warehouse I/O: hive-partitioned Parquet per run, published atomically through run manifests.

Layout under the warehouse root::

    parquet/<table>/run_id=<id>/<version>.parquet   a segment of a table, written by one run version
    manifests/<run_id>.json                          the published version of a run and the segments
                                                     of each table it reads: written last
    .staging/<version>--<run_id>/                    an ingest's private work area
    .locks/<run_id>.lock                             one writer per run id at a time
    rejected/<run_id>/<version>/                     a version its blocking checks refused

A run becomes visible all at once or not at all: every reader (the DuckDB catalog, ``scan_table``,
the fits) reads the files a manifest names, and a manifest is replaced by one atomic rename after
all of its files are in place. Whatever kills a commit, readers see the previous version or the
new one, never a mix. Two writers of one run id are serialized by the run lock. Files of a
version that lost (a killed commit, the version a new one replaced) are removed by the next
commit of that run, and stale staging directories by the next ingest (:func:`clean_stale`).
Plain hive readers (Spark, Trino, ``pyarrow.dataset``) see exactly the published files between
commits; during a commit, or after a crash until the next ingest, they may see extra files.

A table of a version is a list of segments (manifest format ``polytrace-run/2``): a full ingest
writes one per table; an append-only refresh (:mod:`analyses.append_ingest`) publishes the previous
version's segments plus one new segment of the appended rows. Past :data:`MAX_SEGMENTS` segments a
table is compacted into one file at the commit. ``polytrace-run/1`` manifests (one file per table)
are read as one segment each.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import signal
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from analyses.atomic_output import WriteFailed, try_lock, writing
from analyses.parquet_parts import PartWriter, arrow_table, categorical_columns
from analyses.schema import TABLES, Table, conform, parquet_metadata

if TYPE_CHECKING:  # Polars and pyarrow once Parquet is written or scanned: `polytrace runs` and `query` need neither
    import polars as pl

ENV_WAREHOUSE = "POLYTRACE_WAREHOUSE"
ENV_KILL_AT = "POLYTRACE_TEST_KILL_AT"  # test hook: SIGKILL this process at the named commit step
MANIFEST_FORMAT = "polytrace-run/2"
READABLE_FORMATS = ("polytrace-run/1", MANIFEST_FORMAT)
# a table of more segments than this is rewritten as one file at the commit: a refresh every few
# seconds of a run that lasts days would otherwise leave every reader listing thousands of small
# files (32 appends of ~1 MB cost one rewrite of the appended tables, amortized ~3 % per append)
MAX_SEGMENTS = 32
MANIFESTS = "manifests"
STAGING = ".staging"
LOCKS = ".locks"
REJECTED = "rejected"
OWNER = "owner.json"
DEFAULT_LOCK_WAIT_S = 900.0


def default_root() -> Path:
    return Path(os.environ.get(ENV_WAREHOUSE) or "warehouse")


def parquet_root(root: Path) -> Path:
    return root / "parquet"


def partition_dir(root: Path, table: str, run_id: str) -> Path:
    return parquet_root(root) / table / f"run_id={run_id}"


def kill_point(step: str) -> None:
    """Die here, as a crash would, when ``$POLYTRACE_TEST_KILL_AT`` names this step (tests only)."""
    if os.environ.get(ENV_KILL_AT) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def new_version() -> str:
    """A run version id: UTC time then random, so versions sort by creation and never collide."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + uuid.uuid4().hex[:8]


# ---------------------------------------------------------------- manifests


@dataclass(frozen=True)
class TableFile:
    """One segment (file) of a table of a run version; ``path`` is relative to the warehouse root."""

    path: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class PublishedRun:
    """What ``manifests/<run_id>.json`` says: the run's current version and each table's segments."""

    run_id: str
    version: str
    created_at: str
    tables: dict[str, list[TableFile]]
    info: dict = field(default_factory=dict)

    def files(self) -> list[TableFile]:
        """Every segment of every table."""
        return [f for segs in self.tables.values() for f in segs]

    def rows(self, table: str) -> int:
        return sum(f.rows for f in self.tables.get(table, []))

    def to_json(self) -> str:
        doc = {
            "format": MANIFEST_FORMAT,
            "run_id": self.run_id,
            "version": self.version,
            "created_at": self.created_at,
            "tables": {k: [{"path": f.path, "rows": f.rows, "bytes": f.bytes} for f in segs]
                       for k, segs in self.tables.items()},
            "info": self.info,
        }
        # one line: ``indent`` makes json use its pure-Python encoder, ~10 ms for a run of 315
        # files (each file's append state); every reader parses it (``jq .`` shows it indented)
        return json.dumps(doc, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PublishedRun:
        doc = json.loads(text)
        fmt = doc.get("format")
        if fmt not in READABLE_FORMATS:
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest: format={fmt!r}")
        tables = {k: [TableFile(f["path"], int(f["rows"]), int(f["bytes"])) for f in ([v] if isinstance(v, dict) else v)]
                  for k, v in doc["tables"].items()}
        return cls(doc["run_id"], doc["version"], doc["created_at"], tables, doc.get("info") or {})


def manifest_path(root: Path, run_id: str) -> Path:
    return root / MANIFESTS / f"{run_id}.json"


def read_published(root: Path, run_id: str) -> PublishedRun | None:
    """The run's published version, or None when the run is not in the warehouse."""
    try:
        return PublishedRun.from_json(manifest_path(root, run_id).read_text())
    except FileNotFoundError:
        return None


def published_runs(root: Path) -> dict[str, PublishedRun]:
    """Every published run by id (a manifest that cannot be read is left out)."""
    d = root / MANIFESTS
    if not d.is_dir():
        return {}
    out = {}
    for p in sorted(d.glob("*.json")):
        try:
            m = PublishedRun.from_json(p.read_text())
        except (OSError, ValueError, KeyError):
            continue
        out[m.run_id] = m
    return out


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not keep half a manifest lying about
        raise
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_ids(root: Path) -> list[str]:
    """Runs present in the warehouse (those with a published manifest)."""
    return sorted(published_runs(root))


def partition_files(root: Path, table: str, run_id: str) -> list[Path]:
    """The published segments of one run's ``table`` (empty when the run is not published)."""
    m = read_published(root, run_id)
    if m is None or table not in m.tables:
        return []
    return [root / f.path for f in m.tables[table]]


def table_files(root: Path, table: str, runs: Iterable[str] | None = None) -> list[str]:
    """The published files of ``table`` (absolute paths, by run id), for ``runs`` or every run."""
    pub = published_runs(root)
    wanted = sorted(pub) if runs is None else [r for r in runs if r in pub]
    base = root.resolve()
    return [str(base / f.path) for r in wanted for f in pub[r].tables.get(table, [])]


def scan_table(root: Path, table: str, runs: Iterable[str] | None = None) -> pl.LazyFrame:
    """A lazy scan of a warehouse table with ``run_id`` from the hive path, in contract order."""
    import polars as pl

    t = TABLES[table]
    files = table_files(root, table, runs)
    if not files:
        return pl.LazyFrame(schema=t.columns)
    lf = pl.scan_parquet(
        files,
        hive_partitioning=True,
        hive_schema={"run_id": pl.String()},
        missing_columns="insert",
        extra_columns="ignore",
        schema=t.stored_columns,
    )
    return lf.select(list(t.columns))


# ---------------------------------------------------------------- locks


class RunLocked(Exception):
    """Another process holds the run's lock for longer than we were willing to wait."""


def _lock_holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"


@contextmanager
def run_lock(
    root: Path, run_id: str, wait_s: float = DEFAULT_LOCK_WAIT_S, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the run's writer lock (an OS file lock, released when the process dies).

    Waits up to ``wait_s`` for another writer of the same run id, telling ``on_wait`` who it is
    once; then raises :class:`RunLocked`.
    """
    path = root / LOCKS / f"{run_id}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _lock_holder(path)
                if time.monotonic() >= deadline:
                    raise RunLocked(f"run {run_id} is being written by {holder}; try again later") from None
                if on_wait is not None and not told:
                    on_wait(f"waiting for the lock on run {run_id}, held by {holder}")
                    told = True
                time.sleep(0.1)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now(UTC).isoformat(timespec="seconds")}
        with writing(root):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- staging and commit


WRITES_IN_FLIGHT = 2  # staged batches waiting for the writer thread (bounds the memory they hold)
SEALED_IN_MEMORY_BYTES = 64 << 20  # sealed parts of one batch a run's staging keeps in memory, in all


class CommitRefused(Exception):
    """The staged version failed a blocking check; it was kept aside and nothing was published."""

    def __init__(self, run_id: str, problems: list[str], kept: Path) -> None:
        super().__init__(f"run {run_id}: not published, blocking check failed: {'; '.join(problems[:3])} "
                         f"(kept aside in {kept}; the previous version stays)")
        self.run_id, self.problems, self.kept = run_id, problems, kept


def write_part(df: pl.DataFrame, table: Table, path: Path) -> int:
    """Write ``df`` (already conformed) as one Parquet file of ``table``'s stored columns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return _encode(df, table, path)


def _encode(df: pl.DataFrame, table: Table, dest: Path | io.BytesIO) -> int:
    out = df.select([c for c in table.stored_columns if c in df.columns])
    out.write_parquet(dest, compression="zstd", statistics=True, metadata=parquet_metadata(table))
    return out.height


_EMPTY_PARTS: dict[str, bytes] = {}


def empty_part(table: Table) -> bytes:
    """The bytes :func:`write_part` writes for ``table`` with no rows: the same every time, so
    encoded once per process (a commit writes one for every table nothing was staged for: 13 of
    16 for a run of packed step files, ~1.5 ms each)."""
    got = _EMPTY_PARTS.get(table.name)
    if got is None:
        buf = io.BytesIO()
        _encode(table.empty(), table, buf)
        got = _EMPTY_PARTS[table.name] = buf.getvalue()
    return got


def encode_empty_parts() -> None:
    """Every table's :func:`empty_part` (work for a thread that waits on something else)."""
    for t in TABLES.values():
        empty_part(t)


def _plain_strings(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with its categorical columns (kept for the part writer) cast back to the contract's strings."""
    import polars as pl

    cats = categorical_columns(df)
    return df.with_columns(pl.col(cats).cast(pl.String)) if cats else df


def _described(path: Path) -> bool:
    """The Parquet file carries the table's key-value metadata (:func:`analyses.schema.parquet_metadata`)."""
    import polars as pl

    return "polytrace.table" in pl.read_parquet_metadata(path)


Check = Callable[[dict[str, Path]], list[str]]  # table -> staged file; returns problems (empty = pass)


def _staged_frame(df: pl.DataFrame, t: Table) -> pl.DataFrame:
    """``conform(df, t)``'s stored columns, categorical columns kept so (the part writer hands them
    to the encoder as dictionaries). A chunk holding every stored column is selected as it is,
    casting only what differs: conforming it whole made a null column per categorical and the
    partition column before dropping them (~3 ms of a 293k-row verl chunk)."""
    import polars as pl

    have = df.schema
    stored = list(t.stored_columns)
    if all(c in have for c in stored):
        return df.select([pl.col(c) if have[c] == dtype or isinstance(have[c], pl.Categorical)
                          else pl.col(c).cast(dtype, strict=False) for c, dtype in t.stored_columns.items()])
    cats = categorical_columns(df)
    frame = conform(df.drop(cats), t).with_columns(df.select(cats)) if cats else conform(df, t)
    return frame.select(stored)


class RunStaging:
    """A run version's private staging area; :meth:`commit` publishes it atomically.

    The staging directory holds ``owner.json`` under an OS lock for as long as this process
    lives, so :func:`clean_stale` can tell an abandoned one from one still being written.
    """

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = root
        self.run_id = run_id
        self.version = new_version()
        self.dir = root / STAGING / f"{self.version}--{run_id}"
        self._owner_fd: int | None = None
        try:
            with writing(root):
                self.dir.mkdir(parents=True, exist_ok=False)
                owner = self.dir / OWNER
                owner.write_text(json.dumps({"run_id": run_id, "version": self.version, "pid": os.getpid(),
                                             "host": socket.gethostname()}))
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self._owner_fd = os.open(owner, os.O_RDWR)
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        self._counters: dict[str, int] = {}
        self._writers: dict[tuple[str, str], PartWriter] = {}  # touched by the writer thread only between seals
        self._held: dict[tuple[str, str], pl.DataFrame] = {}  # a part's first batch, not written yet (idem)
        self._empty: set[Path] = set()  # compacted files of tables nothing was staged for
        # sealed parts of one batch not written yet: table -> {part file name: rows}; written when a
        # table's files are asked for (or past SEALED_IN_MEMORY_BYTES), never when replaced first
        self._sealed: dict[str, dict[str, pl.DataFrame]] = {}
        self._sealed_bytes = 0
        self._pending: dict[str, deque[Future[None]]] = {}
        self._pool: ThreadPoolExecutor | None = None
        # table -> its part being written in the background: file name, its rows, the write
        self._writes: dict[str, tuple[str, pl.DataFrame, Future[int]]] = {}

    def table_dir(self, table: str) -> Path:
        return self.dir / table

    def add(self, table: str, df: pl.DataFrame, prefix: str = "part", background: bool = False) -> int:
        """Conform ``df`` to ``table`` and stage it as a new part file; returns rows written.

        ``background``: the file is written on the staging writer thread (Parquet encoding releases
        the GIL) while the caller goes on (the samples of 315 step files, ~40 ms to encode, beside
        the rest of the run's tables); :meth:`scan` gives its rows at once, :meth:`parts` and the
        commit wait for the file (and raise a failed write)."""
        if df.height == 0:
            return 0
        t = TABLES[table]
        n = self._counters.get(table, 0)
        self._counters[table] = n + 1
        conformed = conform(df, t)
        path = self.table_dir(table) / f"{prefix}-{n:06d}.parquet"
        if background:
            self._wait_write(table)
            self._writes[table] = (path.name, conformed, self._writer().submit(self._write_part, conformed, t, path))
            return conformed.height
        return self._write_part(conformed, t, path)

    def _write_part(self, df: pl.DataFrame, t: Table, path: Path) -> int:
        with writing(self.root):
            return write_part(df, t, path)

    def _wait_write(self, table: str, raise_errors: bool = True) -> None:
        """The table's background write done (its failure raised, unless not ``raise_errors``)."""
        got = self._writes.pop(table, None)
        if got is None:
            return
        try:
            got[2].result()
        except BaseException:
            if raise_errors:
                raise

    def _writer(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="staging-writer")
        return self._pool

    def append(self, table: str, df: pl.DataFrame, prefix: str) -> int:
        """Conform ``df`` to ``table`` and append it to the one part file of ``prefix`` (a row
        group per call), so a file read in many chunks stages one part per table and the commit
        renames it instead of rewriting it. The encoding runs on a writer thread (Parquet
        encoding releases the GIL) while the caller reads on; at most :data:`WRITES_IN_FLIGHT`
        batches wait. :meth:`seal` finishes the part (and raises a failed write); returns rows."""
        if df.height == 0:
            return 0
        q = self._pending.setdefault(prefix, deque())
        q.append(self._writer().submit(self._write_batch, table, df, prefix))
        while len(q) > WRITES_IN_FLIGHT:
            q.popleft().result()
        return df.height

    def _write_batch(self, table: str, df: pl.DataFrame, prefix: str) -> None:
        t = TABLES[table]
        frame = _staged_frame(df, t)
        key = (table, prefix)
        if key not in self._writers and key not in self._held:
            # a part's first batch waits for a second one: a part of one batch (a small file, a batch
            # of small files) is written by Polars at its seal, without pyarrow (~0.2 s to import)
            self._held[key] = frame
            return
        # a failed write is the warehouse's (a full disk), not the input file's: WriteFailed stops the ingest
        with writing(self.root):
            w = self._writers.get(key)
            if w is None:
                d = self.table_dir(table)
                d.mkdir(parents=True, exist_ok=True)
                w = PartWriter(d / f"{prefix}-a.parquet", arrow_table(self._held.pop(key)), parquet_metadata(t))
                self._writers[key] = w
            w.write(arrow_table(frame))

    def _drain(self, prefix: str, raise_errors: bool = True) -> None:
        q = self._pending.pop(prefix, deque())
        error: BaseException | None = None
        while q:
            try:
                q.popleft().result()
            except BaseException as exc:  # every write is waited for before the first error is raised
                error = error or exc
        if error is not None and raise_errors:
            raise error

    def seal(self, prefix: str) -> None:
        """Finish the part files :meth:`append` wrote for ``prefix`` (before anything reads them);
        a failed write raises here."""
        try:
            self._drain(prefix)
            for key in [k for k in self._held if k[1] == prefix]:  # parts of one batch: kept in memory
                self._keep_sealed(key[0], f"{prefix}-a.parquet", _plain_strings(self._held.pop(key)))
        finally:
            for key in [k for k in self._held if k[1] == prefix]:  # after a failed write
                del self._held[key]
            with writing(self.root):
                for key in [k for k in self._writers if k[1] == prefix]:
                    self._writers.pop(key).close()

    def discard(self, prefix: str) -> None:
        """Drop every part staged under ``prefix`` (a file that failed midway)."""
        self._drain(prefix, raise_errors=False)
        for key in [k for k in self._held if k[1] == prefix]:
            del self._held[key]
        self.seal(prefix)
        for table in list(self._sealed):
            for name in [n for n in self._sealed[table] if n.startswith(f"{prefix}-")]:
                self._drop_sealed(table, name)
        for p in self.dir.glob(f"*/{prefix}-*.parquet"):
            p.unlink()

    def _keep_sealed(self, table: str, name: str, df: pl.DataFrame) -> None:
        """A sealed part: kept in memory within SEALED_IN_MEMORY_BYTES (a table the run's end
        replaces, as ``samples`` when their truncation is inferred, is then never written twice),
        else written now."""
        size = df.estimated_size()
        if self._sealed_bytes + size > SEALED_IN_MEMORY_BYTES:
            with writing(self.root):
                write_part(df, TABLES[table], self.table_dir(table) / name)
            return
        self._sealed.setdefault(table, {})[name] = df
        self._sealed_bytes += size

    def _drop_sealed(self, table: str, name: str) -> pl.DataFrame:
        df = self._sealed[table].pop(name)
        self._sealed_bytes -= df.estimated_size()
        if not self._sealed[table]:
            del self._sealed[table]
        return df

    def _unstage(self, table: str) -> None:
        """Forget everything staged for ``table``: its sealed parts in memory and its files."""
        self._wait_write(table, raise_errors=False)
        for name in list(self._sealed.get(table, {})):
            self._drop_sealed(table, name)
        shutil.rmtree(self.table_dir(table), ignore_errors=True)
        self._counters.pop(table, None)

    def parts(self, table: str) -> list[Path]:
        """The part files staged for ``table``, in order (its sealed parts in memory written first)."""
        self._wait_write(table)
        with writing(self.root):
            for name in sorted(self._sealed.get(table, {})):
                write_part(self._drop_sealed(table, name), TABLES[table], self.table_dir(table) / name)
        return sorted(self.table_dir(table).glob("*.parquet"))

    def scan(self, table: str) -> pl.LazyFrame:
        """What is staged so far for ``table`` (empty frame with the contract schema if nothing)."""
        import polars as pl

        t = TABLES[table]
        mem = self._sealed.get(table, {})
        bg = self._writes.get(table)
        if bg is not None and not mem and all(p.name == bg[0] for p in self.table_dir(table).glob("*.parquet")):
            return bg[1].select([c for c in t.stored_columns if c in bg[1].columns]).lazy()  # what it writes
        if mem and not any(self.table_dir(table).glob("*.parquet")):  # the same rows a scan of them written gives
            return pl.concat([mem[name].lazy() for name in sorted(mem)])
        files = self.parts(table)
        if not files:
            return pl.LazyFrame(schema=t.stored_columns)
        return pl.scan_parquet(files)

    def replace(self, table: str, df: pl.DataFrame, background: bool = False) -> int:
        """Drop what is staged for ``table`` and stage ``df`` instead (``background``: see :meth:`add`)."""
        self._unstage(table)
        return self.add(table, df, background=background)

    def replace_with_file(self, table: str, part: Path) -> None:
        """Drop what is staged for ``table`` and stage the Parquet file ``part`` instead (moved, not
        copied; written by a query that already gives the table's columns)."""
        self._unstage(table)
        with writing(self.root):
            self.table_dir(table).mkdir(parents=True)
            os.replace(part, self.table_dir(table) / "part-000000.parquet")

    def _compact(self, name: str, t: Table) -> Path:
        """The table's parts as one file (typed and empty when nothing was staged)."""
        import polars as pl

        out = self.dir / "_final" / f"{name}.parquet"
        out.parent.mkdir(exist_ok=True)
        parts = self.parts(name)
        if not parts:
            out.write_bytes(empty_part(t))
            self._empty.add(out)  # its rows are known: the publish need not count them
        elif len(parts) == 1 and _described(parts[0]):
            os.replace(parts[0], out)
        else:  # several parts, or one a query wrote without the table's metadata
            pl.scan_parquet(parts).sink_parquet(out, compression="zstd", statistics=True, metadata=parquet_metadata(t))
        return out

    def commit(
        self,
        check: Check | None = None,
        info: dict | None = None,
        after_publish: Callable[[], None] | None = None,
        lock_wait_s: float = DEFAULT_LOCK_WAIT_S,
        holding_lock: bool = False,
        reuse: dict[str, list[TableFile]] | None = None,
    ) -> PublishedRun:
        """Publish the staged tables as the run's new version, all at once.

        ``reuse``: per table, published segments of the previous version that the new version
        reads too, before the staged rows (an append-only refresh); the staged file becomes one
        more segment (none when it is empty), and past :data:`MAX_SEGMENTS` they are rewritten
        into one file.

        1. each table's parts become one file (empty and typed when nothing was staged);
        2. ``check`` runs on those files: problems keep the version aside under ``rejected/``
           and raise :class:`CommitRefused` (the previous version stays published);
        3. the files move into their hive partitions under names no reader follows yet;
        4. the manifest is replaced in one atomic rename: the version is now visible;
        5. ``after_publish`` runs (the catalog refresh), then the run's files that the new
           manifest does not name are removed.

        The run lock is held from step 3 on (or by the caller, ``holding_lock``).
        """
        kill_point("staged")
        with writing(self.root):
            # the tables written in the background last: the others are compacted meanwhile
            done = {name: self._compact(name, TABLES[name]) for name in sorted(TABLES, key=lambda n: n in self._writes)}
            final = {name: done[name] for name in TABLES}
        kill_point("compacted")
        problems = check(final) if check is not None else []
        if problems:
            raise self._reject(final, problems)
        kill_point("checked")
        reuse = reuse or {}
        with writing(self.root):
            for name, segs in reuse.items():
                if len(segs) + 1 > MAX_SEGMENTS:
                    final[name] = self._merge(name, segs, final[name])
                    reuse[name] = []
        if holding_lock:
            pub = self._publish(final, info or {}, after_publish, reuse)
        else:
            with run_lock(self.root, self.run_id, lock_wait_s):
                pub = self._publish(final, info or {}, after_publish, reuse)
        self._close()
        shutil.rmtree(self.dir, ignore_errors=True)
        kill_point("done")
        return pub

    def _merge(self, name: str, segs: list[TableFile], staged: Path) -> Path:
        """Compaction: the published segments ``segs`` and the staged file as one file."""
        import polars as pl

        out = self.dir / "_final" / f"{name}.merged.parquet"
        pl.scan_parquet([self.root / f.path for f in segs] + [staged]).sink_parquet(
            out, compression="zstd", statistics=True, metadata=parquet_metadata(TABLES[name]))
        staged.unlink()
        return out

    def _publish(self, final: dict[str, Path], info: dict, after_publish: Callable[[], None] | None,
                 reuse: dict[str, list[TableFile]] | None = None) -> PublishedRun:
        import polars as pl

        tables: dict[str, list[TableFile]] = {}
        new: list[TableFile] = []
        reuse = reuse or {}
        try:
            with writing(self.root):
                # every table's rows in one query (a table nothing was staged for has none)
                counted = [name for name, src in final.items() if src not in self._empty]
                counts = dict(zip(counted, pl.collect_all([pl.scan_parquet(final[n]).select(pl.len()) for n in counted]),
                                  strict=True))
                for name, src in final.items():
                    kept = list(reuse.get(name, []))
                    rows = counts[name].item() if name in counts else 0
                    if kept and rows == 0:  # an append that gave the table nothing adds no segment
                        tables[name] = kept
                        continue
                    rel = f"parquet/{name}/run_id={self.run_id}/{self.version}.parquet"
                    dst = self.root / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(src, dst)
                    f = TableFile(rel, int(rows), dst.stat().st_size)
                    new.append(f)
                    tables[name] = [*kept, f]
                    kill_point(f"moved:{name}")
                pub = PublishedRun(self.run_id, self.version, datetime.now(UTC).isoformat(timespec="seconds"), tables,
                                   info)
                _write_atomic(manifest_path(self.root, self.run_id), pub.to_json())
        except BaseException:
            try:
                now = read_published(self.root, self.run_id)
            except (OSError, ValueError, KeyError):
                now = None
            if now is None or now.version != self.version:
                for f in new:  # never published: no reader can hold them, so they go at once
                    (self.root / f.path).unlink(missing_ok=True)
            raise
        kill_point("published")
        if after_publish is not None:
            after_publish()
        kill_point("catalog")
        try:  # the version is published: what is left to tidy must not make the commit look failed
            remove_unpublished(self.root, self.run_id)
            remove_deferred(self.root, holding=self.run_id)
        except (OSError, WriteFailed):
            pass  # the next commit of the run (or the next ingest's clean_stale) removes them
        kill_point("cleaned")
        return pub

    def _reject(self, final: dict[str, Path], problems: list[str]) -> CommitRefused:
        kept = self.root / REJECTED / self.run_id / self.version
        with writing(self.root):
            kept.mkdir(parents=True, exist_ok=True)
            for name, src in final.items():
                os.replace(src, kept / f"{name}.parquet")
            (kept / "problems.json").write_text(json.dumps({"run_id": self.run_id, "problems": problems}, indent=1)
                                                + "\n")
        self.abort()
        return CommitRefused(self.run_id, problems, kept)

    def _close(self) -> None:
        for prefix in list(self._pending):
            self._drain(prefix, raise_errors=False)
        for table in list(self._writes):
            self._wait_write(table, raise_errors=False)
        for w in self._writers.values():
            try:
                w.close()
            except OSError:  # a writer that failed (a full disk) fails again on close; the area goes anyway
                pass
        self._writers.clear()
        self._held.clear()
        self._sealed.clear()
        self._sealed_bytes = 0
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    def abort(self) -> None:
        self._close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- readers


READERS_LOCK = "readers.lock"
DEFERRED = ".unpublished"  # .locks/<run_id>.unpublished: files to remove once no reader holds a lease


class ReaderLease:
    """A shared lock on ``.locks/readers.lock`` for as long as a reader may open files that the
    manifests it read name: taken before reading them, released when done (closing the fd; the
    kernel drops it when the process dies). While any reader holds one, writers keep the files of
    replaced versions (:func:`remove_unpublished` defers them) instead of deleting them under it.
    Taking it waits only while a writer deletes files (milliseconds). A warehouse the reader
    cannot write to and no writer has touched gets no lease: nobody deletes anything there."""

    def __init__(self, root: Path) -> None:
        self.fd: int | None = None
        path = root / LOCKS / READERS_LOCK
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return
        fcntl.flock(fd, fcntl.LOCK_SH)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@contextmanager
def reader_lease(root: Path) -> Iterator[None]:
    """Hold a :class:`ReaderLease` on ``root`` for the block."""
    lease = ReaderLease(root)
    try:
        yield
    finally:
        lease.release()


@contextmanager
def _no_readers(root: Path) -> Iterator[bool]:
    """True (holding the readers lock exclusively for the block, so no reader starts meanwhile)
    when no reader holds a lease; False at once otherwise. Never waits."""
    path = root / LOCKS / READERS_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def readers_active(root: Path) -> bool:
    """Whether a reader holds a lease on ``root`` now (another process's, or one of this process's)."""
    with _no_readers(root) as free:
        return not free


def remove_unpublished(root: Path, run_id: str) -> list[Path]:
    """Remove the run's partition files its manifest does not name (older versions, leftovers of
    killed commits); the caller holds the run lock. Returns what was removed. While a reader holds
    a lease the files stay (a reader may have read the manifest that names them) and the run is
    marked, so a later writer removes them (:func:`remove_deferred`)."""
    marker = root / LOCKS / f"{run_id}{DEFERRED}"
    with _no_readers(root) as free:
        if not free:
            with writing(root):
                marker.touch()
            return []
        removed = _remove_unpublished_now(root, run_id)
    marker.unlink(missing_ok=True)
    return removed


def remove_deferred(root: Path, holding: str | None = None) -> list[str]:
    """:func:`remove_unpublished` for every run whose replaced files were kept for readers (a run
    another writer holds is left to that writer); ``holding``: the run whose lock the caller holds."""
    done = []
    for marker in sorted((root / LOCKS).glob(f"*{DEFERRED}")):
        rid = marker.name[: -len(DEFERRED)]
        try:
            if rid == holding:
                remove_unpublished(root, rid)
            else:
                with run_lock(root, rid, wait_s=0):
                    remove_unpublished(root, rid)
        except RunLocked:
            continue
        if not marker.exists():
            done.append(rid)
    return done


def _remove_unpublished_now(root: Path, run_id: str) -> list[Path]:
    m = read_published(root, run_id)
    keep = {root / f.path for f in m.files()} if m else set()
    removed = []
    base = parquet_root(root)
    if not base.is_dir():
        return removed
    for table_dir in base.iterdir():
        d = table_dir / f"run_id={run_id}"
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if p not in keep:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
                removed.append(p)
        if not any(d.iterdir()):
            d.rmdir()
    return removed


def clean_stale(root: Path) -> list[str]:
    """Remove staging directories whose ingest died (their owner lock is free), and the files
    their run's interrupted commit left in the partitions. Returns the run ids cleaned."""
    base = root / STAGING
    cleaned: list[str] = []
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        owner = d / OWNER
        fd = try_lock(owner)
        if fd is None and owner.exists():
            continue  # its ingest is alive
        try:
            info = json.loads(owner.read_text()) if owner.exists() else {}
        except (OSError, ValueError):
            info = {}
        rid = info.get("run_id") or d.name.split("--", 1)[-1]
        try:
            with run_lock(root, rid, wait_s=0):
                remove_unpublished(root, rid)
                shutil.rmtree(d, ignore_errors=True)
                cleaned.append(rid)
        except RunLocked:
            pass  # a live writer of that run will clean its own partitions at commit
        finally:
            if fd is not None:
                os.close(fd)
    remove_deferred(root)
    return cleaned


def delete_run(root: Path, run_id: str) -> None:
    """Unpublish the run (its manifest goes first), then remove its files."""
    with run_lock(root, run_id):
        manifest_path(root, run_id).unlink(missing_ok=True)
        remove_unpublished(root, run_id)
