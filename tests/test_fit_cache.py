"""Per-run fit results are reused exactly when nothing they depend on changed (analyses.fit.cache)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analyses.api import PolyTrace
from analyses.fit import cache, runs
from analyses.ingest import ingest_run
from analyses.warehouse import manifest_path

SAMPLE = Path(__file__).resolve().parents[1] / "sample_logs" / "polytrace-search-multiturn"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "src" / "search"
    shutil.copytree(SAMPLE, d)
    return d


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        return {"value": self.calls}


def test_same_inputs_hit_and_any_dependency_misses(run_dir: Path, warehouse: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ingest_run(run_dir, warehouse, run_id="r")
    f = Counter()
    assert cache.cached(warehouse, "r", "w", f, seed=0) == ({"value": 1}, False)
    assert cache.cached(warehouse, "r", "w", f, seed=0) == ({"value": 1}, True)
    assert cache.cached(warehouse, "r", "w", f, seed=1) == ({"value": 2}, False)  # another parameter
    assert cache.cached(warehouse, "r", "w", f, seed=0) == ({"value": 3}, False)  # one entry per (run, what)

    # the same files copied elsewhere and ingested again: same fingerprint and facts, a hit
    moved = tmp_path / "elsewhere" / "search"
    shutil.copytree(run_dir, moved)
    ingest_run(moved, warehouse, run_id="r")
    assert cache.cached(warehouse, "r", "w", f, seed=0) == ({"value": 3}, True)

    # one changed byte of one input file: a miss
    p = moved / "multiturn_workload_step_4.jsonl"
    p.write_bytes(p.read_bytes() + b"\n")
    ingest_run(moved, warehouse, run_id="r")
    assert cache.cached(warehouse, "r", "w", f, seed=0) == ({"value": 4}, False)

    # a run fact from run.toml (not an input file): a miss
    toml = moved / "run.toml"
    toml.write_text(toml.read_text().replace("n_gpus = 8", "n_gpus = 64"))
    ingest_run(moved, warehouse, run_id="r")
    assert cache.cached(warehouse, "r", "w", f, seed=0) == ({"value": 5}, False)

    # the fitting code changed: a miss
    monkeypatch.setattr(cache, "code_digest", lambda: "another version")
    assert cache.cached(warehouse, "r", "w", f, seed=0) == ({"value": 6}, False)


def test_a_corrupt_entry_is_a_miss_and_is_replaced(run_dir: Path, warehouse: Path) -> None:
    ingest_run(run_dir, warehouse, run_id="r")
    f = Counter()
    cache.cached(warehouse, "r", "w", f)
    cache.cache_path(warehouse, "r", "w").write_text("{not json")
    assert cache.cached(warehouse, "r", "w", f) == ({"value": 2}, False)
    assert cache.cached(warehouse, "r", "w", f) == ({"value": 2}, True)


def test_a_run_without_fingerprint_is_always_computed(run_dir: Path, warehouse: Path) -> None:
    ingest_run(run_dir, warehouse, run_id="r")
    m = manifest_path(warehouse, "r")
    doc = json.loads(m.read_text())
    doc["info"].pop("fingerprint")
    m.write_text(json.dumps(doc))
    f = Counter()
    assert cache.run_key(warehouse, "r", "w") is None
    cache.cached(warehouse, "r", "w", f)
    assert cache.cached(warehouse, "r", "w", f) == ({"value": 2}, False)
    assert not cache.cache_path(warehouse, "r", "w").exists()


def test_fit_refits_only_the_new_run(run_dir: Path, warehouse: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pt = PolyTrace(warehouse)
    pt.ingest(run_dir, run_id="a", refresh=False)
    fitted: list[str] = []
    real_fit_run = runs.fit_run

    def counting(root: Path, run_id: str, seed: int = 0) -> dict:
        fitted.append(run_id)
        return real_fit_run(root, run_id, seed)

    monkeypatch.setattr(runs, "fit_run", counting)
    first = pt.fit()
    pt.ingest(run_dir, run_id="b", refresh=False)
    second = pt.fit()
    assert fitted == ["a", "b"]  # "a" came from the cache the second time
    assert second["workloads"][next(iter(first["workloads"]))] == first["workloads"][next(iter(first["workloads"]))]
    # and it is the fit itself, byte for byte, not a different one
    fresh = pt.fit(["a"], cache=False)
    assert json.dumps(fresh["workloads"], sort_keys=True) == json.dumps(pt.fit(["a"])["workloads"], sort_keys=True)


@pytest.mark.slow
def test_fit_warehouse_says_which_runs_it_computed(run_dir: Path, warehouse: Path) -> None:
    pt = PolyTrace(warehouse)
    pt.ingest(run_dir, run_id="a", refresh=False)
    assert pt.fit_warehouse(seeds=(0, 1)).computed == ["a"]
    pt.ingest(run_dir, run_id="b", refresh=False)
    again = pt.fit_warehouse(seeds=(0, 1))
    assert again.computed == ["b"] and again.runs == ["a", "b"]
    assert pt.fit_warehouse(seeds=(0, 1), cache=False).computed == ["a", "b"]


STEP_ONLY = Path(__file__).resolve().parents[1] / "sample_logs" / "verl-gsm8k-ppo-v0.1"


def test_a_fit_from_summaries_is_cached_and_keyed_by_the_fitting_code(tmp_path: Path, warehouse: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "src" / "gsm8k"
    shutil.copytree(STEP_ONLY, d)
    pt = PolyTrace(warehouse)
    pt.ingest(d, run_id="steps", refresh=False)
    fitted: list[str] = []
    real = runs.fit_from_summaries

    def counting(root: Path, run_id: str) -> dict:
        fitted.append(run_id)
        return real(root, run_id)

    monkeypatch.setattr(runs, "fit_from_summaries", counting)
    first = pt.fit()
    assert first["workloads"]["steps"]["source"]["kind"] == "summaries"
    assert pt.fit() == first and fitted == ["steps"]  # the second came from the cache
    # the key holds the code digest of analyses/fit, the summary fit's modules included: one changed byte misses
    before = cache.code_digest.__wrapped__()
    original = Path.read_bytes
    for name in ("summary_fit.py", "stepshape.py", "summaries.py"):
        monkeypatch.setattr(Path, "read_bytes", lambda self, n=name: original(self) + (b"#" if self.name == n else b""))
        assert cache.code_digest.__wrapped__() != before, name
    monkeypatch.setattr(Path, "read_bytes", original)
    monkeypatch.setattr(cache, "code_digest", lambda: "another version")
    pt.fit()
    assert fitted == ["steps", "steps"]
