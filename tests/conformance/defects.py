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
    ("v2_validates", "dapo-0610"): "the DAPO config names dapo_filter_indices.jsonl; suite.py --validate: "
                                   "missing dapo_filter_indices.jsonl",
    ("v2_validates", "dapo-0614"): "the DAPO config names dapo_filter_indices.jsonl; suite.py --validate: "
                                   "missing dapo_filter_indices.jsonl",
    ("v2_validates", "search-r1"): "steps 0-1 only (the source run's step count); the config asks 0;1;2;3: "
                                   "missing multiturn_workload_step_2.jsonl, multiturn_workload_step_3.jsonl",
    ("v2_replay_vs_records", "search-r1"): "records omit generation_prompt_len, assistant_append_len, append_len "
                                           "(and response_loss_mask_rle): upstream's replay prefills 41.0% of the "
                                           "records' own prompt_tokens",
    ("v2_replay_vs_real", "search-r1"): "same missing replay fields: 40.4% of the real run's per-step prefill",
    ("mooncake_prefill", "search-r1"): "aiperf's multi-turn prefill per session is 102.0% of the real run's per "
                                       "trajectory: the generator's per-turn increments do not shrink with the "
                                       "trajectory's length as the real ones do (628 -> 551 tokens from 2 to 5 turns; "
                                       "generated 572 -> 603), so long trajectories prefill 5-6% too much",
}


def cases(check: str, keys: Iterable[str]) -> list[pytest.param]:  # type: ignore[valid-type]
    """``pytest.param(key)`` per key, xfail(strict) where ``(check, key)`` is a known defect."""
    out = []
    for k in keys:
        reason = KNOWN_DEFECTS.get((check, k))
        marks = [pytest.mark.xfail(strict=True, reason=f"{ISSUE}: {reason}")] if reason else []
        out.append(pytest.param(k, id=k, marks=marks))
    return out
