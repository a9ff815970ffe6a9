"""The consumer drivers on small hand-written files: each accepts what its consumer documents and refuses,
with the consumer's own message, what it rejects. Proves a verdict on an export means something.
(One driver run per consumer for all of them: aiperf's start-up trains a tokenizer.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from . import consumers
from .harness import once

pytestmark = pytest.mark.xdist_group("conformance")

# name -> (consumer, check, file content)
FILES: dict[str, tuple[str, str, str]] = {
    "good.txt": ("aiperf", "sequence_distribution", "256|10,128|5:40;512,256:60\n"),
    "bad.txt": ("aiperf", "sequence_distribution", "256,128:40;512,256:59.999"),
    "over.json": ("aiperf", "sequence_distribution", json.dumps({"pairs": [
        {"isl": 100, "isl_stddev": 0, "osl": 10, "osl_stddev": 0, "prob": 50.001},
        {"isl": 200, "isl_stddev": 5, "osl": 20, "osl_stddev": 1, "prob": 50}]})),
    "sessions.jsonl": ("aiperf", "mooncake", "".join(json.dumps(r) + "\n" for r in (
        {"session_id": "a", "timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},
        {"session_id": "a", "timestamp": 5, "input_length": 100, "output_length": 20, "hash_ids": [3]},
        {"timestamp": 7, "input_length": 50, "output_length": 5}))),
    # one hash id standing for blocks of two sizes
    "reused_block.jsonl": ("aiperf", "mooncake", '{"input_length": 300, "output_length": 4, "hash_ids": [0]}\n'
                                                 '{"input_length": 900, "output_length": 4, "hash_ids": [0, 1]}\n'),
    "fractional.jsonl": ("aiperf", "mooncake", '{"timestamp": 2.5, "input_length": 10, "output_length": 4}\n'
                                               '{"timestamp": 1, "input_length": 10, "output_length": 4}\n'),
    "no_input.jsonl": ("aiperf", "mooncake", '{"timestamp": 1, "output_length": 4}\n'),
}
REPLAY = "Date,Time,PromptTokenCount,CompletionTokenCount\n2023-08-21,0.0,100,20\n2023-08-21,1.5,200,30\n"
VIDUR_FILES = {
    "replay.csv": REPLAY,
    "other_day.csv": REPLAY + "2023-08-22,2.0,10,10\n",
    "lengths.csv": "arrival_time,num_prefill_tokens,num_decode_tokens\n"
                   "1970-01-04 12:00:01,100,20\n1970-01-04 12:00:03,200,30\n1970-01-04 12:00:04,5,5\n",
}
VIDUR_CHECKS = ("trace_replay", "request_length", "request_interval")


@pytest.fixture(scope="module")
def verdicts(aiperf: consumers.Consumer, vidur: consumers.Consumer,
             tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """(check, file name) -> verdict, from one run of each driver per test run."""

    def make(d: Path) -> list[list[Any]]:
        jobs: dict[str, list[dict[str, str]]] = {"aiperf": [], "vidur": []}
        for name, (tool, check, text) in FILES.items():
            (d / name).write_text(text)
            jobs[tool].append({"check": check, "file": str(d / name)})
        for name, text in VIDUR_FILES.items():
            (d / name).write_text(text)
            jobs["vidur"] += [{"check": c, "file": str(d / name)} for c in VIDUR_CHECKS]
        return [[j["check"], Path(j["file"]).name, v] for tool, c in (("aiperf", aiperf), ("vidur", vidur))
                for j, v in zip(jobs[tool], consumers.run_driver(c, jobs[tool]), strict=True)]

    _, rows = once(tmp_path_factory, "driver_verdicts", make)
    return {(check, name): v for check, name, v in rows}


def test_environments_are_the_pinned_versions_outside_the_project(aiperf: consumers.Consumer,
                                                                  vidur: consumers.Consumer) -> None:
    for c in (aiperf, vidur):
        assert consumers.is_installed(c)
        assert c.env_dir.is_relative_to(consumers.cache_root())
        assert f"{c.name}=={c.version}" in c.lock.read_text().splitlines()


def test_aiperf_sequence_distribution(verdicts: dict) -> None:
    good = verdicts[("sequence_distribution", "good.txt")]
    assert good["ok"] and good["pairs"] == 2 and good["expected_isl"] == pytest.approx(409.6)
    bad = verdicts[("sequence_distribution", "bad.txt")]
    assert not bad["ok"] and "Probabilities must sum to 100.0, got 99.999000" in bad["error"]
    over = verdicts[("sequence_distribution", "over.json")]
    assert not over["ok"] and "got 100.001000" in over["error"]


def test_aiperf_mooncake_sessions_and_prefill(verdicts: dict) -> None:
    v = verdicts[("mooncake", "sessions.jsonl")]
    assert v["ok"], v["error"]
    assert (v["traces"], v["sessions"], v["multi_turn_sessions"], v["turns_built"]) == (3, 2, 1, 3)
    # session a: 600, then 600 + 10 (its response) + 100; the single-turn session: 50
    assert v["multiturn_prefill_tokens"] == 600 + 710 + 50
    assert v["timestamps_integer_ms"] and v["timestamps_non_decreasing"]


def test_aiperf_mooncake_refusals(verdicts: dict) -> None:
    v = verdicts[("mooncake", "reused_block.jsonl")]
    assert not v["ok"] and "hash_id 0 requested at 512 tokens but was already materialized at 300" in v["error"]
    v = verdicts[("mooncake", "fractional.jsonl")]
    assert v["ok"] and not v["timestamps_integer_ms"] and not v["timestamps_non_decreasing"]
    v = verdicts[("mooncake", "no_input.jsonl")]
    assert not v["ok"] and "can_load refused" in v["error"]


def test_vidur_generators(verdicts: dict) -> None:
    v = verdicts
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


def test_declared_consumer_versions_are_the_ones_the_suite_checks() -> None:
    """docs/spec.md's "checked against" column (analyses.export.consumer_versions) names what this suite runs."""
    from analyses.export import consumer_versions as cv

    from . import upstream_polytrace as up
    from .consumers import CONSUMERS

    assert (cv.UPSTREAM_POLYTRACE_REPO, cv.UPSTREAM_POLYTRACE_COMMIT) == (up.UPSTREAM_REPO, up.UPSTREAM_COMMIT)
    assert (cv.AIPERF_VERSION, cv.VIDUR_VERSION) == (CONSUMERS["aiperf"].version, CONSUMERS["vidur"].version)


def test_a_cached_verdict_is_reused_only_for_the_same_bytes_and_names_this_runs_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_driver's verdict cache: a second run over files of the same bytes at other paths gets the
    first run's verdicts with its own paths; one changed byte, or POLYTRACE_CONFORMANCE_FRESH, runs the driver."""
    monkeypatch.setenv("POLYTRACE_CONFORMANCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(consumers.FRESH_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(consumers.REPORT_ENV, raising=False)  # its cache hits are not the suite's
    c = consumers.CONSUMERS["vidur"]
    monkeypatch.setattr(consumers, "ensure", lambda _c: Path("python"))
    runs: list[list[dict[str, Any]]] = []

    def driver(_c: consumers.Consumer, _py: Path, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        runs.append(jobs)
        return [{"file": j["file"], "ok": True, "error": f"read {j['file']}/x", "n": len(runs)} for j in jobs]

    monkeypatch.setattr(consumers, "_run_driver", driver)

    def files(d: Path, text: str) -> list[dict[str, Any]]:
        (d / "sub").mkdir(parents=True)
        (d / "a.csv").write_text(text)
        (d / "sub" / "b.csv").write_text("b")
        return [{"check": "trace_replay", "file": str(d / "a.csv")}, {"check": "request_length", "file": str(d / "sub")}]

    first = consumers.run_driver(c, files(tmp_path / "one", "a"))
    again = files(tmp_path / "one-again", "a")  # the old paths are a prefix of the new ones
    got = consumers.run_driver(c, again)
    assert len(runs) == 1
    assert got == [{"file": j["file"], "ok": True, "error": f"read {j['file']}/x", "n": 1} for j in again]
    assert first[0]["file"] == str(tmp_path / "one" / "a.csv")
    consumers.run_driver(c, files(tmp_path / "two", "A"))  # one byte changed
    assert len(runs) == 2
    (tmp_path / "one-again" / "sub" / "b.csv").write_text("B")  # a file inside a named directory changed
    consumers.run_driver(c, again)
    assert len(runs) == 3
    monkeypatch.setenv(consumers.FRESH_ENV, "1")
    consumers.run_driver(c, files(tmp_path / "three", "a"))
    assert len(runs) == 4
    # under CI every consumer judges the files itself, unless the cache is asked for explicitly
    monkeypatch.delenv(consumers.FRESH_ENV)
    monkeypatch.setenv("CI", "true")
    consumers.run_driver(c, files(tmp_path / "four", "a"))
    assert len(runs) == 5
    monkeypatch.setenv(consumers.FRESH_ENV, "0")
    consumers.run_driver(c, files(tmp_path / "five", "a"))
    assert len(runs) == 5
