# Everything a fresh clone needs: `make demo`, `make test`, `make ui`, `make bench`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export POLARS_MAX_THREADS ?= 2
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install test demo ui bench lint clean lock

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"Python 3.11 needed, found {sys.version}"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,wandb]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check analyses pipelines tests benchmarks sample_logs
	$(PY) -m pytest -n 2 --dist loadgroup -q

demo: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	$(PY) -m pipelines.demo

ui: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

bench: $(STAMP)
	$(PY) benchmarks/bench_verl_reader.py
	$(PY) benchmarks/bench_kineto_vs_hta.py
	$(PY) benchmarks/bench_fit.py
	$(PY) benchmarks/bench_fidelity.py

lint: $(STAMP)
	$(PY) -m ruff check analyses pipelines tests benchmarks sample_logs
	$(PY) -m ruff format --check analyses pipelines tests benchmarks

# Regenerate constraints.txt from the current environment (after changing pyproject ranges).
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^polytrace' > constraints.txt

clean:
	rm -rf $(VENV) warehouse/parquet warehouse/*.duckdb .dagster_home
