"""Consumer and reference tools from PyPI, each in its own cached virtual environment (never the project's).

``aiperf`` and ``vidur`` (consumers of our exports) are about 1.2 GB each once installed, and ``hta``
(Meta's HolisticTraceAnalysis, the reference our profiler-trace views are checked against,
tests/test_trace_vs_hta.py) about 0.5 GB, so each lives in
``~/.cache/polytrace-conformance/<tool>-<version>/`` (``$POLYTRACE_CONFORMANCE_CACHE`` to move it),
created on first use with ``pip install -c locks/<tool>-<version>.txt <package>==<version>`` (the lock pins
every transitive package as installed when the version was chosen), and reused while the lock file is
unchanged (its hash is stamped in the environment). A file lock makes concurrent first uses wait for one
install. Drivers (``drivers/<tool>_driver.py``, sharing ``drivers/verdicts.py``) run under the environment's python, import nothing from
the project, load files with the tool's own classes and print JSON verdicts (one driver process per consumer
serves every batch of a test run: :func:`_run_driver`); ``run_driver`` keeps them in
``<cache>/verdicts/``, keyed by the environment, the driver sources and the bytes of every file a job names, and
reuses them for the same bytes (``POLYTRACE_CONFORMANCE_FRESH=1``, and ``CI=true`` unless it is 0, run every
driver: :func:`fresh_verdicts`).

    python tests/conformance/consumers.py install [TOOL ...]   # what `make conformance-env` runs (duckdb-1.5.6, ...)
    python tests/conformance/consumers.py info                 # versions, paths, sizes
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
INSTALL_TIMEOUT_S = 1800
DRIVER_TIMEOUT_S = 1200
# Driver verdicts are cached under cache_root()/verdicts, keyed by content (run_driver); set to 1 to run
# every driver whatever the cache holds (`make conformance` does; under CI=true it is the default)
FRESH_ENV = "POLYTRACE_CONFORMANCE_FRESH"
VERDICT_CACHE_KEEP = 16
REPORT_ENV = "POLYTRACE_CONFORMANCE_REPORT"  # the conformance summary's log (harness.measure)


class ConsumerUnavailable(RuntimeError):
    """The consumer's environment could not be created (the message carries pip's last lines)."""


class DriverFailed(RuntimeError):
    """A driver crashed instead of printing verdicts."""


@dataclass(frozen=True)
class Consumer:
    name: str
    version: str
    loaders: tuple[str, ...]  # what its driver exercises, for the report
    extras: tuple[str, ...] = ()  # packages installed beside it (pinned by its lock file)
    package: str = ""  # the PyPI name when it is not ``name``

    @property
    def requirement(self) -> str:
        return f"{self.package or self.name}=={self.version}"

    @property
    def lock(self) -> Path:
        return HERE / "locks" / f"{self.name}-{self.version}.txt"

    @property
    def driver(self) -> Path:
        return HERE / "drivers" / f"{self.name}_driver.py"

    @property
    def env_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    @property
    def python(self) -> Path:
        return self.env_dir / "bin" / "python"

    def lock_hash(self) -> str:
        return hashlib.sha256(self.lock.read_bytes()).hexdigest()


CONSUMERS: dict[str, Consumer] = {c.name: c for c in (
    Consumer("aiperf", "0.13.0", ("aiperf.common.models.sequence_distribution.DistributionParser.parse",
                                  "aiperf.dataset.loader.models.MooncakeTrace",
                                  "aiperf.dataset.loader.mooncake_trace.MooncakeTraceDatasetLoader")),
    Consumer("vidur", "0.0.26", ("vidur.request_generator.TraceReplayRequestGenerator",
                                 "vidur.request_generator.TraceRequestLengthGenerator",
                                 "vidur.request_generator.TraceRequestIntervalGenerator")),
    # HTA 0.5.0 with pandas 2.x: under pandas 3 its call graph (frequent kernel sequences) fails on every
    # trace (`replace` no longer downcasts, np.unique(axis=0) refuses the object array)
    Consumer("hta", "0.5.0", ("hta.trace_analysis.TraceAnalysis", "hta.trace_diff.TraceDiff"),
             package="HolisticTraceAnalysis"),
)}


# DuckDB clients other than the project's (the README: the catalog opens in "any DuckDB client 1.1 or
# later"), each in its own environment like the consumers, to read the warehouse's views under another
# engine version: the oldest supported and the last 1.x (tests/conformance/test_view_determinism.py)
# (DuckDB 1.x's Python client needs pytz to return TIMESTAMPTZ values, as a user's would have it)
DUCKDB_CLIENTS: dict[str, Consumer] = {v: Consumer("duckdb", v, ("duckdb.connect(<warehouse>/polytrace.duckdb)",),
                                                   extras=("pytz",))
                                       for v in ("1.1.3", "1.5.6")}
# everything `install` and `info` handle, by the name `install` takes
ENVIRONMENTS: dict[str, Consumer] = {**CONSUMERS, **{f"duckdb-{v}": c for v, c in DUCKDB_CLIENTS.items()}}


def cache_root() -> Path:
    env = os.environ.get("POLYTRACE_CONFORMANCE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "polytrace-conformance"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _stamp(c: Consumer) -> Path:
    return c.env_dir / ".polytrace-installed"


def is_installed(c: Consumer) -> bool:
    s = _stamp(c)
    return c.python.exists() and s.exists() and json.loads(s.read_text()).get("lock_sha256") == c.lock_hash()


def _base_python() -> str:
    """A Python 3.11 to build the environment from (the one running us when it is 3.11)."""
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if not found:
        raise ConsumerUnavailable("no Python 3.11 to create the consumer environments with")
    return found


def ensure(c: Consumer, log: Path | None = None) -> Path:
    """The consumer's python, installing its environment first when needed (ConsumerUnavailable if impossible)."""
    if is_installed(c):
        return c.python
    with _locked(cache_root() / f".{c.name}-{c.version}.lock"):
        if is_installed(c):  # another process finished it while we waited
            return c.python
        shutil.rmtree(c.env_dir, ignore_errors=True)
        log = log or cache_root() / f"{c.name}-{c.version}.install.log"
        t0 = time.monotonic()
        steps = [[_base_python(), "-m", "venv", str(c.env_dir)],
                 [str(c.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
                  "-c", str(c.lock), c.requirement, *c.extras]]
        with open(log, "w") as fh:
            for cmd in steps:
                fh.write("$ " + " ".join(cmd) + "\n")
                fh.flush()
                try:
                    rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S,
                                        env=_clean_env()).returncode
                except subprocess.TimeoutExpired:
                    rc = -1
                if rc != 0:
                    shutil.rmtree(c.env_dir, ignore_errors=True)
                    tail = [ln for ln in log.read_text().splitlines() if not ln.startswith("WARNING: Location")][-15:]
                    raise ConsumerUnavailable(f"{c.requirement}: `{' '.join(cmd[:4])} ...` failed (rc {rc}); "
                                              f"log {log}:\n" + "\n".join(tail))
        _stamp(c).write_text(json.dumps({"lock_sha256": c.lock_hash(), "install_s": round(time.monotonic() - t0, 1),
                                         "size_mb": round(_size(c.env_dir) / 2**20)}))
        return c.python


def _size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _clean_env() -> dict[str, str]:
    """The environment minus what would leak the project into the consumer's interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1", WANDB_MODE="disabled", PYTHONDONTWRITEBYTECODE="1")
    return env


def run_driver(c: Consumer, jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The consumer's driver's verdicts over ``jobs`` (one each, in order): from the verdict cache when
    the same driver code under the same environment has judged files of the same bytes, else run."""
    python = ensure(c)
    fresh = fresh_verdicts()
    entry = cache_root() / "verdicts" / f"{c.name}-{c.version}-{_verdict_key(c, jobs)}.json"
    if not fresh and entry.is_file():
        try:
            cached = json.loads(entry.read_text())
            verdicts = _moved(cached["verdicts"], cached["paths"], _job_paths(jobs))
            measure(check="driver_cache", run=c.name, jobs=len(jobs), entry=entry.name)
            return verdicts
        except (OSError, ValueError, KeyError):  # a damaged entry is run again and rewritten
            pass
    verdicts = _run_driver(c, python, jobs)
    try:  # a cache that cannot be written only means the next run judges again
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"paths": _job_paths(jobs), "verdicts": verdicts}))
        os.replace(tmp, entry)
        _prune(entry.parent, f"{c.name}-{c.version}-")
    except OSError:
        pass
    return verdicts


def fresh_verdicts() -> bool:
    """Whether every driver runs whatever the verdict cache holds: ``$POLYTRACE_CONFORMANCE_FRESH`` set
    (not 0), or, when it is unset, under CI (``CI=true``): CI has each consumer judge the exports itself;
    a developer's ``make test`` reuses verdicts on unchanged bytes."""
    flag = os.environ.get(FRESH_ENV)
    if flag is not None and flag != "":
        return flag != "0"
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def measure(**fields: Any) -> None:
    """Log one measurement or verdict (a JSON line) for the end-of-run summary; a no-op outside one."""
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(fields, default=str) + "\n")


def _job_paths(jobs: Sequence[dict[str, Any]]) -> list[str]:
    """Every absolute path of an existing file or directory the jobs name, in job order."""
    return [v for job in jobs for _k, v in sorted(job.items()) if _is_path(v)]


def _is_path(v: Any) -> bool:
    return isinstance(v, str) and os.path.isabs(v) and os.path.exists(v)


def _digest(path: Path) -> str:
    """sha256 of a file's bytes, or of a directory's relative names and bytes (recursively)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for p in files:
        h.update(p.relative_to(path).as_posix().encode() + b"\0" if p != path else b"\0")
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def _verdict_key(c: Consumer, jobs: Sequence[dict[str, Any]]) -> str:
    """What a verdict depends on: the consumer's pinned environment, every driver source, each job with the
    files and directories it names replaced by their content (their paths change every test run)."""
    h = hashlib.sha256(json.dumps([c.requirement, c.extras, c.lock_hash(), sys.version_info[:2]]).encode())
    for p in sorted((HERE / "drivers").glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    norm = [{k: ("sha256:" + _digest(Path(v))) if _is_path(v) else v for k, v in sorted(job.items())} for job in jobs]
    h.update(json.dumps(norm, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _moved(verdicts: list[dict[str, Any]], old: list[str], new: list[str]) -> list[dict[str, Any]]:
    """Cached verdicts with the paths of the run that wrote them replaced by this run's (longest first, so
    a directory's path does not rewrite part of a longer one)."""
    text = json.dumps(verdicts)
    pairs = sorted({json.dumps(o)[1:-1]: json.dumps(n)[1:-1] for o, n in zip(old, new, strict=True)}.items(),
                   key=lambda kv: -len(kv[0]))
    # two steps through raw NUL marks (JSON text escapes every NUL of a value): a new path may contain an old one
    for i, (o, _n) in enumerate(pairs):
        text = text.replace(o, f"\x00{i}\x00")
    for i, (_o, n) in enumerate(pairs):
        text = text.replace(f"\x00{i}\x00", n)
    return json.loads(text)


def _prune(d: Path, prefix: str, keep: int = VERDICT_CACHE_KEEP) -> None:
    """Keep the newest ``keep`` entries of one consumer version."""
    entries = sorted(d.glob(prefix + "*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in entries[keep:]:
        p.unlink(missing_ok=True)


class _Server:
    """A consumer's driver serving batches of jobs (``<tool>_driver.py --serve``, drivers/verdicts.py) in its
    own temporary working directory, removed when it stops."""

    def __init__(self, c: Consumer, python: Path) -> None:
        self.name = c.driver.name
        self.cwd = tempfile.mkdtemp(prefix=f"conformance-{c.name}-")
        self.stderr = open(Path(self.cwd) / "stderr.log", "w+")  # a file: a chatty consumer never fills a pipe
        self.proc = subprocess.Popen([str(python), str(c.driver), "--serve"], cwd=self.cwd, env=_clean_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)

    def judge(self, jobs: Sequence[dict[str, Any]]) -> str:
        """The driver's line of verdicts for ``jobs``; DriverFailed when it dies or takes DRIVER_TIMEOUT_S."""
        reply: list[str] = []
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(list(jobs)) + "\n")
            self.proc.stdin.flush()
            reader = threading.Thread(target=lambda: reply.append(self.proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(DRIVER_TIMEOUT_S)
        except OSError:  # it died before reading the jobs
            pass
        if not reply or not reply[0]:
            self.stop()
            raise DriverFailed(f"{self.name} exited {self.proc.returncode} or timed out ({DRIVER_TIMEOUT_S} s) "
                               f"without verdicts:\n{self.tail()}")
        return reply[0]

    def tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-4000:]

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()
        shutil.rmtree(self.cwd, ignore_errors=True)


_SERVERS: dict[tuple[str, str], _Server] = {}  # (tool, version) -> its driver serving, for the rest of this process


@atexit.register
def stop_drivers() -> None:
    while _SERVERS:
        _SERVERS.popitem()[1].stop()


def _run_driver(c: Consumer, python: Path, jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``jobs`` through the consumer's driver: one process per consumer for this whole process
    (a test run's every batch), started on first use; a driver that failed is started afresh next time."""
    key = (c.name, c.version)
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = _Server(c, python)
    try:
        line = server.judge(jobs)
    except DriverFailed:
        _SERVERS.pop(key, None)
        raise
    try:
        verdicts = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DriverFailed(f"{server.name} printed no verdicts:\n{line[-2000:]}\n{server.tail()}") from exc
    if len(verdicts) != len(jobs):
        raise DriverFailed(f"{server.name}: {len(jobs)} jobs but {len(verdicts)} verdicts")
    return verdicts


def info() -> list[dict[str, Any]]:
    out = []
    for c in ENVIRONMENTS.values():
        row: dict[str, Any] = {"tool": c.name, "version": c.version, "env": str(c.env_dir), "installed": is_installed(c)}
        if row["installed"]:
            row.update(json.loads(_stamp(c).read_text()))
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cmd, names = (args[0] if args else "info"), args[1:]
    if cmd == "install":
        todo = [ENVIRONMENTS[n] for n in (names or ENVIRONMENTS)]

        def one(c: Consumer) -> str:
            t0 = time.monotonic()
            was = is_installed(c)
            ensure(c)
            return f"{c.name}=={c.version}: {'cached' if was else 'installed'} in {time.monotonic() - t0:.0f} s at {c.env_dir}"

        failed = 0
        with ThreadPoolExecutor(max_workers=len(todo) or 1) as ex:
            for c, fut in [(c, ex.submit(one, c)) for c in todo]:
                try:
                    print(fut.result(), flush=True)
                except ConsumerUnavailable as exc:
                    failed += 1
                    print(f"{c.name}: install failed: {exc}", file=sys.stderr, flush=True)
        return 1 if failed else 0
    if cmd == "info":
        print(json.dumps(info(), indent=1))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
