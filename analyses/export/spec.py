"""The PolyTrace spec: one versioned JSON file holding every fitted workload.

Layout (documented in docs/spec.md, machine-checked by ``analyses/export/spec.schema.json``)::

    {"polytrace_spec_version": "1.3", "generator": ..., "seed": 0,
     "source": {"runs": [...]},
     "workloads": {"<run_id>[/<task>]": {run_id, task, n_samples, steps_fitted, batch,
                                          variables, joint, drift}}}

The file is deterministic for given data and seed (no timestamps), so a spec can be diffed and
cached. Version 1.1 adds the step-level model (``drift.step_sd`` and its posterior fields,
``tool_latency_drift``), heavy-tailed steps (``extremes``, ``heavy_prob``), tool failure statuses
and ``selection``; 1.2 adds a filtering run's generation batches (``filter``: DAPO's dynamic
sampling); 1.3 the response tail's step-to-step model (``tail_sd``: a per-step tail-scale effect;
``heavy_persistence``, ``heavy_last``, ``last_step``: heavy steps as a persistent two-state chain).
Every addition is optional with a neutral default, so a 1.0 file still reads
and samples as it did (its ``p_cap`` point masses and mixture joints included). Another major
version is refused with one line naming it. ``validate_spec`` checks a document against the committed JSON Schema with a small
built-in validator (the subset of JSON Schema the schema uses), so no extra dependency is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC_VERSION = "1.3"
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(spec))
    return path


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
        ref = s["$ref"]
        node: Any = root
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        _check(v, node, root, path, errors)
        return
    if "anyOf" in s:
        for alt in s["anyOf"]:
            sub: list[str] = []
            _check(v, alt, root, path, sub)
            if not sub:
                break
        else:
            errors.append(f"{path}: matches none of the allowed shapes")
            return
    t = s.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_is_type(v, x) for x in types):
            errors.append(f"{path}: expected {'/'.join(types)}, got {type(v).__name__}")
            return
    if "enum" in s and v not in s["enum"]:
        errors.append(f"{path}: {v!r} not one of {s['enum']}")
    if "const" in s and v != s["const"]:
        errors.append(f"{path}: must be {s['const']!r}")
    if isinstance(v, int | float) and not isinstance(v, bool):
        if "minimum" in s and v < s["minimum"]:
            errors.append(f"{path}: {v} < minimum {s['minimum']}")
        if "maximum" in s and v > s["maximum"]:
            errors.append(f"{path}: {v} > maximum {s['maximum']}")
    if isinstance(v, str) and "pattern" in s:
        import re

        if not re.search(s["pattern"], v):
            errors.append(f"{path}: {v!r} does not match {s['pattern']}")
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                errors.append(f"{path}: missing required key {k!r}")
        props = s.get("properties", {})
        for k, sub_v in v.items():
            if k in props:
                _check(sub_v, props[k], root, f"{path}.{k}", errors)
            elif "additionalProperties" in s:
                ap = s["additionalProperties"]
                if ap is False:
                    errors.append(f"{path}: unexpected key {k!r}")
                elif isinstance(ap, dict):
                    _check(sub_v, ap, root, f"{path}.{k}", errors)
    if isinstance(v, list):
        if "minItems" in s and len(v) < s["minItems"]:
            errors.append(f"{path}: fewer than {s['minItems']} items")
        if "items" in s:
            for i, item in enumerate(v):
                _check(item, s["items"], root, f"{path}[{i}]", errors)
