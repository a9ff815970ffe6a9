"""The registry's declared head signatures (:class:`analyses.readers.ReaderSpec`) only spare
imports: detection gives the same reader for every test fixture, sample log and real log as
offering every head to every reader's ``sniff`` in order, and no reader accepts a head that lacks
its signature."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyses.readers import READER_SPECS, ReaderSpec, all_readers, detect_head
from analyses.readers.base import Reader, read_head

REPO = Path(__file__).resolve().parents[1]


def _files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _full_detect(head: str, path: Path) -> Reader | None:
    """Detection before the signatures: every reader's ``sniff`` in order."""
    return next((r for r in all_readers() if r.sniff(head, path)), None)


def _check(files: list[Path]) -> set[str]:
    """Assert the rule over ``files``; the names of the signed readers some file was theirs."""
    signed = [(spec, r) for spec, r in zip(READER_SPECS, all_readers(), strict=True) if spec.head is not None]
    hit: set[str] = set()
    for path in files:
        head = read_head(path)
        for spec, r in signed:
            if r.sniff(head, path):
                assert spec.admits(head), f"{r.name} accepts {path} whose head lacks {spec.head!r}"
                hit.add(r.name)
        assert detect_head(head, path) is _full_detect(head, path), path
    return hit


def test_signatures_agree_with_sniff_on_fixtures_and_sample_logs() -> None:
    files = _files(REPO / "tests" / "fixtures", REPO / "sample_logs")
    assert len(files) > 50
    hit = _check(files)
    # every signature is exercised (a fixture of each signed format), so the rule is not vacuous
    assert hit == {r.name for spec, r in zip(READER_SPECS, all_readers(), strict=True) if spec.head is not None}


def test_signatures_agree_with_sniff_on_real_logs(real_logs: Path) -> None:
    files = _files(real_logs)
    assert len(files) > 50
    _check(files)


@pytest.mark.parametrize("head", [
    ':W&B\x00\x01\x02',  # a wandb run file's magic
    '\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7fK"\t\x00\x00\x00\x00\x00\x00\x00\x00\x1a\rbrain.Event:2',
    '{"global_step": 3, "log_history": [{"loss": 1.0, "step": 1}]}',
    '{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel"}]}',
])
def test_a_head_with_its_signature_is_still_offered_to_sniff(head: str) -> None:
    """A signature is a necessary condition only: a head that holds one is sniffed as before."""
    path = Path("x")
    assert detect_head(head, path) is _full_detect(head, path)


def test_a_signature_passes_over_a_head_without_it() -> None:
    spec = ReaderSpec("analyses.readers.kineto:KinetoTraceReader", READER_SPECS[0].head)
    assert not spec.admits('{"step": 1, "input": 3, "output": [4]}')
    assert spec.admits('{"traceEvents": [')


def test_first_json_objects_serves_any_count_from_the_last_head() -> None:
    """Sniffing asks for one object, then five: each answer is what parsing that many gives."""
    from analyses.readers.typed_jsonl import first_json_objects

    head = '{"a": 1}\nnot json\n{"a": 2}\n[3]\n{"a": 3}\n'
    assert first_json_objects(head, 1) == [{"a": 1}]
    assert first_json_objects(head) == [{"a": 1}, {"a": 2}, {"a": 3}]  # all the head holds
    assert first_json_objects(head, 2) == [{"a": 1}, {"a": 2}]
    assert first_json_objects(head, 9) == [{"a": 1}, {"a": 2}, {"a": 3}]
    other = '{"b": 1}\n'
    assert first_json_objects(other, 1) == [{"b": 1}]
    assert first_json_objects(head, 1) == [{"a": 1}]
