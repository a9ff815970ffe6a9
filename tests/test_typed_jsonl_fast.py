"""The fast path of typed JSON-lines decoding (one typed json_transform per line) against the
validating path (four JSON parses per line, a reason per bad line).

The rule: the fast path either declines a batch (None: the validating path decodes it) or gives
exactly what the validating path gives, and it declines every batch in which the validating path
rejects a line. Each quirk below is a way a typed read alone would silently accept a bad line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses.manifest import RunManifest
from analyses.readers import limits
from analyses.readers.base import FileContext
from analyses.readers.duck_polars import duck_source
from analyses.readers.polytrace_v2 import MULTITURN_FIELDS, PACKED_FIELDS, MultiturnWorkloadReader
from analyses.readers.typed_jsonl import Decoded, Field, _nonblank, decode_frame, fast_decode_frame

REAL = (Path(__file__).parents[2] / "shared" / "real_logs" / "polytrace" / "search_r1" / "profile"
        / "multiturn_workload_log" / "0617_0223" / "multiturn_workload_step_0.jsonl")

TURN = '{"turn": 0, "prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 5, "engine_latency_s": 1.5, "finish_reason": "stop"}'
TURN_STR = TURN.replace('"completion_tokens": 5', '"completion_tokens": "5"')
TURN_NEG = TURN.replace('"completion_tokens": 5', '"completion_tokens": -5')
TURN_NAN = TURN.replace("1.5", "NaN")
CALL = '{"turn": 0, "tool_name": "search", "latency_s": 0.1, "status": "success", "response_token_len": 7}'


def mt(i: int, **over: str) -> str:
    """A good multi-turn record (sample ``i``); ``over`` replaces values by raw JSON text."""
    vals = {"step": "0", "prompt_len": "10", "max_response_len": "100", "final_response_len": "5",
            "final_response_loss_len": "5", "turn_count": "1", "tool_call_count": "1",
            "finish_reason": '"stop"', "validate": "false", "prompt_group_id": "0", "sample_id": str(i),
            "turns": f"[{TURN}]", "tool_calls": f"[{CALL}]", "extra": '{"note": "x", "rle": [[1, 2]]}'}
    vals.update(over)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in vals.items() if v != "<absent>") + "}"


def frame(lines: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"line_no": range(1, len(lines) + 1), "line": lines},
                        schema={"line_no": pl.Int64, "line": pl.String})


def both(lines: list[str], fields: tuple[Field, ...] = MULTITURN_FIELDS) -> tuple[Decoded, Decoded | None]:
    """(validating path, fast path or None) on the same lines; checks the rule."""
    df = frame(lines)
    slow = decode_frame(df, fields, fast=False)
    src, skipped = _nonblank(df)
    fast = fast_decode_frame(src, fields, lines=df.height, skipped=skipped)
    if slow.rejects.height:
        assert fast is None, slow.rejects.to_dicts()
    if fast is not None:
        assert fast.ok.schema == slow.ok.schema
        assert fast.ok.equals(slow.ok)
        assert fast.rejects.equals(slow.rejects)
        assert (fast.lines, fast.skipped) == (slow.lines, slow.skipped)
    # decode_frame itself (fast first) always equals the validating path
    dec = decode_frame(df, fields)
    assert dec.ok.equals(slow.ok) and dec.rejects.equals(slow.rejects)
    return slow, fast


def test_conforming_batch_takes_the_fast_path() -> None:
    slow, fast = both([mt(i) for i in range(5)])
    assert fast is not None and fast.ok.height == 5


def test_blank_lines_and_byte_order_mark_are_still_fast() -> None:
    slow, fast = both(["\ufeff" + mt(0), "", "   ", mt(1)])
    assert fast is not None and fast.skipped == 2 and fast.ok["line_no"].to_list() == [1, 4]


@pytest.mark.skipif(not REAL.exists(), reason="real logs not available")
def test_real_search_r1_step_is_fast_despite_long_fraction_digits() -> None:
    # latency_s 0.0003092288970947265: 19 digits in a row, but a fraction's, not a huge integer
    lines = REAL.read_text().splitlines()[:200]
    slow, fast = both(lines)
    assert fast is not None and fast.ok.height == 200


@pytest.mark.parametrize(
    ("quirk", "over", "reason"),
    [
        ("int_given_as_string_of_digits", {"prompt_len": '"10"'}, "wrong type for prompt_len: VARCHAR"),
        ("int_given_as_fraction", {"prompt_len": "10.5"}, "wrong type for prompt_len: DOUBLE"),
        ("int_given_as_whole_fraction", {"prompt_len": "10.0"}, "wrong type for prompt_len: DOUBLE"),
        ("int_given_as_exponent", {"prompt_len": "1e1"}, "wrong type for prompt_len: DOUBLE"),
        ("int_given_as_bool", {"prompt_len": "true"}, "wrong type for prompt_len: BOOLEAN"),
        ("string_given_as_number", {"finish_reason": "1"}, "wrong type for finish_reason: UBIGINT"),
        ("bool_given_as_string", {"validate": '"true"'}, "wrong type for validate: VARCHAR"),
        ("sub_int_given_as_string", {"turns": f"[{TURN_STR}]"}, "wrong type for turns[].completion_tokens: VARCHAR"),
        ("list_given_as_object", {"tool_calls": CALL}, "wrong type for tool_calls: {"),
        ("element_not_an_object", {"turns": f"[{TURN}, 3]"}, "non-object element in turns"),
        ("list_of_objects_given_twice", {"extra": '1, "tool_calls": [1]'}, "non-object element in tool_calls"),
        ("optional_int_null_then_number", {"turn_count": "null", "extra": '1, "turn_count": 2'},
         "integer out of range: turn_count"),
        ("optional_int_past_bigint", {"turn_count": "9223372036854775808"}, "integer out of range: turn_count"),
        ("optional_int_past_ubigint", {"turn_count": "18446744073709551616"}, "wrong type for turn_count: DOUBLE"),
        ("key_spelled_with_unicode_escape", {"extra": '1, "turn_co\\u0075nt": "x"'}, "wrong type for turn_count"),
        ("nan_in_a_number_field", {"turns": f"[{TURN_NAN}]"}, None),
        ("required_field_missing", {"prompt_len": "<absent>"}, "missing field: prompt_len"),
        ("required_field_null", {"prompt_len": "null"}, "missing field: prompt_len"),
        ("negative_value", {"prompt_len": "-1"}, "negative value: prompt_len"),
        ("negative_sub_value", {"turns": f"[{TURN_NEG}]"}, "negative value: turns[].completion_tokens"),
        # JSON's whitespace (space, tab, CR) between a key and a wrong-typed value
        ("int_as_string_after_a_tab", {"prompt_len": '\t"10"'}, "wrong type for prompt_len: VARCHAR"),
        ("string_as_number_after_cr_and_spaces", {"finish_reason": "\r  1"}, "wrong type for finish_reason: UBIGINT"),
        ("key_spaced_from_its_colon", {"extra": '1, "validate"\t : "true"'}, "wrong type for validate"),
        # other Unicode spaces are no JSON whitespace: the line does not parse
        ("no_break_space_before_a_value", {"prompt_len": "\u00a010"}, "invalid JSON"),
        ("ideographic_space_before_the_colon", {"extra": '1, "validate"\u3000: "x"'}, "invalid JSON"),
    ],
)
def test_quirk_sends_the_batch_down_the_validating_path(quirk: str, over: dict[str, str], reason: str | None) -> None:
    lines = [mt(0), mt(1, **over), mt(2)]
    slow, fast = both(lines)
    if reason is None:  # no line is bad: the fast path may decline, the result is the same
        assert slow.rejects.height == 0, quirk
        return
    assert fast is None, quirk
    # (the validating path's own reason; the reason of a wrong-typed list quotes its structure)
    assert slow.rejects["line_no"].to_list() == [2], quirk
    assert slow.rejects["reason"].item().startswith(reason), quirk
    assert slow.ok["line_no"].to_list() == [1, 3]


def test_large_batch_goes_to_duckdb_as_string_views(monkeypatch: pytest.MonkeyPatch) -> None:
    # past ARROW_FROM_BYTES of text a batch is handed to DuckDB as an Arrow table of string views:
    # short strings inline in their view, long and multi-byte ones in the data buffer
    import analyses.readers.typed_jsonl as typed_jsonl

    monkeypatch.setattr(typed_jsonl, "ARROW_FROM_BYTES", 0)
    sources: list[object] = []

    def spy(df: pl.DataFrame, large: bool) -> object:
        sources.append(duck_source(df, large))
        return sources[-1]

    monkeypatch.setattr(typed_jsonl, "duck_source", spy)
    reasons = ['""', '"stop"', '"twelve bytes"', '"more than twelve bytes"', '"\u00e9t\u00e9 \u2713 done"', '"日本語の理由"']
    lines = [mt(i, finish_reason=reasons[i % len(reasons)]) for i in range(70)]  # past the 64 passed as a parameter
    slow, fast = both(lines)
    assert fast is not None and fast.ok.height == 70
    assert fast.ok["finish_reason"][5] == "日本語の理由"
    assert sources and all(type(s).__name__ == "Table" and str(s.schema.field("line").type) == "string_view"
                           for s in sources)


@pytest.mark.parametrize("line", ["null", "[1]", "7", '"s"', "{", '{"step": 0} x', " " + mt(9)])
def test_a_line_that_is_no_object_or_no_json_is_never_fast(line: str) -> None:
    slow, fast = both([mt(0), line])
    assert fast is None


def test_list_limits_and_int_list_elements() -> None:
    base = '{"step": 0, "local_index": %d, "input": 3, "output": %s}'
    ok = [base % (0, "[1, 2]"), base % (1, "[]")]
    assert both(ok, PACKED_FIELDS)[1] is not None
    for bad in ("[1, 2.5]", "[1, null]", '[1, "2"]', "[1, -2]", "[[1]]", "[1, true]", "[9223372036854775808]"):
        slow, fast = both([*ok, base % (2, bad)], PACKED_FIELDS)
        assert fast is None and slow.rejects.height == 1, bad
    with limits.override(max_list_items=2):
        slow, fast = both([*ok, base % (2, "[1, 2, 3]")], PACKED_FIELDS)
        assert fast is None and slow.rejects["reason"].str.starts_with("list too long").all()


def test_deep_or_large_lines_use_the_limits_of_the_validating_path() -> None:
    with limits.override(max_json_depth=3):
        slow, fast = both([mt(0)])  # turns[{...}] inside the record: depth 3; extra.rle: depth 4
        assert fast is None and slow.rejects["reason"].str.starts_with("json_too_deep").all()
    with limits.override(max_json_values=8):
        slow, fast = both([mt(0)])
        assert fast is None and slow.rejects["reason"].str.starts_with("json_too_large").all()


def test_file_whose_bad_line_forces_the_fallback_still_lands_the_rest(tmp_path: Path) -> None:
    # 40 good records and, on line 17, turns[].completion_tokens as a string: the fast path
    # declines the batch, the validating path rejects line 17 alone, the other 40 land
    lines = [mt(i) for i in range(41)]
    lines[16] = mt(16, turns=f"[{TURN_STR}]")
    p = tmp_path / "multiturn_workload_step_0.jsonl"
    p.write_text("\n".join(lines) + "\n")
    chunks = list(MultiturnWorkloadReader().read(FileContext("r", p, p.name, RunManifest())))
    assert sum(c.lines for c in chunks) == 41
    assert sum(c.rows_ok for c in chunks) == 40 and sum(c.rows_rejected for c in chunks) == 1
    rej = pl.concat([c.rejects for c in chunks if c.rejects is not None])
    assert rej.select("line_no", "reason").rows() == [(17, "wrong type for turns[].completion_tokens: VARCHAR")]
    samples = pl.concat([c.tables["samples"] for c in chunks])
    assert samples.height == 40 and 17 not in samples["line_no"].to_list()


@pytest.mark.parametrize("copies", [1, 40])  # up to 64 lines Python's json parses them, past that DuckDB
def test_both_decoders_of_the_fast_path_agree_with_the_validating_path(copies: int) -> None:
    lines = [mt(i, finish_reason='"a \\"quoted\\" \\\\ reason\\n"', turns=f"[{TURN}, {TURN}]", tool_calls="[]")
             for i in range(copies)] + [mt(copies, turn_count="<absent>", tool_calls="<absent>", validate="null")]
    slow, fast = both(lines)
    assert fast is not None and fast.ok["finish_reason"][0] == 'a "quoted" \\ reason\n'


@pytest.mark.parametrize("copies", [1, 40])
def test_repeated_scalar_key_keeps_the_first_value(copies: int) -> None:
    # DuckDB keeps the first of a repeated key, Python's json the last: the small-batch decoder
    # leaves such a batch to DuckDB, so the value is the validating path's either way
    lines = [mt(i, extra='1, "prompt_len": 11') for i in range(copies)]
    slow, fast = both(lines)
    assert fast is not None and fast.ok["prompt_len"].to_list() == [10] * copies
