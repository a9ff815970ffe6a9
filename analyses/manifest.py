"""Run manifests: the optional ``run.toml`` that says what logs do not (task, model, limits)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MANIFEST_NAME = "run.toml"
# The one rule for a run id, shared by the CLI, run.toml, directory names and the Dagster sensor:
# it is a hive partition value, a file name and a Dagster partition key, so letters, digits and
# ``._-`` only, starting with a letter or digit (no ``.``/``..``, no hidden names), no ``..`` inside
# (Dagster refuses ``...`` in a partition key), at most 128.
RUN_ID_MAX = 128
RUN_ID_RULE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_ID_MAX - 1}}}")
_RUN_ID_BAD = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RunManifest:
    """What ``run.toml`` declares; every field optional."""

    run_id: str | None = None
    task: str | None = None
    framework: str | None = None
    model: str | None = None
    n_gpus: int | None = None
    max_response_length: int | None = None
    max_prompt_length: int | None = None
    train_batch_size: int | None = None  # prompts per step (what a fit from per-step summaries needs)
    rollout_n: int | None = None  # responses per prompt
    started_at: datetime | None = None
    tokenizer: str | None = None  # path to a local tokenizer.json, relative to the run dir
    split: str | None = None  # how a directory of several logs becomes runs (analyses.run_split)
    tags: dict[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None

    @property
    def tags_json(self) -> str:
        return json.dumps(self.tags, sort_keys=True, default=str)

    def tokenizer_path(self) -> Path | None:
        if not self.tokenizer:
            return None
        p = Path(self.tokenizer)
        if not p.is_absolute() and self.base_dir is not None:
            p = self.base_dir / p
        return p


class ManifestError(ValueError):
    """run.toml exists but cannot be used."""


class RunIdError(ValueError):
    """A run id that breaks the rule (see :data:`RUN_ID_RULE`)."""


def validate_run_id(run_id: object, what: str = "run id") -> str:
    """``run_id`` when it follows the rule; :class:`RunIdError` with one line otherwise."""
    if not isinstance(run_id, str):
        raise RunIdError(f"{what} must be a string, got {run_id!r}")
    if not RUN_ID_RULE.fullmatch(run_id) or ".." in run_id:
        shown = run_id if len(run_id) <= 40 else run_id[:37] + "..."
        raise RunIdError(f"{what} {shown!r} is not allowed: use letters, digits and . _ - (no '..'), starting with a "
                         f"letter or digit, at most {RUN_ID_MAX} characters")
    return run_id


def _as_datetime(v: Any) -> datetime | None:
    if v is None:
        return None
    try:
        if isinstance(v, datetime):
            return v if v.tzinfo else v.replace(tzinfo=UTC)
        if isinstance(v, str):
            dt = datetime.fromisoformat(v)
            return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return datetime.fromtimestamp(v, tz=UTC)
    except (ValueError, OverflowError, OSError):
        pass
    raise ManifestError(f"started_at: cannot read {v!r} as a time (ISO 8601 or epoch seconds)")


def _as_str(name: str, v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise ManifestError(f"{name}: expected a string, got {v!r}")


def _as_int(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 2**53:
        raise ManifestError(f"{name}: expected a positive integer, got {v!r}")
    return v


KNOWN_KEYS = {
    "run_id", "task", "framework", "model", "n_gpus", "max_response_length", "max_prompt_length",
    "train_batch_size", "rollout_n", "started_at", "tokenizer", "split", "tags",
}
SPLIT_MODES = ("auto", "none", "each")


def load_manifest(run_dir: Path) -> RunManifest:
    """Read ``run_dir/run.toml`` when present; unknown top-level keys land in ``tags``."""
    path = run_dir / MANIFEST_NAME if run_dir.is_dir() else run_dir.parent / MANIFEST_NAME
    base = run_dir if run_dir.is_dir() else run_dir.parent
    if not run_dir.is_dir() or not (path.exists() or path.is_symlink()):
        return RunManifest(base_dir=base)
    import tomllib  # only for a run.toml (~1.5 ms of imports an ingest without one need not pay)

    try:
        if not path.is_file():
            raise ManifestError("not a regular file")
        if not _inside(path, base):
            raise ManifestError("a symlink out of the run directory")
        return _from_toml(tomllib.loads(path.read_text(encoding="utf-8")), base)
    except (ManifestError, tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ManifestError(f"{path}: {exc}") from None


def _inside(path: Path, base: Path) -> bool:
    """Whether ``path``'s real location is inside ``base``'s (symlinks resolved)."""
    try:
        return path.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _from_toml(data: dict[str, Any], base: Path) -> RunManifest:
    tags = data.get("tags") or {}
    if not isinstance(tags, dict):
        raise ManifestError(f"tags: expected a table ([tags]), got {tags!r}")
    tags = {**tags, **{k: v for k, v in data.items() if k not in KNOWN_KEYS}}
    run_id = data.get("run_id")
    if run_id is not None:
        try:
            validate_run_id(run_id, "run_id")
        except RunIdError as exc:
            raise ManifestError(str(exc)) from exc
    tokenizer = _as_str("tokenizer", data.get("tokenizer"))
    if tokenizer is not None and not _inside(base / tokenizer, base):
        raise ManifestError(f"tokenizer: {tokenizer!r} is outside the run directory")
    return RunManifest(
        run_id=run_id,
        task=_as_str("task", data.get("task")),
        framework=_as_str("framework", data.get("framework")),
        model=_as_str("model", data.get("model")),
        n_gpus=_as_int("n_gpus", data.get("n_gpus")),
        max_response_length=_as_int("max_response_length", data.get("max_response_length")),
        max_prompt_length=_as_int("max_prompt_length", data.get("max_prompt_length")),
        train_batch_size=_as_int("train_batch_size", data.get("train_batch_size")),
        rollout_n=_as_int("rollout_n", data.get("rollout_n")),
        started_at=_as_datetime(data.get("started_at")),
        tokenizer=tokenizer,
        split=_as_split(data.get("split")),
        tags=tags,
        base_dir=base,
    )


def _as_split(v: Any) -> str | None:
    if v is None or v in SPLIT_MODES:
        return v
    raise ManifestError(f"split: expected one of {', '.join(SPLIT_MODES)}, got {v!r}")


def run_id_from_name(name: str) -> str:
    """The run id a directory or file name gives: characters outside the rule become ``_``,
    leading/trailing ``._`` go; :class:`RunIdError` when nothing usable is left or it is too long."""
    s = re.sub(r"\.{2,}", ".", _RUN_ID_BAD.sub("_", name)).strip("._-")
    if not s:
        raise RunIdError(f"the name {name!r} has no characters usable as a run id (give --run-id or run_id in run.toml)")
    return validate_run_id(s)
