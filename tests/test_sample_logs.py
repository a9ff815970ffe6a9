"""The committed demo corpus is exactly what its generator writes (so it cannot drift)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conftest import REPO


def test_generator_reproduces_committed_corpus(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("generate", REPO / "sample_logs" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)
    produced = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(REPO / "sample_logs").as_posix()
        for p in (REPO / "sample_logs").rglob("*")
        if p.is_file() and p.parent != REPO / "sample_logs"
    )
    assert produced == committed
    for rel in produced:
        assert (tmp_path / rel).read_bytes() == (REPO / "sample_logs" / rel).read_bytes(), rel
    # every run directory says what logs do not
    assert all((tmp_path / d / "run.toml").exists() for d in {r.split("/")[0] for r in produced})
