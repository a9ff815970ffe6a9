"""The vectorized JSON structure scan: streamed block by block with the state carried over, it
gives exactly the structure of the whole buffer (escapes and strings across block boundaries
included); depth limits find the records nested too deep."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest

from analyses.readers.json_scan import ScanState, max_depth, structure, too_deep

_ALPHABET = b'{}[]"\\\\\\,: ab1\n'


def _blocks(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@pytest.mark.parametrize("seed", range(200))
def test_streamed_scan_equals_whole_scan(seed: int) -> None:
    rng = random.Random(seed)
    data = bytes(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 120)))
    whole = structure(np.frombuffer(data, dtype=np.uint8))
    cuts = [rng.randint(0, len(data)) for _ in range(rng.randint(0, 6))]
    state, outside, brackets, depth, at = ScanState(), [], [], [], 0
    for block in _blocks(data, cuts):
        st = structure(np.frombuffer(block, dtype=np.uint8), state)
        outside.append(st.outside)
        brackets.append(st.brackets + at)
        depth.append(st.depth)
        state, at = st.end, at + len(block)
    assert np.array_equal(np.concatenate(outside) if outside else np.zeros(0, bool), whole.outside)
    assert np.array_equal(np.concatenate(brackets) if brackets else np.zeros(0), whole.brackets)
    assert np.array_equal(np.concatenate(depth) if depth else np.zeros(0), whole.depth)
    assert state == whole.end


def test_escaped_quotes_and_backslash_runs() -> None:
    # "a\"{" is one string; "b\\" ends after two backslashes, so the { after it counts
    data = rb'["a\"{", "b\\", {}]'
    assert max_depth(data) == 2
    st = structure(np.frombuffer(data, dtype=np.uint8))
    assert st.end == ScanState(False, False, 0)


def test_too_deep_counts_levels_outside_strings_only() -> None:
    lines = pl.DataFrame({"line": [
        '{"a": "' + "{" * 500 + '"}',  # braces inside a string: depth 1
        "[" * 128 + "]" * 128,  # 128 levels
        "[" * 127 + "]" * 127,  # 127 levels: the limit itself is fine
        '{"x": 1}',
    ]})
    assert too_deep(lines, 127).to_list() == [False, True, False, False]


def test_too_complex_counts_values_outside_strings() -> None:
    from analyses.readers.json_scan import REASON_TOO_MANY, too_complex

    lines = pl.DataFrame({"line": [
        '{"output": [' + ",".join(["1"] * 10) + "]}",  # 10 values in the list: at the limit
        '{"output": [' + ",".join(["1"] * 11) + "]}",  # 11: over
        '{"text": "' + "," * 50 + '"}',  # commas inside a string are no values
    ]})
    assert too_complex(lines, 127, 10).to_list() == [None, REASON_TOO_MANY.format(10), None]


def test_document_shape_counts_depth_and_values_outside_strings() -> None:
    from analyses.readers.json_scan import document_shape

    # by hand: {"a": [1, 2, {"b": "x,y"}], "c": 3} -> depth 3 ({ [ {), commas outside strings 3 -> 4 values
    assert document_shape(b'{"a": [1, 2, {"b": "x,y"}], "c": 3}') == (3, 4)
    assert document_shape(b"7") == (0, 1)
    assert document_shape(b'"[[[,,,"') == (0, 1)  # brackets and commas inside a string do not count


def test_a_record_too_wide_to_flatten_is_refused_before_a_parser_sees_it(monkeypatch) -> None:
    import analyses.readers.json_scan as js

    # budget 100 bytes: a 4-value record of 29 bytes (116 > 100) is too wide, a 2-value one (2 x 15) is not
    monkeypatch.setattr(js, "FLATTEN_BUDGET_BYTES", 100)
    lines = pl.DataFrame({"line": ['{"a": 1, "b": 2, "c": [3, 4]}', '{"a": 1, "b": 2}']})
    assert js.too_complex(lines, 127, 1000).to_list() == [
        "json_too_large: 4 values in a record of 29 bytes (over 0 MiB flattened)", None]
