"""The PolyTrace spec: one versioned JSON file holding every fitted workload.

Layout (documented in docs/spec.md, machine-checked by ``analyses/export/spec.schema.json``)::

    {"polytrace_spec_version": "1.4", "generator": ..., "seed": 0,
     "source": {"runs": [...]},
     "workloads": {"<run_id>[/<task>]": {run_id, task, n_samples, steps_fitted, batch,
                                          variables, joint, drift}}}

The file is deterministic for given data and seed (no timestamps), so a spec can be diffed and
cached. Version 1.1 adds the step-level model (``drift.step_sd`` and its posterior fields,
``tool_latency_drift``), heavy-tailed steps (``extremes``, ``heavy_prob``), tool failure statuses
and ``selection``; 1.2 adds a filtering run's generation batches (``filter``: DAPO's dynamic
sampling); 1.3 the response tail's step-to-step model (``tail_sd``: a per-step tail-scale effect;
``heavy_persistence``, ``heavy_last``, ``last_step``: heavy steps as a persistent two-state chain);
1.4 workloads fitted from per-step summaries (``source``; per variable ``fitted_from``, ``statistics``,
``body``; knot ``levels``, ``spread_se``; ``batch.trajectory_response``; a ``binomial`` pmf; no
``prompt_tokens`` when the logs hold no prompt length).
Every addition is optional with a neutral default, so a 1.0 file still reads
and samples as it did (its ``p_cap`` point masses and mixture joints included). Another major
version is refused with one line naming it. ``validate_spec`` checks a document against the committed JSON Schema with a small
built-in validator (the subset of JSON Schema the schema uses), so no extra dependency is needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyses.atomic_output import write_text

SPEC_VERSION = "1.4"
SCHEMA_PATH = Path(__file__).with_name("spec.schema.json")
GENERATOR = "polytrace fit"


class SpecError(ValueError):
    """The document is not a valid PolyTrace spec."""


def build_spec(workloads: dict[str, dict[str, Any]], runs: list[str], seed: int = 0) -> dict[str, Any]:
    return {
        "polytrace_spec_version": SPEC_VERSION,
        "generator": GENERATOR,
        "seed": seed,
        "source": {"runs": sorted(runs)},
        "workloads": dict(sorted(workloads.items())),
    }


def workload_key(run_id: str, task: str | None, several_tasks: bool) -> str:
    return f"{run_id}/{task}" if several_tasks and task else run_id


def dumps(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=1, sort_keys=False, allow_nan=False) + "\n"


def write_spec(spec: dict[str, Any], path: Path) -> Path:
    errors = validate_spec(spec)
    if errors:
        raise SpecError("; ".join(errors[:5]))
    return write_text(path, dumps(spec))  # whole or absent: a killed fit never leaves half a spec


def read_spec(path: Path) -> dict[str, Any]:
    try:
        spec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not JSON ({exc})") from exc
    errors = validate_spec(spec)
    if errors:
        raise SpecError(f"{path}: " + "; ".join(errors[:5]))
    return spec


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate_spec(spec: Any) -> list[str]:
    """Every violation of the schema, as 'path: message' strings (empty when valid)."""
    version = spec.get("polytrace_spec_version") if isinstance(spec, dict) else None
    if isinstance(version, str) and version.split(".")[0] != SPEC_VERSION.split(".")[0]:
        # another major version: one line, not the schema's complaints about a layout it never had
        return [f"$.polytrace_spec_version: major version {version} is not {SPEC_VERSION} "
                f"(this polytrace reads {SPEC_VERSION.split('.')[0]}.x specs; refit with `polytrace fit`)"]
    schema = load_schema()
    errors: list[str] = []
    _check(spec, schema, schema, "$", errors)
    return errors


_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is_type(v: Any, t: str) -> bool:
    if t == "number":
        return isinstance(v, int | float) and not isinstance(v, bool)
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    return isinstance(v, _TYPES[t])


def _check(v: Any, s: dict[str, Any], root: dict[str, Any], path: str, errors: list[str]) -> None:
    if "$ref" in s:
        node: Any = root
        for part in s["$ref"].lstrip("#/").split("/"):
            node = node[part]
        _check(v, node, root, path, errors)
        return
    if "anyOf" in s and not any(_conforms(v, alt, root, path) for alt in s["anyOf"]):
        errors.append(f"{path}: matches none of the allowed shapes")
        return
    t = s.get("type")
    types = t if isinstance(t, list) else [t] if t is not None else []
    if types and not any(_is_type(v, x) for x in types):
        errors.append(f"{path}: expected {'/'.join(types)}, got {type(v).__name__}")
        return
    for keyword, check in _KEYWORDS:
        if keyword in s:
            errors.extend(f"{path}: {msg}" for msg in check(v, s[keyword]))
    if isinstance(v, dict):
        _check_object(v, s, root, path, errors)
    if isinstance(v, list) and "items" in s:
        for i, item in enumerate(v):
            _check(item, s["items"], root, f"{path}[{i}]", errors)


def _conforms(v: Any, s: dict[str, Any], root: dict[str, Any], path: str) -> bool:
    sub: list[str] = []
    _check(v, s, root, path, sub)
    return not sub


def _check_object(v: dict[str, Any], s: dict[str, Any], root: dict[str, Any], path: str, errors: list[str]) -> None:
    errors.extend(f"{path}: missing required key {k!r}" for k in s.get("required", []) if k not in v)
    props = s.get("properties", {})
    extra = s.get("additionalProperties", True)
    for k, sub_v in v.items():
        if k in props:
            _check(sub_v, props[k], root, f"{path}.{k}", errors)
        elif extra is False:
            errors.append(f"{path}: unexpected key {k!r}")
        elif isinstance(extra, dict):
            _check(sub_v, extra, root, f"{path}.{k}", errors)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# the value keywords of the schema: (keyword, check(value, the keyword's argument) -> messages)
_KEYWORDS: tuple[tuple[str, Callable[[Any, Any], list[str]]], ...] = (
    ("enum", lambda v, allowed: [] if v in allowed else [f"{v!r} not one of {allowed}"]),
    ("const", lambda v, c: [] if v == c else [f"must be {c!r}"]),
    ("minimum", lambda v, lo: [f"{v} < minimum {lo}"] if _is_number(v) and v < lo else []),
    ("maximum", lambda v, hi: [f"{v} > maximum {hi}"] if _is_number(v) and v > hi else []),
    ("pattern", lambda v, pat: [f"{v!r} does not match {pat}"] if isinstance(v, str) and not re.search(pat, v) else []),
    ("minItems", lambda v, n: [f"fewer than {n} items"] if isinstance(v, list) and len(v) < n else []),
)
