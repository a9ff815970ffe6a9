"""The facade: one warehouse and everything PolyTrace does with it.

The ``polytrace`` command line and the Dagster assets both call :class:`PolyTrace`; each method
delegates to one module (ingest, views, report, fit, fidelity, export) and adds nothing but
the warehouse's layout, so what the CLI prints and what the UI shows are the same numbers.

>>> pt = PolyTrace("warehouse")                             # doctest: +SKIP
>>> pt.ingest(Path("sample_logs/verl-gsm8k-ppo-v0.1"))      # doctest: +SKIP
>>> pt.view("length_quantiles")                            # doctest: +SKIP
>>> pt.report()                                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from analyses import catalog
from analyses.export.registry import export as export_spec
from analyses.export.registry import format_names
from analyses.export.spec import build_spec, read_spec, write_spec
from analyses.fit.data import load_run, runs_with_samples, runs_with_steps
from analyses.fit.fidelity import DEFAULT_SEEDS, Progress, fidelity, step_time_only
from analyses.fit.fidelity_table import criterion
from analyses.fit.runs import fit_runs
from analyses.ingest import ProgressFn, RunReport, ingest_run, resolve_run_id
from analyses.manifest import load_manifest
from analyses.objectstore import ObjectWarehouse, is_object_url
from analyses.report import ReportResult, Section, build_report, group_section
from analyses.sandbox import run_queries
from analyses.views import all_views, group, headline_frame, view_frame
from analyses.warehouse import DEFAULT_LOCK_WAIT_S, ENV_WAREHOUSE, default_root, run_ids

REPORT_NAME = "polytrace_report.html"

RUNS_SQL = """
SELECT r.run_id, r.task, r.model,
       (SELECT count(*) FROM source_files f WHERE f.run_id = r.run_id) AS files,
       (SELECT count(*) FROM source_files f WHERE f.run_id = r.run_id AND f.status NOT IN ('ok', 'partial')) AS file_errors,
       (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) AS steps,
       (SELECT count(*) FROM samples s WHERE s.run_id = r.run_id) AS samples,
       (SELECT count(*) FROM gpu_samples s WHERE s.run_id = r.run_id) AS gpu_samples,
       (SELECT count(*) FROM rejects s WHERE s.run_id = r.run_id) AS rejects
FROM runs r ORDER BY r.run_id
"""


@dataclass(frozen=True)
class OutputLayout:
    """Where derived outputs of a warehouse go, beside its ``parquet/`` tables and catalog."""

    root: Path

    @property
    def fits(self) -> Path:
        return self.root / "fits"

    @property
    def exports(self) -> Path:
        return self.root / "exports"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def spec_path(self, run_id: str | None = None) -> Path:
        """A run's spec, or the spec of every fitted run (``run_id=None``)."""
        return self.fits / (f"{run_id}.spec.json" if run_id else "all_runs.spec.json")

    @property
    def fidelity_path(self) -> Path:
        return self.fits / "fidelity.json"

    def export_dir(self, run_id: str, fmt: str) -> Path:
        return self.exports / run_id / fmt


@dataclass
class FitSummary:
    """What :meth:`PolyTrace.fit_warehouse` did: specs written, fidelity per run, what was skipped."""

    runs: list[str] = field(default_factory=list)
    specs: dict[str, Path] = field(default_factory=dict)  # run id (or "*" for all runs) -> spec file
    fidelity: list[dict[str, Any]] = field(default_factory=list)
    step_models: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class ExportSummary:
    """What :meth:`PolyTrace.export_all` wrote: files per run and format."""

    files: dict[str, dict[str, list[Path]]] = field(default_factory=dict)

    @property
    def n_files(self) -> int:
        return sum(len(fs) for per in self.files.values() for fs in per.values())

    @property
    def n_bytes(self) -> int:
        return sum(p.stat().st_size for per in self.files.values() for fs in per.values() for p in fs)


class PolyTrace:
    """One warehouse (Parquet tables + DuckDB catalog + derived outputs) and its operations."""

    def __init__(self, warehouse: Path | str | None = None) -> None:
        where = warehouse if warehouse is not None else os.environ.get(ENV_WAREHOUSE)
        # an s3:// warehouse is read through its local mirror: every read path below is unchanged
        self.store = ObjectWarehouse(str(where)) if is_object_url(where) else None
        self.root = self.store.mirror if self.store else (Path(where) if where else default_root())
        self.layout = OutputLayout(self.root)
        self._synced = False

    def __repr__(self) -> str:
        return f"PolyTrace({self.location!r})"

    def exists(self) -> bool:
        if self.store is not None:
            self.store.check()  # an unreachable store or a missing bucket says so, not "no runs"
            return bool(self.run_ids())  # an object-store warehouse exists once a run is published
        return self.root.exists()

    @property
    def location(self) -> str:
        """Where the warehouse is, as workers on other processes or machines must name it."""
        return self.store.url if self.store else str(self.root.resolve())

    def prepare(self) -> None:
        """Create the warehouse root, or check that the object store answers (before several
        processes ingest into it at once); :class:`~analyses.objectstore.StoreError` if not."""
        if self.store is not None:
            self.store.check()
        else:
            self.root.mkdir(parents=True, exist_ok=True)

    def read_root(self) -> Path:
        """The local directory every reader uses: the warehouse itself, or an object store's
        mirror brought up to date with what is published."""
        return self._sync()

    def _sync(self) -> Path:
        """The root every reader uses: for an object store, the mirror brought up to date once."""
        if self.store is not None and not self._synced:
            self.store.sync()
            self._synced = True
        return self.root

    # ------------------------------------------------------------------ warehouse

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with every table and view by name."""
        return catalog.connect(self._sync(), all_views())

    def refresh_catalog(self) -> Path:
        """Rewrite ``polytrace.duckdb`` (views only) so any DuckDB client sees every run."""
        return catalog.refresh_catalog(self._sync(), all_views())

    @property
    def catalog_path(self) -> Path:
        return catalog.catalog_path(self.root)

    def run_ids(self) -> list[str]:
        return run_ids(self._sync())

    def ingest(self, path: Path, run_id: str | None = None, progress: ProgressFn | None = None,
               refresh: bool = True, lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> RunReport:
        """Ingest one run (a directory of logs or a single file); see :func:`analyses.ingest.ingest_run`.

        The run's commit refreshes the catalog file's base tables; ``refresh`` also (re)creates
        every derived view there (skip it when ingesting many runs and refresh once at the end).
        """
        if self.store is not None:
            return self._ingest_to_store(path, run_id, progress, lock_wait_s)
        report = ingest_run(path, self.root, run_id=run_id, progress=progress, lock_wait_s=lock_wait_s)
        if refresh:
            self.refresh_catalog()
        return report

    def _ingest_to_store(self, path: Path, run_id: str | None, progress: ProgressFn | None,
                         lock_wait_s: float) -> RunReport:
        """Under the run's lease: build and check the run in a private local warehouse, exactly as
        on disk, then upload it with its manifest last (:meth:`ObjectWarehouse.publish`)."""
        assert self.store is not None
        rid = resolve_run_id(path.resolve(), load_manifest(path.resolve()), run_id)
        with self.store.lease(rid, lock_wait_s), tempfile.TemporaryDirectory(prefix="polytrace-stage-") as tmp:
            report = ingest_run(path, Path(tmp), run_id=rid, progress=progress, lock_wait_s=lock_wait_s)
            self.store.publish(Path(tmp), rid)
        self._synced = False
        return report

    # ------------------------------------------------------------------ views

    def runs(self) -> pl.DataFrame:
        """One row per run with its counts of files, steps, samples, telemetry and rejects."""
        return self.connect().sql(RUNS_SQL).pl()

    def query(self, sql: str) -> list[tuple[str, pl.DataFrame]]:
        """Run read-only SQL in DuckDB's sandbox (see :mod:`analyses.sandbox`): every statement
        with its result, or :class:`~analyses.sandbox.QueryRefused` before anything runs."""
        con = catalog.connect(self._sync(), all_views(), sandbox=True)
        try:
            return run_queries(con, sql)
        finally:
            con.close()

    def view(self, name: str, runs: Iterable[str] | None = None) -> pl.DataFrame:
        return view_frame(self.connect(), name, runs)

    def headline(self, group_name: str, runs: Iterable[str] | None = None) -> pl.DataFrame:
        return headline_frame(self.connect(), group_name, runs)

    def section(self, group_name: str, runs: Sequence[str] | None = None) -> Section:
        """A view group's headline table and figures, as the report and the Dagster asset show them."""
        con = self.connect()
        try:
            chosen = list(runs) if runs is not None else [r[0] for r in con.sql("SELECT run_id FROM runs ORDER BY 1").fetchall()]
            return group_section(con, group(group_name), chosen)
        finally:
            con.close()

    # ------------------------------------------------------------------ report

    def report(self, out: Path | None = None, runs: Iterable[str] | None = None, png: bool = True,
               png_dir: Path | None = None, all_pngs: bool = False) -> ReportResult:
        """The self-contained HTML report (default ``<warehouse>/reports/polytrace_report.html``)."""
        con = self.connect()
        try:
            return build_report(con, out if out is not None else self.layout.reports / REPORT_NAME, runs=runs, png=png,
                                png_dir=png_dir, all_pngs=all_pngs, source=self.location)
        finally:
            con.close()

    # ------------------------------------------------------------------ fit

    def runs_with_samples(self) -> list[str]:
        return runs_with_samples(self._sync())

    def runs_with_steps(self) -> list[str]:
        return runs_with_steps(self._sync())

    def fit(self, runs: Sequence[str] | None = None, seed: int = 0, out: Path | None = None,
            progress: Progress | None = None) -> dict[str, Any]:
        """Fit ``runs`` (default: every run with per-sample lengths) into one spec; write it to ``out``.
        ``progress`` receives ``run_start`` / ``run_done`` events (see :mod:`analyses.cli.work_progress`)."""
        spec = fit_runs(self._sync(), list(runs) if runs else None, seed=seed, progress=progress)
        if out is not None:
            write_spec(spec, out)
        return spec

    def fidelity(self, run_id: str, seeds: tuple[int, ...] = DEFAULT_SEEDS, progress: Progress | None = None) -> dict[str, Any] | None:
        """Our generator and PolyTrace's histogram resampler scored by rolling origin over one
        run (:mod:`analyses.fit.fidelity`); the step-time model alone for a run with a step log but
        no per-sample lengths; None when neither applies."""
        frames = load_run(self._sync(), run_id)
        if run_id in self.runs_with_samples():
            return fidelity(frames, seeds=seeds, progress=progress)
        return step_time_only(frames)

    @staticmethod
    def fidelity_criterion(results: list[dict[str, Any]]) -> dict[str, Any]:
        """Mean / minimum CRPS skill, pooled coverage, worst KS margin and the targets met."""
        return criterion(results)

    def fit_warehouse(self, seeds: tuple[int, ...] = DEFAULT_SEEDS, progress: Progress | None = None) -> FitSummary:
        """Specs and fidelity for every run: ``fits/<run>.spec.json``, ``fits/all_runs.spec.json``
        and ``fits/fidelity.json``. A run too small to fit is reported, not fatal for the others."""
        out = FitSummary()
        self._sync()
        self.layout.fits.mkdir(parents=True, exist_ok=True)
        specs: dict[str, dict[str, Any]] = {}
        for r in self.runs_with_samples():
            try:
                specs[r] = fit_runs(self.root, [r])
                out.specs[r] = write_spec(specs[r], self.layout.spec_path(r))
                out.runs.append(r)
            except ValueError as exc:
                out.skipped[r] = str(exc)
        if out.runs:
            # the all-runs spec is the per-run specs side by side: no second fit
            merged = build_spec({k: v for r in out.runs for k, v in specs[r]["workloads"].items()}, out.runs)
            out.specs["*"] = write_spec(merged, self.layout.spec_path())
        for r in out.runs:
            try:
                out.fidelity.append(fidelity(load_run(self.root, r), seeds=seeds, progress=progress))
            except ValueError as exc:
                out.skipped[r] = f"fidelity: {exc}"
        for r in self.runs_with_steps():
            if r not in out.runs:
                m = step_time_only(load_run(self.root, r))
                if m:
                    out.step_models.append(m)
        slim = [{k: v for k, v in r.items() if k != "real_per_step"} for r in [*out.fidelity, *out.step_models]]
        self.layout.fidelity_path.write_text(json.dumps(slim, indent=1) + "\n")
        return out

    def fidelity_results(self) -> list[dict[str, Any]]:
        """The fidelity scores of the last :meth:`fit_warehouse` (empty before the first)."""
        p = self.layout.fidelity_path
        return json.loads(p.read_text()) if p.exists() else []

    # ------------------------------------------------------------------ export

    def export(self, spec: dict[str, Any] | Path, fmt: str, out: Path, **options: Any) -> list[Path]:
        """Write ``spec``'s workloads in ``fmt`` under ``out`` (see :mod:`analyses.export.registry`)."""
        doc = read_spec(spec) if isinstance(spec, Path) else spec
        return export_spec(doc, fmt, out, **options)

    def export_all(self, seed: int = 0) -> ExportSummary:
        """Every fitted run's spec in every format, under ``exports/<run>/<format>/``."""
        out = ExportSummary()
        for r in sorted({res["run_id"] for res in self.fidelity_results() if "rolling_origin" in res}):
            sp = self.layout.spec_path(r)
            if not sp.exists():
                continue
            spec = read_spec(sp)
            out.files[r] = {fmt: export_spec(spec, fmt, self.layout.export_dir(r, fmt), seed=seed) for fmt in format_names()}
        return out
