"""The statement fuzz suite's fixed-seed share of ``make test`` (``make fuzz`` runs 10,000 inputs):
generated SQL of every statement type DuckDB parses -- EXPLAIN / EXPLAIN ANALYZE of each,
comments anywhere, CTEs, nesting, table functions on paths inside and outside the warehouse,
COPY to published files and elsewhere -- through ``polytrace query``'s code against a warehouse
built from sample_logs, half the batches under Landlock: no file written outside the scratch
area, no canary read, no traceback. And the fuzzer's own detectors fire when the statement
check is switched off."""

from __future__ import annotations

import pytest

from analyses import landlock
from tests.fuzz.sql_run import fuzz_statements
from tests.fuzz.statements import SAMPLE_LOGS, Env, build_env

SEED = 20261126
INPUTS = 240


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    """One sample_logs run with the canaries (make fuzz: every run); the self-test, which writes
    into it, runs last."""
    return build_env(tmp_path_factory.mktemp("sqlfuzz"), [SAMPLE_LOGS / "verl-gsm8k-ppo-v0.1"])
EVERY_KIND = {"SELECT", "COPY", "EXPORT", "ATTACH", "PRAGMA", "SET", "INSTALL/LOAD", "CALL", "CREATE", "INSERT",
              "UPDATE", "DELETE", "ALTER", "DROP", "MERGE", "OTHER"}


def test_statement_fuzz_fixed_seed_finds_nothing(env: Env) -> None:
    s = fuzz_statements(INPUTS, procs=2, master=SEED, batch=INPUTS // 2, progress=False, timeout_s=0.3, env=env)
    assert s.inputs == INPUTS, s.text()
    assert s.findings == [], s.text()
    fam = s.families()
    assert set(fam) == EVERY_KIND, s.text()
    assert fam["COPY"][2] > 0 and fam["SELECT"][2] > 0, s.text()  # EXPLAIN ANALYZE of a write and of a query
    for outcome in ("ok", "refused", "duckdb_permission", "timeout", "parse_error"):
        assert s.outcomes[outcome] > 0, s.text()
    if landlock.abi() > 0:
        assert s.landlocked == INPUTS // 2 and s.abi == landlock.abi(), s.text()


def test_the_fuzzer_finds_the_writes_when_the_statement_check_is_off(env: Env) -> None:
    # one worker: with two, each would also see the other's writes in its own snapshot
    s = fuzz_statements(60, procs=1, master=SEED, batch=30, progress=False, timeout_s=0.3, disarm=True, env=env)
    kinds = {f["kind"] for f in s.findings}
    assert "write" in kinds, s.text()  # the batch without Landlock: COPY over published files
    if landlock.abi() > 0:
        assert "kernel_stop" in kinds, s.text()  # the batch under Landlock: the kernel refused them
        stopped = {f["input"] for f in s.findings if f["kind"] == "kernel_stop"}
        written = {f["input"] for f in s.findings if f["kind"] == "write" and f["input"] != "(all)"}
        assert all(int(i.split(":")[1]) >= 30 for i in written), s.text()  # no write got past Landlock
        assert stopped
