"""Per-run fit results kept beside the warehouse, so an unchanged run is never fitted twice.

Fitting a run (rolling-origin model selection) and scoring its fidelity cost seconds to minutes
per run, and the cross-run stage used to redo both for every run whenever any run arrived:
adding one run to a hundred cost a hundred fits. A result here is keyed by everything it
depends on, and by nothing else:

* the run's **content fingerprint** (``manifests/<run>.json`` ``info.fingerprint``: each input
  file's path and sha256, :func:`analyses.ingest.content_fingerprint`), so re-ingesting the
  same files elsewhere or again keeps the result, and any changed byte drops it;
* the run's **facts** from its ``runs`` row (task, caps, GPUs: ``run.toml`` is not an input file);
* the **code** that computes it: a digest of the sources of :mod:`analyses.fit` and
  :mod:`analyses.export`, so an upgrade that changes a fit never serves a stale one;
* the call's own parameters (``seed``, ``seeds``).

A run without a fingerprint (published before fingerprints existed) is always fitted. Files live
under ``<warehouse>/fits/cache/<run>/<what>.json`` and are written by atomic rename
(:func:`analyses.atomic_output.write_text`: a killed fit leaves no half entry, and its staging goes
at the next write); a file that cannot be read or whose key differs is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl

from analyses.atomic_output import write_text
from analyses.warehouse import read_published

CACHE_DIR = "fits/cache"
_CODE_PACKAGES = ("fit", "export")
_IGNORED_FACTS = ("source_dir", "n_files")  # where the run was read from does not change its fit


@lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over the sources of the packages a fit result depends on."""
    base = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for pkg in _CODE_PACKAGES:
        for p in sorted((base / pkg).rglob("*")):
            if p.suffix in (".py", ".json") and "__pycache__" not in p.parts:
                h.update(p.relative_to(base).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def run_key(root: Path, run_id: str, what: str, **params: Any) -> str | None:
    """The key of ``what`` computed for ``run_id`` with ``params``; None when the run has no
    content fingerprint (then nothing is cached)."""
    m = read_published(root, run_id)
    if m is None or not m.info.get("fingerprint") or "runs" not in m.tables:
        return None
    facts = pl.read_parquet([root / f.path for f in m.tables["runs"]]).drop(_IGNORED_FACTS, strict=False).to_dicts()
    doc = {"what": what, "fingerprint": m.info["fingerprint"], "facts": facts, "code": code_digest(),
           "params": params}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def cache_path(root: Path, run_id: str, what: str) -> Path:
    return root / CACHE_DIR / run_id / f"{what}.json"


def load(root: Path, run_id: str, what: str, key: str | None) -> Any | None:
    """The cached value when its key is ``key``; None otherwise."""
    if key is None:
        return None
    try:
        doc = json.loads(cache_path(root, run_id, what).read_text())
    except (OSError, ValueError):
        return None
    return doc.get("value") if isinstance(doc, dict) and doc.get("key") == key else None


def store(root: Path, run_id: str, what: str, key: str | None, value: Any) -> None:
    """Keep ``value`` under ``key`` (atomically replacing the run's previous one)."""
    if key is None:
        return
    write_text(cache_path(root, run_id, what), json.dumps({"key": key, "value": value}))


def is_fresh(root: Path, run_id: str, what: str, **params: Any) -> bool:
    """True when ``what`` for the run would come from the cache."""
    return load(root, run_id, what, run_key(root, run_id, what, **params)) is not None


def cached(root: Path, run_id: str, what: str, compute: Callable[[], Any], **params: Any) -> tuple[Any, bool]:
    """``compute()``'s value for the run, from the cache when its key matches: (value, was_cached).
    A computed value is stored as JSON and returned as read back, so a hit and a miss give the
    caller the same types."""
    key = run_key(root, run_id, what, **params)
    hit = load(root, run_id, what, key)
    if hit is not None:
        return hit, True
    value = json.loads(json.dumps(compute(), default=_jsonable))
    store(root, run_id, what, key, value)
    return value, False


def _jsonable(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
