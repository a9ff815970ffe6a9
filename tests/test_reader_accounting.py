"""The line-accounting contract, checked for every reader on every fixture, chunk by chunk:
``rows_ok + rows_rejected + rows_skipped == lines`` with no negative count, and every rejected
line has its ``rejects`` row (pair-level rejects may add more). A reader that drops a line
without counting it, or counts one twice, fails here even where its own tests look elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyses.manifest import MANIFEST_NAME, load_manifest
from analyses.readers import detect, read_file
from analyses.readers.base import FileContext, UnreadableFile
from tests.conftest import FIXTURES

_NOT_INPUTS = {MANIFEST_NAME, "tokenizer.json", "README.md", "make_fixtures.py"}
FILES = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name not in _NOT_INPUTS)
# fixtures that are meant to be unreadable as a whole (their own tests check the error)
UNREADABLE = {"v1_cut_document.json"}
# fixtures no reader should claim (the ingest records them as unsupported)
UNRECOGNIZED = {"binary_not_text.log"}


def test_fixtures_are_found() -> None:
    # guards the parametrization below against an empty list (a test over nothing passes)
    assert len(FILES) > 60


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_chunk_accounts_for_its_lines(path: Path) -> None:
    reader = detect(path)
    if path.name in UNRECOGNIZED:
        assert reader is None, reader.name
        return
    assert reader is not None, "no reader recognizes this fixture"
    ctx = FileContext("r", path, path.name, load_manifest(path.parent))
    if path.name in UNREADABLE:
        with pytest.raises(UnreadableFile):
            list(read_file(reader, ctx))
        return
    if reader.name == "wandb_offline":  # the wandb extra is installed by `make test`
        import wandb.proto.wandb_internal_pb2  # noqa: F401
    chunks = list(read_file(reader, ctx))  # as the ingest reads: line-layer rejects included
    assert chunks, "a readable file yields at least one chunk"
    for i, c in enumerate(chunks):
        counts = (c.lines, c.rows_ok, c.rows_rejected, c.rows_skipped)
        assert min(counts) >= 0, (i, counts)
        assert c.rows_ok + c.rows_rejected + c.rows_skipped == c.lines, (i, counts)
        n_rejects = 0 if c.rejects is None else c.rejects.height
        assert n_rejects >= c.rows_rejected, (i, counts, n_rejects)
    assert sum(c.lines for c in chunks) > 0
