"""PolyTrace v1 per-step JSON (flat, output_groups and multi-turn layouts). No real v1 file exists;
the fixtures follow the PolyTrace README and its replay reader, expected values are by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import RunManifest
from analyses.readers.base import FileContext, UnreadableFile
from analyses.readers.polytrace_v1 import PolyTraceV1Reader

FIX = Path(__file__).parent / "fixtures" / "polytrace"


def _read(name: str, manifest: RunManifest | None = None) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, tuple]:
    path = FIX / name
    (chunk,) = PolyTraceV1Reader().read(FileContext("r", path, name, manifest or RunManifest()))
    acc = (chunk.lines, chunk.rows_ok, chunk.rows_rejected, chunk.rows_skipped)
    assert chunk.rows_ok + chunk.rows_rejected + chunk.rows_skipped == chunk.lines
    return chunk.tables, chunk.rejects, acc


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('{"0": {"input": [1], "output": [2]}}', True),
        ('{\n  "12": [\n {"input": [1, 2], "output": [3, 4]}]}', True),
        ('{"3": {"input": [1], "output_groups": [[2]]}}', True),
        ('{"step": 1, "data": {}}', False),  # verl file logger
        ('{"math": {"input_length": {"dist": "gamma"}}}', False),  # distribution-parameter JSON
        ('[{"input": [1], "output": [2]}]', False),
    ],
)
def test_sniff(head: str, expected: bool) -> None:
    assert PolyTraceV1Reader().sniff(head, Path("w.json")) is expected


def test_flat_n_outputs_per_input() -> None:
    tables, rej, acc = _read("v1_flat_n_per_prompt.json")
    assert acc == (2, 2, 0, 0) and rej.height == 0
    s = tables["samples"].sort("step", "sample_id")
    # step 0: 2 inputs, 6 outputs -> 3 per prompt; step 1: 3 and 3 -> one to one
    assert s.select("step", "sample_id", "group_id", "prompt_tokens", "response_tokens").rows() == [
        (0, "0", "0", 10, 1), (0, "1", "0", 10, 2), (0, "2", "0", 10, 3),
        (0, "3", "1", 20, 4), (0, "4", "1", 20, 5), (0, "5", "1", 20, 6),
        (1, "0", "0", 7, 11), (1, "1", "1", 8, 12), (1, "2", "2", 9, 13),
    ]
    assert s["truncated"].null_count() == 9  # no limit known


def test_output_groups_one_list_per_prompt() -> None:
    tables, _, acc = _read("v1_output_groups.json", RunManifest(max_response_length=9, task="math"))
    assert acc == (1, 1, 0, 0)
    s = tables["samples"].sort("sample_id")
    assert s.select("step", "sample_id", "group_id", "prompt_tokens", "response_tokens", "truncated", "task").rows() == [
        (3, "0-0", "0", 100, 5, False, "math"), (3, "0-1", "0", 100, 6, False, "math"),
        (3, "1-0", "1", 200, 7, False, "math"), (3, "1-1", "1", 200, 8, False, "math"),
        (3, "1-2", "1", 200, 9, True, "math"),  # 9 == the limit
    ]


def test_multiturn_trajectories_and_turns() -> None:
    tables, _, acc = _read("v1_multiturn.json")
    assert acc == (2, 2, 0, 0)
    s = tables["samples"].sort("step", "sample_id")
    assert s.select("step", "sample_id", "prompt_tokens", "response_tokens", "generated_tokens", "n_turns").rows() == [
        (0, "0", 50, 70, 70, 2), (0, "1", 60, 25, 25, 1), (1, "0", 55, 100, 100, 3),
    ]
    t = tables["turns"].sort("step", "sample_id", "turn")
    assert t.select("step", "sample_id", "turn", "prompt_tokens", "completion_tokens").rows() == [
        (0, "0", 0, 50, 30), (0, "0", 1, 120, 40), (0, "1", 0, 60, 25),
        (1, "0", 0, 55, 20), (1, "0", 1, 140, 35), (1, "0", 2, 260, 45),
    ]


def test_bad_steps_rejected_whole() -> None:
    tables, rej, acc = _read("v1_bad_steps.json", RunManifest(max_response_length=1000))
    # 9 step entries: "0" and "8" are fine, the other 7 each have one defect
    assert acc == (9, 2, 7, 0)
    assert dict(zip(rej["line_no"], rej["reason"], strict=True)) == {
        2: "step key 'x1' is not a non-negative integer",
        3: "non-integer value in output",
        4: "negative value in output",
        5: "missing output (or output_groups)",
        6: "step entry is neither an object nor a list of trajectories",
        7: "a trajectory has different numbers of input and output turns",
        8: "response length 5000 exceeds max_response_length 1000",
    }
    s = tables["samples"]
    # step 8: 2 inputs vs 3 outputs do not correspond -> prompt unknown, outputs kept
    assert s.filter(pl.col("step") == 8).select("prompt_tokens", "group_id").null_count().row(0) == (3, 3)
    assert s.filter(pl.col("step") == 0)["prompt_tokens"].to_list() == [10, 10]


def test_cut_document_is_an_unreadable_file(warehouse: Path, tmp_path: Path) -> None:
    with pytest.raises(UnreadableFile):
        _read("v1_cut_document.json")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIX / "v1_cut_document.json", run / "w.json")
    (f,) = ingest_run(run, warehouse).files
    assert (f.format, f.status) == ("polytrace_v1", "error")


def test_duplicate_step_key_is_rejected_not_silently_overwritten(tmp_path: Path) -> None:
    # json.loads would keep only the last "0" and count 1 record; by hand: 3 step entries,
    # the second "0" rejected (first wins, as for the other readers' duplicates)
    p = tmp_path / "w.json"
    p.write_text('{"0": {"input": [1], "output": [2]}, "1": {"input": [3], "output": [4]}, '
                 '"0": {"input": [5], "output": [6]}}')
    (chunk,) = PolyTraceV1Reader().read(FileContext("r", p, p.name, RunManifest()))
    assert (chunk.lines, chunk.rows_ok, chunk.rows_rejected, chunk.rows_skipped) == (3, 2, 1, 0)
    assert chunk.rejects.select("line_no", "reason").rows() == [(3, "duplicate step key '0': the first entry for it is kept")]
    s = chunk.tables["samples"].sort("step")
    assert s.select("step", "prompt_tokens", "response_tokens").rows() == [(0, 1, 2), (1, 3, 4)]
