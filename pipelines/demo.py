"""``python -m pipelines.demo`` (``make demo``): every run under the logs root, through Dagster.

Each immediate subdirectory of the logs root (default ``sample_logs/``) is a run. The demo adds
a ``runs`` partition per run, executes the per-run jobs for each partition (its ingest, then its
fit) and then the cross-run job, in process, against the persistent instance at ``$DAGSTER_HOME`` (default
``.dagster_home/``) so that ``make ui`` afterwards shows the runs, materializations and checks.
It ends with where the warehouse is, a few headline figures and the time it took.
"""

from __future__ import annotations

import gc
import os

if __name__ == "__main__":
    # `python -m pipelines.demo` only (the tests import this module): no cyclic collection while
    # dagster, the definitions and analyses are imported (~260,000 objects that live until exit,
    # walked again by each of the collections the imports set off); _script() freezes them
    gc.disable()
    # before numpy loads: one OpenBLAS thread, as `polytrace` has (analyses.cli.quiet_blas_threads)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dagster import AssetKey, DagsterInstance, Definitions, ExecuteInProcessResult

from analyses.api import REPORT_NAME, PolyTrace
from analyses.export.registry import check_exports
from analyses.fit.fidelity_table import fidelity_table
from pipelines.definitions import CATALOG_KEY, build_defs
from pipelines.instance_durability import relax_instance_durability
from pipelines.instance_storage import open_instance
from pipelines.partitions import RUNS_PARTITIONS_NAME, is_valid_key, runs_by_id
from pipelines.resources import DEFAULT_LOGS_ROOT, ENV_LOGS_ROOT, WarehouseResource
from pipelines.sensors import CROSS_RUN_JOB_NAME, FIT_RUN_JOB_NAME, INGEST_JOB_NAME

DEFAULT_DAGSTER_HOME = ".dagster_home"
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

# (label, SQL) printed after the runs; later stages append their scores here
HEADLINES: list[tuple[str, str]] = [
    ("runs", "SELECT count(*) FROM runs"),
    ("source files", "SELECT count(*) FROM source_files"),
    ("steps", "SELECT count(*) FROM steps"),
    ("step metrics", "SELECT count(*) FROM step_metrics"),
    ("samples", "SELECT count(*) FROM samples"),
    ("tool calls", "SELECT count(*) FROM tool_calls"),
    ("gpu samples", "SELECT count(*) FROM gpu_samples"),
    ("rejects", "SELECT count(*) FROM rejects"),  # reject records (a kept line may carry one too)
]


@dataclass
class CheckSummary:
    passed: int = 0
    failed: list[str] = field(default_factory=list)  # "run_id table:check (severity)"


@dataclass
class DemoResult:
    run_ids: list[str]
    per_run: dict[str, ExecuteInProcessResult]  # each run's ingest job
    cross_run: ExecuteInProcessResult | None
    checks: CheckSummary
    per_run_seconds: float = 0.0
    cross_run_seconds: float = 0.0
    per_run_fit: dict[str, ExecuteInProcessResult] = field(default_factory=dict)  # each run's fit job
    fit_seconds: float = 0.0  # of per_run_seconds, the fit jobs'

    @property
    def success(self) -> bool:
        results = [*self.per_run.values(), *self.per_run_fit.values(), *([self.cross_run] if self.cross_run else [])]
        return all(r.success for r in results)


def materialize_all(
    defs: Definitions,
    instance: DagsterInstance,
    logs_root: Path,
    quiet: bool = True,
    tags: dict[str, str] | None = None,
    cross_run_keys: Sequence[AssetKey] | None = None,
    fit: bool = True,
) -> DemoResult:
    """Add a partition per run directory, run the per-run jobs per partition (its ingest, then, with
    ``fit``, its fit), then the cross-run job (all of it, or only ``cross_run_keys``; an empty list
    skips it)."""
    runs = [rid for rid in runs_by_id(logs_root) if is_valid_key(rid)]
    existing = set(instance.get_dynamic_partitions(RUNS_PARTITIONS_NAME))
    new = [r for r in runs if r not in existing]
    if new:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, new)
    run_config = QUIET_RUN_CONFIG if quiet else None
    run_tags = {"polytrace/source": "demo", **(tags or {})}
    checks = CheckSummary()
    per_run: dict[str, ExecuteInProcessResult] = {}
    fits: dict[str, ExecuteInProcessResult] = {}
    ingest_job = defs.resolve_job_def(INGEST_JOB_NAME)
    fit_job = defs.resolve_job_def(FIT_RUN_JOB_NAME)
    # the catalog is refreshed once by the cross-run job below rather than after every run
    per_run_keys = [k for k in ingest_job.asset_layer.selected_asset_keys if k != CATALOG_KEY]
    t0 = time.perf_counter()
    fit_s = 0.0
    for rid in runs:
        res = ingest_job.execute_in_process(
            partition_key=rid,
            instance=instance,
            run_config=run_config,
            tags=run_tags,
            raise_on_error=False,
            asset_selection=per_run_keys,
        )
        per_run[rid] = res
        _tally(res, rid, checks)
        if fit and res.success:  # what the cross_run_automation sensor starts after an ingest
            tf = time.perf_counter()
            fits[rid] = fit_job.execute_in_process(
                partition_key=rid, instance=instance, run_config=run_config, tags=run_tags, raise_on_error=False
            )
            fit_s += time.perf_counter() - tf
            _tally(fits[rid], rid, checks)
    t1 = time.perf_counter()
    cross = None
    cross_job = defs.resolve_job_def(CROSS_RUN_JOB_NAME)
    selected = list(cross_job.asset_layer.selected_asset_keys if cross_run_keys is None else cross_run_keys)
    if selected:
        cross = cross_job.execute_in_process(
            instance=instance,
            run_config=run_config,
            tags=run_tags,
            raise_on_error=False,
            asset_selection=selected,
        )
        _tally(cross, "cross-run", checks)
    return DemoResult(runs, per_run, cross, checks, t1 - t0, time.perf_counter() - t1, fits, fit_s)


def _tally(res: ExecuteInProcessResult, label: str, into: CheckSummary) -> None:
    for ev in res.get_asset_check_evaluations():
        if ev.passed:
            into.passed += 1
        else:
            key = ev.asset_check_key
            into.failed.append(f"{label} {key.asset_key.to_user_string()}:{key.name} ({ev.severity.value})")


def headline_figures(root: Path) -> list[tuple[str, object]]:
    con = PolyTrace(root).connect(views=[])  # base tables only
    try:
        return [(label, con.execute(sql).fetchone()[0]) for label, sql in HEADLINES]  # type: ignore[index]
    finally:
        con.close()


def _run_line(rid: str, res: ExecuteInProcessResult, fit: ExecuteInProcessResult | None = None) -> str:
    mats = {e.asset_key.to_user_string(): e for e in res.get_asset_materialization_events()}

    def rows(table: str) -> int:
        ev = mats.get(table)
        if ev is None or ev.materialization is None:
            return 0
        v = ev.materialization.metadata.get("partition_row_count")
        return int(v.value) if v is not None else 0

    status = "ok" if res.success else "FAILED"
    if fit is not None and not fit.success:
        status += ", fit FAILED"
    return (
        f"  {rid}: {status}  files={rows('source_files')} steps={rows('steps')} samples={rows('samples')} "
        f"tool_calls={rows('tool_calls')} gpu_samples={rows('gpu_samples')} rejects={rows('rejects')}"
    )


INSTANCE_YAML = """\
# Written by `python -m pipelines.demo`: a local Dagster instance (SQLite under this directory),
# shared by `make demo` and `make ui`. Telemetry is off for this demo instance; delete these lines
# to turn it back on.
telemetry:
  enabled: false
"""


def ensure_instance_home(home: Path) -> None:
    """Create ``$DAGSTER_HOME`` with a dagster.yaml unless one is there (ours or the user's)."""
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(INSTANCE_YAML)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.demo",
        description="Ingest every run directory of the logs root through Dagster (in process) and print "
        "headline figures. The runs show in `make ui` afterwards.",
    )
    p.add_argument(
        "--logs-root",
        type=Path,
        default=None,
        help=f"directory of run directories (default: ${ENV_LOGS_ROOT} or {DEFAULT_LOGS_ROOT}/)",
    )
    p.add_argument(
        "--warehouse",
        type=Path,
        default=None,
        help="warehouse directory (default: $POLYTRACE_WAREHOUSE or warehouse/)",
    )
    p.add_argument(
        "--ingest-only",
        action="store_true",
        help="only the per-run assets and the catalog (skip characterize, fit, export)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="show Dagster's run logs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    t0 = time.perf_counter()
    env = WarehouseResource.from_env()
    logs_root = (args.logs_root or Path(env.logs_root)).resolve()
    root = (args.warehouse or Path(env.root)).resolve()
    if not logs_root.is_dir():
        print(f"demo: logs root {logs_root} is not a directory", file=sys.stderr)
        return 2
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(DEFAULT_DAGSTER_HOME).resolve())))
    ensure_instance_home(home)
    relax_instance_durability(home)  # ~1,000 events: no disk sync per event (see the module)

    warehouse = WarehouseResource(root=str(root), logs_root=str(logs_root))
    defs = build_defs(warehouse)
    with open_instance(home) as instance:  # the default SQLite storage with its connections kept open
        result = materialize_all(
            defs,
            instance,
            logs_root,
            quiet=not args.verbose,
            cross_run_keys=[CATALOG_KEY] if args.ingest_only else None,
            fit=not args.ingest_only,
        )
    print(
        f"ingested {len(result.run_ids)} run(s) from {logs_root} through Dagster "
        f"(per-run jobs {result.per_run_seconds:.1f}s, of which fits {result.fit_seconds:.1f}s; "
        f"cross-run job {result.cross_run_seconds:.1f}s):"
    )
    for rid, res in result.per_run.items():
        print(_run_line(rid, res, result.per_run_fit.get(rid)))
    if result.cross_run is not None and not result.cross_run.success:
        print("  cross-run job: FAILED")
    n_checks = result.checks.passed + len(result.checks.failed)
    print(f"asset checks: {result.checks.passed}/{n_checks} passed")
    for f in result.checks.failed:
        print(f"  failed: {f}")
    print(f"warehouse: {root}  (DuckDB catalog: {root / 'polytrace.duckdb'})")
    figures = headline_figures(root)
    print(
        "  "
        + "  ".join(
            f"{label}={value:,}" if isinstance(value, int) else f"{label}={value}" for label, value in figures
        )
    )
    pt = PolyTrace(root)
    report = pt.layout.reports / REPORT_NAME  # written by the characterization_report asset
    if report.exists():
        print(f"report: {report}  (self-contained HTML; key figures as PNG in {report.parent / 'png'})")
    scores = pt.fidelity_results()  # written by the workload_specs asset
    if scores:
        print("workload fidelity (rolling origin; ours vs PolyTrace's histogram):")
        print(fidelity_table(scores))
    # every run with a workload (fitted from samples or from per-step summaries) is exported in each format
    # whose variables its logs hold (the workload_exports asset)
    fitted = [r for r in pt.run_ids() if pt.layout.spec_path(r).exists()]
    verdicts = check_exports(pt.layout.exports, fitted)
    if any(v.problems for v in verdicts):
        # the consumers themselves (upstream PolyTrace's model, aiperf, vidur) run in `make conformance`;
        # here each format's declared consumer, how many runs it covered, and whether their files pass our
        # structural check of them
        print(f"exports of the {len(fitted)} run(s) with a workload (declared consumer; our structural check, "
              "`make conformance` runs the consumers):")
        for v in verdicts:
            print("  " + v.line())
    print(f"dagster instance: {home}  (see the runs with `make ui`, http://127.0.0.1:3000)")
    print(f"took {time.perf_counter() - t0:.1f}s")
    return 0 if result.success else 1


def _script() -> int:
    """``python -m pipelines.demo``: :func:`main`, the collector told what lives until exit."""
    gc.freeze()  # the imports and definitions: later collections no longer walk them
    gc.enable()
    code = main()
    # what is left lives until exit too: the interpreter's collections at exit (~1 s over the demo's
    # heap on the 2-core machine, after the summary was printed) then walk almost nothing
    gc.freeze()
    return code


if __name__ == "__main__":
    raise SystemExit(_script())
