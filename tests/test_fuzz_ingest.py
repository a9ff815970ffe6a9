"""The fuzz suite's fixed-seed share of ``make test``: mutated real inputs (truncation, byte flips,
NUL, invalid UTF-8, CRLF, huge lines, deep nesting, non-finite numbers, duplicate and
out-of-order lines, corrupt gzip, gzip bombs, empty and binary files) through the real ingest in
a worker process (:mod:`tests.fuzz`): no exception escapes, no input hangs, no input makes the
worker's resident set exceed 1 GiB, every file's lines are accounted for, and no file fails with
an exception a reader does not raise on purpose. ``make fuzz`` runs the same with 100k inputs."""

from __future__ import annotations

import pytest

from tests.fuzz.corpus import REAL_LOGS, seeds
from tests.fuzz.run import fuzz

SEED = 20260612
INPUTS = 300  # about a minute on an idle 2-core machine (6 runs of 50; the last with the default limits)


@pytest.mark.slow
def test_fuzz_fixed_seed_finds_nothing() -> None:
    assert len(seeds()) > 60, "the fuzz seeds (fixtures, real logs) were not found"
    if not REAL_LOGS.is_dir():
        from _ci import skip_or_fail

        skip_or_fail(f"real logs not found at {REAL_LOGS}: the fuzz corpus would miss them")
    s = fuzz(INPUTS, procs=1, master=SEED, batch=50, input_seconds=300, max_rss_mib=1024,
             default_limits_every=6, progress=False)
    assert s.inputs == INPUTS, s.text()
    assert s.findings == [], s.text()
    assert s.peak_rss_kb > 0  # the measure itself worked


# inputs the long run (make fuzz, seed 0) found, each fixed since: (batch, index)
FOUND = [(11, 28), (276, 44), (300, 4), (344, 3), (396, 28), (417, 40), (556, 23), (563, 21), (881, 35),
         (1010, 21), (1111, 17), (1111, 48), (1135, 22),
         # the TRL readers, found by the long run of 2026-11-25: a trainer_state.json nested 100,003 deep
         # (6.7 GB in DuckDB's JSON functions), a tqdm bar whose elapsed time overflowed a timestamp
         (24, 12), (229, 46), (219, 28),
         # the TRL console sniffer's regex backtracked for minutes over a 512 KB line; a wide
         # utilization header naming one GPU twice
         (526, 43), (791, 42), (1396, 11)]
# the same, found by the long run with master seed 1 (nvidia-smi dmon header of 40,000 fields)
FOUND_SEED_1 = [(180, 47), (1040, 11)]  # and a cut gzip counted its discarded rejects
# seed 2: a trainer_state entry of 8,208 keys in 238 KB flattened to 1.9 GB (json_each copies the record per key)
FOUND_SEED_2 = [(417, 18)]
# seed 3: a TRL step dict with completions/max_length 1e23 at a clipped step became the run's cap (int64 overflow)
FOUND_SEED_3 = [(1760, 46)]
# seed 4: an nvidia-smi CSV header of 13,106 fields built a column expression per field (2.0 GB)
FOUND_SEED_4 = [(1962, 36)]


def test_fuzz_findings_stay_fixed(tmp_path) -> None:
    from pathlib import Path

    from analyses.ingest import ingest_run
    from analyses.readers import limits
    from tests.fuzz.corpus import make_input
    from tests.fuzz.run import FUZZ_LIMITS
    from tests.fuzz.worker import EXPECTED_ERRORS

    if not REAL_LOGS.is_dir():
        from _ci import skip_or_fail

        skip_or_fail(f"real logs not found at {REAL_LOGS}: the findings' inputs derive from them")
    run = Path(tmp_path) / "run"
    found = [(0, b, i) for b, i in FOUND] + [(1, b, i) for b, i in FOUND_SEED_1] + [(2, b, i) for b, i in FOUND_SEED_2]
    found += [(3, b, i) for b, i in FOUND_SEED_3] + [(4, b, i) for b, i in FOUND_SEED_4]
    for m, b, i in found:
        inp = make_input(m, b, i, FUZZ_LIMITS["max_line_bytes"])
        (run / f"{m}-{b}-{i}").mkdir(parents=True)
        (run / f"{m}-{b}-{i}" / inp.name).write_bytes(inp.data)
    with limits.override(**FUZZ_LIMITS):
        rep = ingest_run(run, Path(tmp_path) / "wh")
    assert len(rep.files) == len(found)
    for f in rep.files:
        if f.status == "error":  # nothing of it lands: no row counts, whatever was read before the error
            assert f.rows_ok == f.rows_rejected == f.rows_skipped == f.rows_out == 0, f.path
        else:
            assert f.rows_ok + f.rows_rejected + f.rows_skipped == f.lines, f.path
        assert f.status != "error" or (f.error or "").startswith(EXPECTED_ERRORS), (f.path, f.error)
    assert rep.table_rows["rejects"] >= rep.rows_rejected
