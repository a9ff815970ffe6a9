"""Consecutive small files of one format are read as one batch (analyses.ingest_many): the tables,
rejects (file and line), source_files rows and statuses equal reading each file alone, whatever
mix of good, bad, empty and other-format files the run holds."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from analyses import ingest_many
from analyses.ingest import ingest_run
from analyses.ingest_files import RunReport
from analyses.readers.base import ReaderBase
from analyses.readers.lines import FILES_BATCH_BYTES, small_files_lines
from analyses.readers.polytrace_v2 import MultiturnWorkloadReader, PackedLengthsReader, RewardTimingsReader
from analyses.schema import TABLES
from analyses.warehouse import scan_table


def _packed(step: int, n: int = 3, **override: object) -> str:
    rows = []
    for i in range(n):
        rec = {"step": step, "rank": i % 2, "dp_rank": i % 2, "tp_rank": 0, "local_index": i, "input": 100 + i,
               "output": [10 + i, 20 + i], "n_sampling": 2, "validate": False}
        rec.update(override if i == n - 1 else {})
        rows.append(json.dumps(rec))
    return "\n".join(rows) + "\n"


def _reward(step: int) -> str:
    return "".join(json.dumps({"step": step, "rank": r, "reward_time_s": 0.5 + r, "batch_size": 4}) + "\n"
                   for r in range(2))


def _multiturn(step: int, n: int = 3, **override: object) -> str:
    rows = []
    for i in range(n):
        calls = [{"turn": t, "tool_name": "search", "latency_s": 0.1, "status": "success", "response_token_len": 7}
                 for t in (0, 0, 1)[: i + 1]]  # two calls share turn 0: call_index 0, 1
        rec = {"step": step, "prompt_len": 50 + i, "max_response_len": 100, "final_response_len": 30 + i % 50,
               "turns": [{"turn": 0, "prompt_tokens": 50, "completion_tokens": 10, "finish_reason": "tool_calls"},
                         {"turn": 1, "prompt_tokens": 70, "completion_tokens": 20, "finish_reason": "stop"}],
               "tool_calls": calls, "prompt_group_id": i // 2, "sample_id": i % 2, "validate": False}
        rec.update(override if i == n - 1 else {})
        rows.append(json.dumps(rec))
    return "\n".join(rows) + "\n"


def _run(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    files = {
        "packed_lengths_step_1.jsonl": _packed(1),
        "packed_lengths_step_2.jsonl": _packed(2, local_index=0),  # a duplicate record: rejected in the batch
        "packed_lengths_step_3.jsonl": _packed(4),  # every step contradicts the file name
        "packed_lengths_step_4.jsonl": _packed(4, output=[]),  # an empty output list
        "packed_lengths_step_5.jsonl": _packed(5) + "{not json\n",  # a bad line: the batch is read file by file
        "packed_lengths_step_6.jsonl": _packed(6),
        "packed_lengths_step_7.jsonl": "",  # empty
        "packed_lengths_step_8.jsonl": _packed(8).rstrip("\n"),  # no newline at the end
        "packed_lengths_step_9.jsonl": _packed(9),
        "reward_timings_step_1.jsonl": _reward(1),
        "reward_timings_step_2.jsonl": _reward(2),
        "reward_timings_step_3.jsonl": _reward(4),
        "zz_packed_lengths_step_10.jsonl": _packed(10),
        "zz_turns/multiturn_workload_step_1.jsonl": _multiturn(1, n=1),  # one line: the next file's line 1 follows it
        "zz_turns/multiturn_workload_step_2.jsonl": _multiturn(2),
        "zz_turns/multiturn_workload_step_3.jsonl": _multiturn(3, prompt_group_id=0, sample_id=0),  # a duplicate
        "zz_turns/multiturn_workload_step_4.jsonl": _multiturn(4, final_response_len=101),  # over its limit
        "zz_turns/multiturn_workload_step_5.jsonl": _multiturn(6),  # every step contradicts the file name
        "zz_turns/multiturn_workload_step_6.jsonl": _multiturn(6, n=200),  # > 512 calls in the batch: counted by runs
        "zz_turns/multiturn_workload_step_7.jsonl": _multiturn(7),
        "zz_turns/multiturn_workload_step_8.jsonl": _multiturn(8) + '{"step": 8, "turns": [\n',  # bad JSON
        "zz_turns/multiturn_workload_step_9.jsonl": _multiturn(9),
    }
    (d / "zz_turns").mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def _tables(wh: Path) -> dict[str, pl.DataFrame]:
    return {t: scan_table(wh, t).collect().drop("source_dir", strict=False) for t in TABLES}


READERS = (PackedLengthsReader, RewardTimingsReader, MultiturnWorkloadReader)


@pytest.mark.parametrize("bad_batch", [False, True])
def test_batches_equal_file_by_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad_batch: bool) -> None:
    run = _run(tmp_path)
    if bad_batch:  # every packed file in one batch with the bad line: all read alone
        shutil.move(run / "packed_lengths_step_5.jsonl", run / "packed_lengths_step_0.jsonl")
    calls: list[int] = []
    batched_by: set[str] = set()
    for cls in READERS:
        orig = cls.read_many

        def spy(self, ctxs, _orig=orig, cls=cls):  # noqa: ANN001, ANN202
            got = _orig(self, ctxs)
            calls.append(len(ctxs) if got is not None else 0)
            batched_by.add(cls.__name__ if got is not None else "")
            return got

        monkeypatch.setattr(cls, "read_many", spy)
    batched = ingest_run(run, tmp_path / "batched", run_id="r")
    assert sum(calls) >= 5, calls  # most files were read in batches
    # every reader batched (a batch that fails falls back to reading file by file: same rows, only slower)
    assert {cls.__name__ for cls in READERS} <= batched_by
    for cls in READERS:
        monkeypatch.setattr(cls, "read_many", ReaderBase.read_many)
    a = _same_as_read_alone(batched, run, tmp_path)
    rej = a["rejects"].select("path", "line_no", "reason").rows()
    assert ("packed_lengths_step_2.jsonl", 3, "duplicate record for this dp_rank and local_index") in rej
    assert ("packed_lengths_step_3.jsonl", 1, "step 4 contradicts the file name (step 3)") in rej
    assert ("reward_timings_step_3.jsonl", 2, "step 4 contradicts the file name (step 3)") in rej
    status = dict(a["source_files"].select("path", "status").rows())
    assert status["packed_lengths_step_7.jsonl"] == "empty" and status["packed_lengths_step_3.jsonl"] == "no_data"
    assert status["packed_lengths_step_2.jsonl"] == "partial" and status["packed_lengths_step_9.jsonl"] == "ok"
    turns = "zz_turns/multiturn_workload_step_"
    assert (f"{turns}3.jsonl", 3, "duplicate record for this prompt_group_id and sample_id") in rej
    assert (f"{turns}4.jsonl", 3, "final_response_len 101 exceeds max response length 100") in rej
    assert (f"{turns}5.jsonl", 1, "step 6 contradicts the file name (step 5)") in rej
    assert status[f"{turns}5.jsonl"] == "no_data" and status[f"{turns}7.jsonl"] == "ok"
    bad_json = [r for r in rej if r[0] == f"{turns}8.jsonl"]
    assert [r[1] for r in bad_json] == [4] and status[f"{turns}8.jsonl"] == "partial", bad_json
    calls = a["tool_calls"].filter(pl.col("step") == 2).sort("sample_id", "turn", "call_index")
    assert calls.select("sample_id", "turn", "call_index").rows() == [
        ("0-0", 0, 0), ("0-1", 0, 0), ("0-1", 0, 1), ("1-0", 0, 0), ("1-0", 0, 1), ("1-0", 1, 0)]
    assert a["turns"].filter(pl.col("step") == 7).height == 6 and a["samples"].filter(pl.col("path") == f"{turns}6.jsonl").height == 200


def _same_as_read_alone(batched: RunReport, run: Path, tmp_path: Path) -> dict[str, pl.DataFrame]:
    """The tables of ``batched`` (ingested into ``tmp_path/batched``), asserted equal, with its
    report, to ``run`` ingested again now (the test has turned batching off) into ``tmp_path/alone``."""
    alone = ingest_run(run, tmp_path / "alone", run_id="r")
    assert batched.summary_lines() == alone.summary_lines()
    a, b = _tables(tmp_path / "batched"), _tables(tmp_path / "alone")
    for t in TABLES:
        assert a[t].equals(b[t]), f"table {t} differs\n{a[t]}\n{b[t]}"
    return a


def test_consecutive_batches_stage_one_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches one after another (the last of a single file) go on one part file per table, which
    the commit moves instead of rewriting; the rows equal reading each file alone."""
    import analyses.ingest_many as many
    from analyses.warehouse import RunStaging

    run = tmp_path / "run"
    run.mkdir()
    for step in range(1, 6):
        (run / f"multiturn_workload_step_{step}.jsonl").write_text(_multiturn(step))
    size = (run / "multiturn_workload_step_1.jsonl").stat().st_size
    monkeypatch.setattr(many, "GROUP_BYTES", 2 * size + 1)  # batches of 2, 2 and 1 files
    parts: dict[str, int] = {}
    orig = RunStaging._compact

    def spy(self, name, t):  # noqa: ANN001, ANN202
        parts[name] = len(list(self.table_dir(name).glob("*.parquet")))
        return orig(self, name, t)

    monkeypatch.setattr(RunStaging, "_compact", spy)
    batched = ingest_run(run, tmp_path / "batched", run_id="r")
    assert parts["samples"] == parts["turns"] == parts["tool_calls"] == 1, parts
    monkeypatch.setattr(MultiturnWorkloadReader, "read_many", ReaderBase.read_many)
    _same_as_read_alone(batched, run, tmp_path)


def test_files_past_the_sniffed_head_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step files larger than the head detection reads are read once on the read-ahead thread for
    their hash and their lines: the same rows, rejects (line numbers) and digests as reading
    each file alone."""
    import hashlib

    import analyses.ingest_many as many
    from analyses.readers.base import SNIFF_BYTES

    run = tmp_path / "run"
    run.mkdir()
    for step in (1, 2, 3):
        # record 300 repeats record 2's (prompt_group_id 0, sample_id 1): rejected on line 300 of step 2
        over = {"prompt_group_id": 0, "sample_id": 1} if step == 2 else {}
        (run / f"multiturn_workload_step_{step}.jsonl").write_text(_multiturn(step, n=300, **over))
    assert min(p.stat().st_size for p in run.iterdir()) > SNIFF_BYTES
    read: list[int] = []
    orig = many._read_whole

    def spy(g):  # noqa: ANN001, ANN202
        read.append(g.idx)
        return orig(g)

    monkeypatch.setattr(many, "_read_whole", spy)
    batched = ingest_run(run, tmp_path / "batched", run_id="r")
    assert len(read) == 3, read
    monkeypatch.setattr(MultiturnWorkloadReader, "read_many", ReaderBase.read_many)
    a = _same_as_read_alone(batched, run, tmp_path)
    assert a["rejects"].select("path", "line_no", "reason").rows() == [
        ("multiturn_workload_step_2.jsonl", 300, "duplicate record for this prompt_group_id and sample_id")]
    assert a["samples"].height == 899
    digests = dict(a["source_files"].select("path", "sha256").rows())
    assert digests == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.iterdir()}


def test_files_read_whole_when_sniffed_are_hashed_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small step files are hashed on the thread that sniffs them (not on the read-ahead thread,
    where each GIL release let the sniffing thread hold the GIL for its switch interval): the same
    digests, and resumable states an append continues from."""
    import hashlib
    import threading

    import analyses.ingest_many as many
    from analyses.ingest_files import file_sha256

    run = tmp_path / "run"
    run.mkdir()
    for step in (1, 2, 3):
        (run / f"packed_lengths_step_{step}.jsonl").write_text(_packed(step))
    hashed_on: list[str] = []
    orig = many.bytes_sha256

    def spy(data: bytes) -> str:
        hashed_on.append(threading.current_thread().name)
        return orig(data)

    monkeypatch.setattr(many, "bytes_sha256", spy)
    rep = ingest_run(run, tmp_path / "wh", run_id="r")
    assert hashed_on == ["MainThread"] * 3
    assert {f.path: f.sha256 for f in rep.files} == {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                                     for p in run.iterdir()}
    # the state an append continues from is the whole file's, as hashing the file gives it
    states = {f.path: f.state["sha_state"] for f in rep.files}
    assert states == {p.name: file_sha256(p, p.stat().st_size).partition(":")[2] or None for p in run.iterdir()}


def test_a_full_batch_is_one_split() -> None:
    """A batch holds as much text as one split of small files takes: the split refuses a larger
    one, which is then read again in halves."""
    assert ingest_many.GROUP_BYTES <= inspect.signature(small_files_lines).parameters["max_bytes"].default
    assert ingest_many.GROUP_BYTES == FILES_BATCH_BYTES  # as large as it can be: a batch has a fixed cost
