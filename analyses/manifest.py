"""Run manifests: the optional ``run.toml`` that says what logs do not (task, model, limits)."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MANIFEST_NAME = "run.toml"
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
    started_at: datetime | None = None
    tokenizer: str | None = None  # path to a local tokenizer.json, relative to the run dir
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


def _as_datetime(v: Any) -> datetime | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=UTC)
    if isinstance(v, str):
        dt = datetime.fromisoformat(v)
        return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    if isinstance(v, int | float):
        return datetime.fromtimestamp(v, tz=UTC)
    raise ManifestError(f"started_at: cannot read {v!r} as a time")


def _as_int(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ManifestError(f"{name}: expected an integer, got {v!r}")
    return v


KNOWN_KEYS = {
    "run_id", "task", "framework", "model", "n_gpus", "max_response_length", "max_prompt_length",
    "started_at", "tokenizer", "tags",
}


def load_manifest(run_dir: Path) -> RunManifest:
    """Read ``run_dir/run.toml`` when present; unknown top-level keys land in ``tags``."""
    path = run_dir / MANIFEST_NAME if run_dir.is_dir() else run_dir.parent / MANIFEST_NAME
    base = run_dir if run_dir.is_dir() else run_dir.parent
    if not run_dir.is_dir() or not path.exists():
        return RunManifest(base_dir=base)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from exc
    tags = dict(data.get("tags") or {})
    tags.update({k: v for k, v in data.items() if k not in KNOWN_KEYS})
    return RunManifest(
        run_id=data.get("run_id"),
        task=data.get("task"),
        framework=data.get("framework"),
        model=data.get("model"),
        n_gpus=_as_int("n_gpus", data.get("n_gpus")),
        max_response_length=_as_int("max_response_length", data.get("max_response_length")),
        max_prompt_length=_as_int("max_prompt_length", data.get("max_prompt_length")),
        started_at=_as_datetime(data.get("started_at")),
        tokenizer=data.get("tokenizer"),
        tags=tags,
        base_dir=base,
    )


def sanitize_run_id(raw: str) -> str:
    """A run id safe as a hive partition value: letters, digits, ``._-``; others become ``_``."""
    s = _RUN_ID_BAD.sub("_", raw).strip("._")
    if not s:
        raise ValueError(f"run id {raw!r} has no usable characters")
    return s
