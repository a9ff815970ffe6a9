"""Bounds on what one input may cost, in one place.

A reader streams, so memory is bounded by a batch, except where one *record* is large: a line
without a newline, a Kineto event that never closes, a wandb record, a whole-document format,
or a small gzip that inflates to gigabytes. These limits bound each of those; what exceeds one
is rejected (a record) or refused (a file) with a reason saying which limit, never held in
memory whole.

========================  ===========  =======================================================
limit                     default      what happens past it
========================  ===========  =======================================================
``max_line_bytes``        16 MiB       a line / Kineto event / wandb record that long is
                                       rejected (``line_too_long``), streamed past unread
``max_document_bytes``    32 MiB       a whole-document format (PolyTrace v1, Prometheus
                                       JSON) that large is refused as a file
``max_json_depth``        127          a JSON record nested deeper is rejected
                                       (``json_too_deep``): DuckDB's JSON functions stop at
                                       128 levels, Python's ``json`` at ~1000
``max_list_items``        65536        a PolyTrace record whose list (responses of a prompt,
                                       turns, indices) is longer is rejected
``max_json_values``       262144       a JSON-lines record with more values is rejected
                                       (``json_too_large``) before any parser sees it (a
                                       16 MiB array of 8M numbers took DuckDB 1.5 GB); so
                                       is a console step line of more ``key:value`` pairs
                                       (``too_many_values``)
``gzip_max_ratio``        200          a gzip (or tar.gz) file that inflates beyond
``gzip_min_cap_bytes``    256 MiB      ``max(gzip_max_ratio x compressed size,
                                       gzip_min_cap_bytes)`` is refused (a gzip bomb); real
                                       logs and traces compress 5-30x
========================  ===========  =======================================================

Why 16 MiB and not more: a line just under the limit is parsed whole, and the densest lines
cost many times their size (a console step line of 16 MiB holds 1.7M ``key:value`` pairs and
peaked at ~550 MB RSS before ``max_json_values`` bounded the pairs; at 64 MiB the same line
peaked at 1.6 GB). 16 MiB keeps every input of
the fuzz corpus under 1 GB; real records are far smaller (a verl step line is 4-15 KB, a Kineto
event a few hundred bytes).

Each can be set with an environment variable of the same name in capitals, prefixed
``POLYTRACE_`` (``POLYTRACE_MAX_LINE_BYTES=1048576``), read when a file is read; tests use
:func:`override`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_line_bytes: int = 16 * MiB
    max_document_bytes: int = 32 * MiB
    max_json_depth: int = 127
    max_list_items: int = 1 << 16
    max_json_values: int = 1 << 18
    gzip_max_ratio: int = 200
    gzip_min_cap_bytes: int = 256 * MiB

    def gzip_cap(self, compressed_bytes: int) -> int:
        """Most decompressed bytes a gzip file of ``compressed_bytes`` may inflate to."""
        return max(self.gzip_max_ratio * compressed_bytes, self.gzip_min_cap_bytes)


_override: Limits | None = None


_ENV_NAMES = tuple((f.name, f"POLYTRACE_{f.name.upper()}") for f in fields(Limits))
_from_env_cache: dict[tuple[str | None, ...], Limits] = {}


def _from_env() -> Limits:
    # asked for per file and per batch: built once per set of environment values (building it
    # cost ~0.2 ms, a sixth of sniffing a small step file)
    raws = tuple(os.environ.get(env) for _name, env in _ENV_NAMES)
    got = _from_env_cache.get(raws)
    if got is None:
        values = {}
        for (name, env), raw in zip(_ENV_NAMES, raws, strict=True):
            if raw:
                try:
                    values[name] = int(raw)
                except ValueError as exc:
                    raise ValueError(f"{env}={raw!r} is not an integer") from exc
        got = _from_env_cache[raws] = Limits(**values)
    return got


def current() -> Limits:
    """The limits in force: an :func:`override`, else the defaults with environment overrides."""
    return _override if _override is not None else _from_env()


@contextmanager
def override(**values: int) -> Iterator[Limits]:
    """Set some limits for the duration of a ``with`` block (tests, the fuzz harness)."""
    global _override
    before = _override
    _override = replace(current(), **values)
    try:
        yield _override
    finally:
        _override = before
