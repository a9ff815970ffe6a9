"""A spec's bytes do not depend on the order Polars' group_by yields its groups (issue 29: two
demo runs of one commit wrote the multi-turn spec's ``completion_by_turns`` in different orders)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from analyses.fit.workload import fit_by_turns


def test_completion_by_turns_is_written_in_one_order():
    rng = np.random.default_rng(0)
    n = 240
    samples = pl.DataFrame({"step": np.zeros(n, np.int64), "sample_id": np.arange(n), "n_turns": 2 + np.arange(n) % 2})
    rows = [(i, t, float(rng.integers(20, 200))) for i in range(n) for t in range(2 + i % 2)]
    turns = pl.DataFrame({"step": np.zeros(len(rows), np.int64), "sample_id": [r[0] for r in rows],
                          "turn": [r[1] for r in rows], "completion_tokens": [r[2] for r in rows]})
    outs = {json.dumps(fit_by_turns(samples, t, None)) for t in (turns, turns.reverse(), turns.sample(fraction=1.0, shuffle=True, seed=1))}
    assert len(outs) == 1
    doc = json.loads(outs.pop())["completion_by_turns"]
    assert list(doc) == ["2", "3"] and all(list(v) == ["final", "tool_turn"] for v in doc.values())
