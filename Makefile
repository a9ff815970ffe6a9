# Everything a fresh clone needs: `make demo`, `make test`, `make ui`, `make bench`, `make conformance`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export POLARS_MAX_THREADS ?= 2
# numpy's OpenBLAS spins a server thread per core for ~70 ms as it loads (analyses.cli.quiet_blas_threads)
export OPENBLAS_NUM_THREADS ?= 1
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install bytecode test demo ui bench bench-engine lint clean lock fuzz conformance conformance-env

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Python 3.11 needed, found {sys.version}"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,wandb,tensorboard]'
	touch $(STAMP)

install: $(STAMP)

# The package's bytecode, written ahead (only stale files are recompiled): with
# PYTHONDONTWRITEBYTECODE set, as on some CI and dev machines, every process the tests, the demo and
# the benchmarks start would otherwise compile the modules it imports from source. Only the
# packages: sample_logs/ and the test fixtures hold generator scripts, and a __pycache__ there
# would be one more file in a run directory
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 2 analyses pipelines

test: bytecode
	$(PY) -m ruff check analyses pipelines tests benchmarks sample_logs
	$(PY) -m pytest -n 2 --dist loadgroup -q --durations=25

# Consumer tools (aiperf, vidur) and the trace reference (HolisticTraceAnalysis 0.5.0, tests/test_trace_vs_hta.py)
# in their own cached venvs under ~/.cache/polytrace-conformance
# ($$POLYTRACE_CONFORMANCE_CACHE), never in .venv; a no-op once installed (keyed by version and lock file).
conformance-env: $(STAMP)
	$(PY) tests/conformance/consumers.py install

# Exports of the real PolyTrace runs handed to their consumers (docs/conformance.md); also part of `make test`.
# (every consumer run afresh: `make test` reuses a driver's verdicts on files of the same bytes, docs/conformance.md)
conformance: conformance-env
	POLYTRACE_CONFORMANCE_FRESH=1 $(PY) -m pytest tests/conformance -q

demo: bytecode
	@mkdir -p $(DAGSTER_HOME)
	$(PY) -m pipelines.demo

ui: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

# issue 29's targets as a user meets them: whole commands, each its own process, best of 5 (3 with
# --quick), interleaved, one PASS/MISS table beside the load (~3-4 min; BENCH_ARGS=--large adds the
# large verl log and v2 JSONL, --quick skips the demo); see benchmarks/README.md
bench: bytecode
	$(PY) benchmarks/user_commands.py $(BENCH_ARGS)

# every issue-14 engine target (in-process ratios), side by side, best of 3 (~8 min once its inputs
# are built, ~4 more the first time; BENCH_ENGINE_ARGS=--quick ~3 min); the single-topic harnesses
# (bench_verl_reader.py, bench_kineto_vs_hta.py, ...) run on their own
bench-engine: $(STAMP)
	$(PY) benchmarks/bench_all.py $(BENCH_ENGINE_ARGS)

# ruff's linter only: the code is not laid out by `ruff format` (174 files would change), so a
# format check here only ever failed
lint: $(STAMP)
	$(PY) -m ruff check analyses pipelines tests benchmarks sample_logs

# Regenerate constraints.txt from the current environment (after changing pyproject ranges).
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^polytrace' > constraints.txt

clean:
	rm -rf $(VENV) warehouse/parquet warehouse/*.duckdb .dagster_home

# Long fuzz runs (tests/fuzz), each over 2 processes, exit 1 if either found anything:
# - inputs: every reader through the real ingest, 100k mutated real inputs; prints crashes, hangs,
#   peak RSS and accounting violations;
# - statements: SQL of every statement type DuckDB parses through `polytrace query`'s code, 10k
#   inputs against a sample_logs warehouse with canaries; prints writes outside a scratch
#   directory, reads outside the published files, tracebacks (about 15 min on 2 idle cores).
FUZZ_ARGS ?= --inputs 100000 --procs 2
FUZZ_SQL_ARGS ?= --inputs 10000 --procs 2
fuzz: $(STAMP)
	@status=0; \
	echo "== input fuzzing: every reader through the real ingest"; \
	PYTHONPATH=$(CURDIR) $(PY) -m tests.fuzz.run $(FUZZ_ARGS) || status=1; \
	echo "== statement fuzzing: every kind of SQL statement through polytrace query"; \
	PYTHONPATH=$(CURDIR) $(PY) -m tests.fuzz.sql_run $(FUZZ_SQL_ARGS) || status=1; \
	exit $$status
