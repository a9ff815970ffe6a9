"""The consumer drivers on small hand-written files: each accepts what its consumer documents and refuses,
with the consumer's own message, what it rejects. Proves a verdict on an export means something."""

from __future__ import annotations

import json
from pathlib import Path

import consumers
import pytest

pytestmark = pytest.mark.xdist_group("conformance")


def _one(c: consumers.Consumer, check: str, path: Path, **kw: str) -> dict:
    return consumers.run_driver(c, [{"check": check, "file": str(path), **kw}])[0]


def test_environments_are_the_pinned_versions_outside_the_project(aiperf: consumers.Consumer,
                                                                  vidur: consumers.Consumer) -> None:
    for c in (aiperf, vidur):
        assert consumers.is_installed(c)
        assert c.env_dir.is_relative_to(consumers.cache_root())
        assert f"{c.name}=={c.version}" in c.lock.read_text().splitlines()


def test_aiperf_sequence_distribution(aiperf: consumers.Consumer, tmp_path: Path) -> None:
    good, bad, js = tmp_path / "good.txt", tmp_path / "bad.txt", tmp_path / "d.json"
    good.write_text("256|10,128|5:40;512,256:60\n")
    bad.write_text("256,128:40;512,256:59.999")
    js.write_text(json.dumps({"pairs": [{"isl": 100, "isl_stddev": 0, "osl": 10, "osl_stddev": 0, "prob": 50.001},
                                        {"isl": 200, "isl_stddev": 5, "osl": 20, "osl_stddev": 1, "prob": 50}]}))
    vs = consumers.run_driver(aiperf, [{"check": "sequence_distribution", "file": str(p)} for p in (good, bad, js)])
    assert vs[0]["ok"] and vs[0]["pairs"] == 2 and vs[0]["expected_isl"] == pytest.approx(409.6)
    assert not vs[1]["ok"] and "Probabilities must sum to 100.0, got 99.999000" in vs[1]["error"]
    assert not vs[2]["ok"] and "got 100.001000" in vs[2]["error"]


def test_aiperf_mooncake_sessions_and_prefill(aiperf: consumers.Consumer, tmp_path: Path) -> None:
    p = tmp_path / "trace.jsonl"
    rows = [{"session_id": "a", "timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},
            {"session_id": "a", "timestamp": 5, "input_length": 100, "output_length": 20, "hash_ids": [3]},
            {"timestamp": 7, "input_length": 50, "output_length": 5}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    v = _one(aiperf, "mooncake", p)
    assert v["ok"], v["error"]
    assert (v["traces"], v["sessions"], v["multi_turn_sessions"], v["turns_built"]) == (3, 2, 1, 3)
    # session a: 600, then 600 + 10 (its response) + 100; the single-turn session: 50
    assert v["multiturn_prefill_tokens"] == 600 + 710 + 50
    assert v["timestamps_integer_ms"] and v["timestamps_non_decreasing"]


def test_aiperf_mooncake_refusals(aiperf: consumers.Consumer, tmp_path: Path) -> None:
    reused = tmp_path / "reused_block.jsonl"  # one hash id for blocks of two sizes
    reused.write_text('{"input_length": 300, "output_length": 4, "hash_ids": [0]}\n'
                      '{"input_length": 900, "output_length": 4, "hash_ids": [0, 1]}\n')
    v = _one(aiperf, "mooncake", reused)
    assert not v["ok"] and "hash_id 0 requested at 512 tokens but was already materialized at 300" in v["error"]
    fractional = tmp_path / "fractional.jsonl"
    fractional.write_text('{"timestamp": 2.5, "input_length": 10, "output_length": 4}\n'
                          '{"timestamp": 1, "input_length": 10, "output_length": 4}\n')
    v = _one(aiperf, "mooncake", fractional)
    assert v["ok"] and not v["timestamps_integer_ms"] and not v["timestamps_non_decreasing"]
    nothing = tmp_path / "no_input.jsonl"
    nothing.write_text('{"timestamp": 1, "output_length": 4}\n')
    v = _one(aiperf, "mooncake", nothing)
    assert not v["ok"] and "can_load refused" in v["error"]


def test_vidur_generators(vidur: consumers.Consumer, tmp_path: Path) -> None:
    replay = tmp_path / "replay.csv"
    replay.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\n"
                      "2023-08-21,0.0,100,20\n2023-08-21,1.5,200,30\n")
    other_day = tmp_path / "other_day.csv"
    other_day.write_text(replay.read_text() + "2023-08-22,2.0,10,10\n")
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("arrival_time,num_prefill_tokens,num_decode_tokens\n"
                       "1970-01-04 12:00:01,100,20\n1970-01-04 12:00:03,200,30\n1970-01-04 12:00:04,5,5\n")
    jobs = [{"check": c, "file": str(p)} for p in (replay, other_day, lengths)
            for c in ("trace_replay", "request_length", "request_interval")]
    v = {(j["check"], Path(j["file"]).name): r for j, r in zip(jobs, consumers.run_driver(vidur, jobs), strict=True)}
    r = v[("trace_replay", "replay.csv")]
    # vidur's default prefill_scale_factor is 0.3
    assert r["ok"] and (r["requests"], r["prefill_tokens"], r["decode_tokens"]) == (2, 90, 50)
    assert not v[("trace_replay", "other_day.csv")]["ok"]
    assert "kept 2 of 3 rows" in v[("trace_replay", "other_day.csv")]["error"]
    assert v[("trace_replay", "lengths.csv")]["error"] == "KeyError: 'Date'"
    assert v[("request_length", "replay.csv")]["error"] == "KeyError: 'num_prefill_tokens'"
    r = v[("request_length", "lengths.csv")]
    assert r["ok"] and (r["requests"], r["prefill_tokens"], r["decode_tokens"]) == (3, 305, 55)
    assert v[("request_interval", "replay.csv")]["error"] == "KeyError: 'arrival_time'"
    r = v[("request_interval", "lengths.csv")]
    assert r["ok"] and (r["kept"], r["intervals"], r["span_s"]) == (3, 2, 3.0)
