"""Missing prerequisites (real logs, an optional package, a browser): skip locally, fail under CI.

Under ``CI=true`` (or 1/yes) a test that cannot run must fail, so CI never passes on nothing.
"""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_or_fail(msg: str) -> None:
    """``pytest.fail(msg)`` under CI, ``pytest.skip(msg)`` elsewhere (never returns)."""
    if under_ci():
        pytest.fail(msg)
    pytest.skip(msg)
