"""Outputs that appear whole or not at all: export directories, the report and its PNG directory,
spec files, fit-cache entries, ``fidelity.json``.

A directory is written into a private staging directory beside it (``.<name>.<random>.partial``)
and moved in by one ``rename``: to replace an existing one, Linux's ``renameat2(RENAME_EXCHANGE)``
swaps the two in one step and the old one is removed afterwards (where the exchange is not
supported, the old one is renamed aside first: the output is then briefly absent, never partial).
A file is written to ``.<name>.<random>.partial`` beside it and renamed over it.

Each staging entry is held under an exclusive ``flock`` for as long as its writer lives (the
kernel drops it when the process dies, however it dies), so the next writer of the same output
removes the staging left by dead writers and never touches a live one's. The writer takes the
lock before it writes anything, and creates and locks its entry while it holds an exclusive
``flock`` on the parent directory, which the cleaner takes too: so an entry the cleaner finds unlocked
is a dead writer's, even an empty one killed between its ``mkstemp`` and its ``flock``. Where the
parent cannot be opened for the lock, an unlocked empty entry is removed only once it is older than
:data:`EMPTY_STALE_S`.

A directory polytrace wrote carries a :data:`MARKER` file, so that an existing directory is replaced
only when polytrace wrote it, or it is empty, or the caller owns the location (the warehouse's
``exports/``): ``--out ~`` must never swap a home directory away.

Whole or absent holds against a killed process; files are not fsynced one by one, so after a
power loss an output renamed in just before it may hold empty files.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

MARKER = ".polytrace-output"  # no .json suffix: formats whose consumers glob *.json must not see it
SUFFIX = ".partial"
EMPTY_STALE_S = 60.0
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class OutputRefused(Exception):
    """The output location cannot be replaced (it holds files polytrace did not write, or is a file)."""


class WriteFailed(Exception):
    """Writing an output or the warehouse failed on the writing side (no space, read-only, I/O error):
    not a problem of any input. One line: ``no space left on <path>`` for a full disk."""

    def __init__(self, path: Path | str, code: int | None, detail: str = "") -> None:
        self.path, self.errno = str(path), code
        if code in (errno.ENOSPC, errno.EDQUOT):
            msg = f"no space left on {path}" + (" (disk quota exceeded)" if code == errno.EDQUOT else "")
        else:
            why = os.strerror(code) if code else (detail.splitlines()[0][:200] if detail else "I/O error")
            msg = f"cannot write {path}: {why}"
        super().__init__(msg)


_OS_ERROR_TEXT = {
    "no space left on device": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT,
    "read-only file system": errno.EROFS,
    "input/output error": errno.EIO,
}


def os_error_code(exc: BaseException) -> int | None:
    """The OS error behind ``exc``, if it is one: an ``OSError``'s errno, or the errno Polars
    (``... (os error 28)``) and DuckDB (``... No space left on device``) put in their messages."""
    if isinstance(exc, OSError):
        return exc.errno or errno.EIO
    text = str(exc).lower()
    m = re.search(r"os error (\d+)", text)
    if m:
        return int(m.group(1))
    for needle, code in _OS_ERROR_TEXT.items():
        if needle in text:
            return code
    return None


@contextmanager
def writing(where: Path | str) -> Iterator[None]:
    """Run a write to ``where``; an OS-level failure (``OSError``, or a Polars / DuckDB error that
    carries one) becomes :class:`WriteFailed` naming ``where``; other errors pass unchanged."""
    try:
        yield
    except WriteFailed:
        raise
    except Exception as exc:
        code = os_error_code(exc)
        if code is None or isinstance(exc, FileNotFoundError):
            raise
        raise WriteFailed(where, code, str(exc)) from exc


# ---------------------------------------------------------------- stale staging


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def try_lock(path: Path) -> int | None:
    """An fd holding ``path``'s exclusive lock (a file or a directory), or None when someone else
    holds it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


@contextmanager
def _creating(parent: Path) -> Iterator[bool]:
    """The parent directory's exclusive lock, held while a staging entry is created and locked or
    while stale entries are judged; yields False when the directory cannot be opened for it."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # closing drops the lock


def _abandoned(entry: Path, serialized: bool) -> bool:
    """Whether a staging entry whose lock we hold is a dead writer's (see the module notes)."""
    if serialized:
        return True
    try:
        st = entry.lstat()
    except OSError:
        return False
    has_content = (entry / MARKER).exists() if entry.is_dir() else st.st_size > 0
    return has_content or time.time() - st.st_mtime > EMPTY_STALE_S


def clean_stale(parent: Path, name: str) -> list[Path]:
    """Remove the staging entries of ``parent/name`` whose writers are dead; returns them."""
    removed = []
    pattern = re.compile(rf"\.{re.escape(name)}\.[A-Za-z0-9_]+{re.escape(SUFFIX)}")
    try:
        entries = [e for e in parent.iterdir() if pattern.fullmatch(e.name)]
    except OSError:
        return removed
    if not entries:
        return removed
    with _creating(parent) as serialized:
        for e in entries:
            removed += _remove_if_dead(e, serialized)
    return removed


def _remove_if_dead(e: Path, serialized: bool) -> list[Path]:
    fd = try_lock(e)
    if fd is None:
        return []  # its writer is alive
    try:
        if not _abandoned(e, serialized):
            return []
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e, ignore_errors=True)
        else:
            e.unlink(missing_ok=True)
        return [e]
    finally:
        os.close(fd)


# ---------------------------------------------------------------- files


@contextmanager
def staged_file(path: Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """A file object writing a private file beside ``path``; renamed over ``path`` when the block
    ends without an error, removed when it raises. Dead writers' leftovers are removed first."""
    path = Path(path)
    parent = path.parent
    with writing(parent):
        parent.mkdir(parents=True, exist_ok=True)
        clean_stale(parent, path.name)
        with _creating(parent):
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=SUFFIX, dir=parent)
            fcntl.flock(fd, fcntl.LOCK_EX)
    os.fchmod(fd, 0o666 & ~_umask())
    fh = os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None)
    try:
        with writing(path):
            yield fh
            fh.flush()
            os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):  # closing flushes what is buffered: on a full disk that fails again
            fh.close()
        Path(tmp).unlink(missing_ok=True)
        raise
    fh.close()  # after the rename: the lock is held until the file has its name


def write_text(path: Path, text: str) -> Path:
    """``path`` replaced by ``text`` in one rename (see :func:`staged_file`)."""
    with staged_file(path) as fh:
        fh.write(text)
    return Path(path)


# ---------------------------------------------------------------- directories


@dataclass
class StagedDir:
    """A directory being written; ``keep = False`` drops it instead of moving it in."""

    path: Path
    out: Path
    keep: bool = True


def _replaceable(out: Path, owned: bool) -> None:
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise OutputRefused(f"{out} exists and is not a directory: give a directory to write")
    if owned or (out / MARKER).is_file() or not any(out.iterdir()):
        return
    raise OutputRefused(f"{out} exists and holds files polytrace did not write: give a new or empty directory "
                        "(or remove it)")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where that is not supported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _move_in(stage: Path, out: Path) -> None:
    """``stage`` becomes ``out`` in one rename; an ``out`` already there is swapped out and removed."""
    while True:
        if not os.path.lexists(out):
            try:
                os.rename(stage, out)
                return
            except OSError as exc:  # another writer's output landed first: replace it below
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        if _exchange(stage, out):
            shutil.rmtree(stage, ignore_errors=True)  # now the old output; a crash here leaves it to clean_stale
            return
        aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=SUFFIX, dir=out.parent))
        try:
            os.rename(out, aside)  # onto an empty directory: allowed
        except FileNotFoundError:
            aside.rmdir()
            continue
        os.rename(stage, out)
        shutil.rmtree(aside, ignore_errors=True)
        return


@contextmanager
def staged_dir(out: Path, what: str, owned: bool = False) -> Iterator[StagedDir]:
    """A private directory beside ``out`` to write into; when the block ends without an error (and
    ``keep`` stays True) it becomes ``out`` in one rename, replacing what was there. Refused
    (:class:`OutputRefused`, before anything is written) when ``out`` exists and is neither empty
    nor written by polytrace, unless ``owned``. Dead writers' staging beside ``out`` goes first."""
    out = Path(os.path.abspath(out))
    parent = out.parent
    with writing(parent):
        parent.mkdir(parents=True, exist_ok=True)
        clean_stale(parent, out.name)
    _replaceable(out, owned)
    with writing(parent), _creating(parent):
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=SUFFIX, dir=parent))
        fd = os.open(stage, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with writing(parent):
            os.chmod(stage, 0o777 & ~_umask())
            (stage / MARKER).write_text(json.dumps({
                "written_by": "polytrace", "what": what, "pid": os.getpid(), "host": socket.gethostname(),
                "at": datetime.now(UTC).isoformat(timespec="seconds")}) + "\n")
        handle = StagedDir(stage, out)
        yield handle
        if handle.keep:
            _replaceable(out, owned)  # again: something may have been put there meanwhile
            with writing(out):
                _move_in(stage, out)
        else:
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        with suppress(OSError):
            os.close(fd)
