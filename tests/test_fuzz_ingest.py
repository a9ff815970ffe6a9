"""The fuzz suite's fixed-seed share of ``make test``: mutated real inputs (truncation, byte flips,
NUL, invalid UTF-8, CRLF, huge lines, deep nesting, non-finite numbers, duplicate and
out-of-order lines, corrupt gzip, gzip bombs, empty and binary files) through the real ingest in
a worker process (:mod:`tests.fuzz`): no exception escapes, no input hangs, no input makes the
worker's resident set exceed 1 GiB, every file's lines are accounted for, and no file fails with
an exception a reader does not raise on purpose. ``make fuzz`` runs the same with 100k inputs."""

from __future__ import annotations

from tests.fuzz.corpus import REAL_LOGS, seeds
from tests.fuzz.run import fuzz

SEED = 20260612
INPUTS = 300  # about a minute on an idle 2-core machine (6 runs of 50; the last with the default limits)


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
