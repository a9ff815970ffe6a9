"""Known export defects (issue 10): the conformance cases that fail today, each with the reason.

A case listed here is marked ``xfail(strict=True)``: the suite is green while the defect is there and turns
red the moment an export fix makes the case pass, so the fix must delete its line here. One registry:
``cases()`` is the only way a conformance test gets its parameters.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

ISSUE = "issue 10"


KNOWN_DEFECTS: dict[tuple[str, str], str] = {
    # (check, run id): what the consumer says today
    # not an export defect: the 20260610 run predates DAPO's filter log, so neither its recorded directory
    # (tests/conformance/test_upstream_model.py) nor anything fitted from it has dapo_filter_indices.jsonl
    ("v2_validates", "dapo-0610"): "the source run recorded no filter batches (its own directory fails the same "
                                   "check): missing dapo_filter_indices.jsonl",
}


def cases(check: str, keys: Iterable[str]) -> list[pytest.param]:  # type: ignore[valid-type]
    """``pytest.param(key)`` per key, xfail(strict) where ``(check, key)`` is a known defect."""
    out = []
    for k in keys:
        reason = KNOWN_DEFECTS.get((check, k))
        marks = [pytest.mark.xfail(strict=True, reason=f"{ISSUE}: {reason}")] if reason else []
        out.append(pytest.param(k, id=k, marks=marks))
    return out
