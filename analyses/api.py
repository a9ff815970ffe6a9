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
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from analyses import catalog
from analyses.atomic_output import write_text
from analyses.warehouse import DEFAULT_LOCK_WAIT_S, ENV_WAREHOUSE, default_root, reader_lease, run_ids

# Each method imports the module it delegates to: a command pays for what it uses (`polytrace runs`
# never loads the fits, the exports, plotly or the readers; tests/test_cli_imports.py).
if TYPE_CHECKING:
    import polars as pl

    from analyses.alerts import Alert, Delivery
    from analyses.fit.fidelity import Progress
    from analyses.ingest import ProgressFn, RunReport
    from analyses.report import ReportResult, Section
    from analyses.run_split import PlannedRun

REPORT_NAME = "polytrace_report.html"

# the tables `polytrace runs` counts for each run, and that query: every table counted once,
# grouped by run (a correlated count per run and table took 2.7x the CPU)
RUN_COUNTS = ("steps", "samples", "tool_calls", "rank_times", "gpu_samples", "rejects")
RUNS_SQL = f"""
WITH counts AS ({" UNION ALL ".join(f"SELECT run_id, '{t}' AS t, count(*) AS n FROM {t} GROUP BY run_id" for t in RUN_COUNTS)}),
files AS (SELECT run_id, count(*) AS files, count(*) FILTER (WHERE status NOT IN ('ok', 'partial')) AS file_errors
          FROM source_files GROUP BY run_id)
SELECT r.run_id, r.task, r.model, r.n_gpus, r.n_gpus_source, r.max_response_length, r.max_response_length_source,
       coalesce(f.files, 0) AS files, coalesce(f.file_errors, 0) AS file_errors,
       {", ".join(f"coalesce((SELECT c.n FROM counts c WHERE c.run_id = r.run_id AND c.t = '{t}'), 0) AS {t}"
                  for t in RUN_COUNTS)}
FROM runs r LEFT JOIN files f USING (run_id) ORDER BY r.run_id
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

    @property
    def comparisons(self) -> Path:
        return self.reports / "comparisons"

    def comparison_path(self, a: str, b: str, suffix: str = ".html") -> Path:
        """``reports/comparisons/<B>__vs__<A>.html`` (``:`` of a step range becomes ``_``)."""
        from analyses.figures import safe_key

        return self.comparisons / f"{safe_key(b)}__vs__{safe_key(a)}{suffix}"


@dataclass
class FitSummary:
    """What :meth:`PolyTrace.fit_warehouse` did: specs written, fidelity per run, what was skipped."""

    runs: list[str] = field(default_factory=list)
    specs: dict[str, Path] = field(default_factory=dict)  # run id (or "*" for all runs) -> spec file
    fidelity: list[dict[str, Any]] = field(default_factory=list)
    step_models: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    computed: list[str] = field(default_factory=list)  # runs fitted or scored now (the others came from the cache)


@dataclass
class RunFit:
    """What :meth:`PolyTrace.fit_run` did for one run."""

    run_id: str
    spec: dict[str, Any] | None = None
    spec_path: Path | None = None
    fidelity: dict[str, Any] | None = None
    step_model: dict[str, Any] | None = None
    skipped: str | None = None
    computed: bool = False  # fitted or scored now (False: everything came from the cache)
    # a step-only run's fitted per-step quantiles beside its logged min/mean/max (analyses.fit.summary_fit.summary_check)
    summary_check: pl.DataFrame | None = None

    @property
    def from_summaries(self) -> bool:
        return self.spec is not None and any((w.get("source") or {}).get("kind") == "summaries"
                                             for w in self.spec["workloads"].values())


@dataclass
class ExportSummary:
    """What :meth:`PolyTrace.export_all` wrote: files per run and format."""

    files: dict[str, dict[str, list[Path]]] = field(default_factory=dict)
    missing: dict[str, dict[str, str]] = field(default_factory=dict)  # run -> format -> why it could not be written

    @property
    def n_files(self) -> int:
        return sum(len(fs) for per in self.files.values() for fs in per.values())

    @property
    def n_bytes(self) -> int:
        return sum(p.stat().st_size for per in self.files.values() for fs in per.values() for p in fs)


def _seeds(seeds: tuple[int, ...] | None) -> tuple[int, ...]:
    """``seeds``, or the fidelity protocol's when None (:data:`analyses.fit.fidelity.DEFAULT_SEEDS`)."""
    if seeds is not None:
        return seeds
    from analyses.fit.fidelity import DEFAULT_SEEDS

    return DEFAULT_SEEDS


class PolyTrace:
    """One warehouse (Parquet tables + DuckDB catalog + derived outputs) and its operations."""

    def __init__(self, warehouse: Path | str | None = None) -> None:
        from analyses.objectstore import ObjectWarehouse, is_object_url

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

    def connect(self, shared: bool = False, views: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with every table and view by name. ``shared``: for a
        caller that only reads, a cursor on views this process created once for the warehouse as it
        is now (:func:`analyses.catalog.connect`): the methods here, and Dagster's assets, use it.
        ``views``: every table and only those views (and the views they read), for a caller that
        needs a few of them on a warehouse that just changed (never shared: the shared database
        holds every view)."""
        from analyses.views import all_views, views_reading

        if views is not None:
            return catalog.connect(self._sync(), views_reading(views))
        return catalog.connect(self._sync(), all_views(), shared=shared)

    def refresh_catalog(self) -> Path:
        """Rewrite ``polytrace.duckdb`` (views only) so any DuckDB client sees every run."""
        from analyses.views import all_views

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
        from analyses.ingest import resolve_run_id
        from analyses.manifest import load_manifest
        from analyses.run_split import PlannedRun

        where = path.resolve()
        rid = resolve_run_id(where, load_manifest(where), run_id)
        return self.ingest_planned(PlannedRun(rid, where), progress=progress, refresh=refresh, lock_wait_s=lock_wait_s)

    def plan_runs(self, path: Path, run_id: str | None = None) -> list[PlannedRun]:
        """The runs ``path`` holds: one, or one per separate log (see :mod:`analyses.run_split`)."""
        from analyses.run_split import plan_runs

        return plan_runs(path, run_id)

    def ingest_planned(self, plan: PlannedRun, progress: ProgressFn | None = None, refresh: bool = True,
                       lock_wait_s: float = DEFAULT_LOCK_WAIT_S, replace: bool = False) -> RunReport:
        """Ingest one run of :meth:`plan_runs` (a whole directory or file, or its files of that run);
        ``replace``: publish it even over a run of that id from another source
        (:class:`analyses.ingest.RunSourceConflict`)."""
        from analyses.ingest import ingest_run, refresh_or_warn

        if self.store is not None:
            return self._ingest_to_store(plan, progress, lock_wait_s, replace)
        report = ingest_run(plan.path, self.root, run_id=plan.run_id, progress=progress, lock_wait_s=lock_wait_s,
                            only=plan.only, report_skipped=plan.report_skipped, skip_under=plan.skip_under,
                            source=plan.source, replace=replace, catalog_views=refresh)
        # the publish wrote every view (then this finds nothing to do) unless it failed; an append-only
        # refresh finds the derived views there from the run's first ingest
        if refresh and report.mode != "append":
            # the run is published either way: a catalog file that cannot be written (a full disk)
            # is a warning, as in the publish, never a traceback
            refresh_or_warn(self._sync(), report, views=True)
        return report

    def _ingest_to_store(self, plan: PlannedRun, progress: ProgressFn | None, lock_wait_s: float,
                         replace: bool = False) -> RunReport:
        """Under the run's lease: build and check the run in a private local warehouse, exactly as
        on disk, then upload it with its manifest last (:meth:`ObjectWarehouse.publish`)."""
        from analyses.ingest import ingest_run

        assert self.store is not None
        rid = plan.run_id
        with self.store.lease(rid, lock_wait_s) as lease, tempfile.TemporaryDirectory(prefix="polytrace-stage-") as tmp:
            published = self.store.published(rid)
            report = ingest_run(plan.path, Path(tmp), run_id=rid, progress=progress, lock_wait_s=lock_wait_s,
                                only=plan.only, report_skipped=plan.report_skipped, skip_under=plan.skip_under,
                                source=plan.source, replace=replace, previous=published.info if published else {})
            self.store.publish(Path(tmp), rid, lease=lease)
        self._synced = False
        return report

    # ------------------------------------------------------------------ views

    def runs(self) -> pl.DataFrame:
        """One row per run with its counts of files, steps, samples, tool calls, rank times, telemetry and
        rejects (a run of per-worker timings alone is not a row of zeros)."""
        return self.connect(shared=True).sql(RUNS_SQL).pl()

    def run_rows(self) -> list[dict[str, Any]]:
        """The rows of :meth:`runs` as dicts of plain values (``polytrace runs`` prints them without
        a frame: handing DuckDB's result to Polars would load pyarrow for a few lines). They read
        base tables only: the connection binds none of the derived views (most of a catalog's
        start-up)."""
        con = catalog.connect(self._sync())
        try:
            rel = con.sql(RUNS_SQL)
            return [dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()]
        finally:
            con.close()

    def query(self, sql: str) -> list[tuple[str, pl.DataFrame]]:
        """Run read-only SQL in DuckDB's sandbox (see :mod:`analyses.sandbox`): every statement
        with its result, or :class:`~analyses.sandbox.QueryRefused` before anything runs."""
        from analyses.sandbox import run_queries
        from analyses.views import all_views

        con = catalog.connect(self._sync(), all_views(), sandbox=True)
        try:
            return run_queries(con, sql)
        finally:
            con.close()

    def alerts(self, runs: Iterable[str] | None = None) -> list[Alert]:
        """The training-health alerts raised so far (``health_alerts``), by run and first step."""
        from analyses.alerts import run_alerts

        con = self.connect(shared=True)
        try:
            return run_alerts(con, runs)
        finally:
            con.close()

    def notify(self, alerts: Iterable[Alert], urls: list[str] | None = None) -> Delivery:
        """Send each of ``alerts`` not sent before to ``urls`` (default ``$POLYTRACE_NOTIFY``), once
        (:func:`analyses.alerts.deliver`; what was sent is kept beside the warehouse)."""
        from analyses.alerts import deliver, notify_urls, state_path

        return deliver(alerts, notify_urls() if urls is None else urls, state_path(self._sync()))

    def view(self, name: str, runs: Iterable[str] | None = None) -> pl.DataFrame:
        from analyses.views import view_frame

        return view_frame(self.connect(shared=True), name, runs)

    def headline(self, group_name: str, runs: Iterable[str] | None = None) -> pl.DataFrame:
        from analyses.views import headline_frame

        return headline_frame(self.connect(shared=True), group_name, runs)

    def section(self, group_name: str, runs: Sequence[str] | None = None) -> Section:
        """A view group's headline table and figures, as the report and the Dagster asset show them."""
        from analyses.views import group

        group(group_name)  # an unknown name is a KeyError, not an empty result
        return self.sections([group_name], runs)[group_name]

    def sections(self, group_names: Sequence[str], runs: Sequence[str] | None = None) -> dict[str, Section]:
        """Several view groups' sections (:meth:`section`) on one connection, the views they share
        materialized once, as the report builds them."""
        from analyses.report import group_sections

        con = self.connect(shared=True)
        try:
            chosen = list(runs) if runs is not None else [r[0] for r in con.sql("SELECT run_id FROM runs ORDER BY 1").fetchall()]
            return group_sections(con, list(group_names), chosen)
        finally:
            con.close()

    # ------------------------------------------------------------------ report

    def report(self, out: Path | None = None, runs: Iterable[str] | None = None, png: bool = True,
               png_dir: Path | None = None, all_pngs: bool = False, progress: Progress | None = None,
               on_section: Callable[[Section], None] | None = None) -> ReportResult:
        """The self-contained HTML report (default ``<warehouse>/reports/polytrace_report.html``);
        ``progress`` hears a step per section and one for the PNGs; ``on_section`` is handed each
        section as soon as it is built."""
        from analyses.figures import house_template
        from analyses.report import build_report, selected_runs
        from analyses.workload_section import workload_section

        con = self.connect(shared=True)
        try:
            with house_template():  # one template switch for the workload section and the report
                chosen = selected_runs(con, runs)
                extra = [workload_section(self._sync(), self.layout.spec_path, chosen)]
                return build_report(con, out if out is not None else self.layout.reports / REPORT_NAME, runs=chosen, png=png,
                                    png_dir=png_dir, all_pngs=all_pngs, source=self.location, progress=progress, extra=extra,
                                    on_section=on_section)
        finally:
            con.close()

    # ------------------------------------------------------------------ compare

    def compare(self, a: str, b: str, n_boot: int | None = None) -> Any:
        """What changed from ``a`` to ``b`` (runs, or step ranges ``run:1-100``): an
        :class:`analyses.compare.Comparison`, ranked biggest credible difference first. ValueError for
        a malformed side, KeyError for a run the warehouse lacks."""
        from analyses.compare import compare, parse_side
        from analyses.compare.stats import N_BOOT

        sa, sb = parse_side(a), parse_side(b)
        con = self.connect(shared=True)
        try:
            have = {r for (r,) in con.sql("SELECT run_id FROM runs").fetchall()}
            missing = [s.run_id for s in (sa, sb) if s.run_id not in have]
            if missing:
                raise KeyError(f"run(s) not in the warehouse: {', '.join(dict.fromkeys(missing))}")
            return compare(con, sa, sb, n_boot=n_boot or N_BOOT)
        finally:
            con.close()

    def latest_pair(self) -> tuple[str, str] | None:
        """(the run published before the latest, the latest): what ``run_comparison`` compares by
        default; None with fewer than two runs."""
        from analyses.warehouse import published_runs

        pub = sorted(published_runs(self._sync()).values(), key=lambda p: (p.version, p.run_id))
        return (pub[-2].run_id, pub[-1].run_id) if len(pub) >= 2 else None

    def compare_report(self, cmp: Any, out: Path | None = None, png: bool = True) -> ReportResult:
        """Write a comparison (:meth:`compare`) as one HTML page, its JSON beside it, and a PNG of its
        overlaid curves; default ``<warehouse>/reports/comparisons/<B>__vs__<A>.html``."""
        from analyses.report import build_comparison_report

        out = out if out is not None else self.layout.comparison_path(cmp.a.label, cmp.b.label)
        con = self.connect(shared=True)
        try:
            res = build_comparison_report(con, cmp, out, png=png, source=self.location)
        finally:
            con.close()
        write_text(out.with_suffix(".json"), json.dumps(cmp.to_dict(), indent=1) + "\n")
        return res

    # ------------------------------------------------------------------ fit

    def _reading(self) -> AbstractContextManager[None]:
        """A reader lease (:class:`~analyses.warehouse.ReaderLease`) for work that reads the
        published files outside a catalog connection (the fits): a re-ingest meanwhile keeps the
        files of the version being read instead of deleting them under it."""
        return reader_lease(self._sync())

    def runs_with_samples(self) -> list[str]:
        from analyses.fit.data import runs_with_samples

        with self._reading():
            return runs_with_samples(self.root)

    def runs_with_steps(self) -> list[str]:
        from analyses.fit.data import runs_with_steps

        with self._reading():
            return runs_with_steps(self.root)

    def runs_with_summaries(self) -> list[str]:
        """Runs with per-step length summaries and no per-sample lengths (fitted from the summaries)."""
        from analyses.fit.data import runs_with_summaries

        with self._reading():
            return runs_with_summaries(self.root)

    def fit(self, runs: Sequence[str] | None = None, seed: int = 0, out: Path | None = None,
            progress: Progress | None = None, cache: bool = True, skipped: dict[str, str] | None = None) -> dict[str, Any]:
        """Fit ``runs`` (default: every run with per-sample lengths or per-step length summaries) into
        one spec; write it to ``out``. ``progress`` receives ``run_start`` / ``run_done`` events (see
        :mod:`analyses.cli.work_progress`). An unchanged run's fit comes from :mod:`analyses.fit.cache`
        unless ``cache`` is False. ``skipped``: a run that cannot be fitted is recorded there (run id
        -> why) instead of raising."""
        from analyses.export.spec import write_spec
        from analyses.fit.runs import fit_runs

        with self._reading():
            spec = fit_runs(self.root, list(runs) if runs else None, seed=seed, progress=progress, cache=cache,
                            skipped=skipped)
        if out is not None:
            write_spec(spec, out)
        return spec

    def fidelity(self, run_id: str, seeds: tuple[int, ...] | None = None, progress: Progress | None = None,
                 cache: bool = True, from_summaries: bool = False) -> dict[str, Any] | None:
        """Our generator and PolyTrace's histogram resampler scored by rolling origin over one
        run (:mod:`analyses.fit.fidelity`); the step-time model alone for a run with a step log but
        no per-sample lengths; None when neither applies. ``from_summaries``: also the fit from the
        run's per-step summaries alone, scored beside them (``summary_fit``). An unchanged run's
        scores come from :mod:`analyses.fit.cache` unless ``cache`` is False."""
        with self._reading():
            return self._fidelity(run_id, _seeds(seeds), progress, cache, from_summaries)

    def _fidelity(self, run_id: str, seeds: tuple[int, ...], progress: Progress | None,
                  cache: bool, from_summaries: bool) -> dict[str, Any] | None:
        from analyses.fit.cache import cached
        from analyses.fit.data import has_samples, load_run
        from analyses.fit.fidelity import fidelity, step_time_only

        root = self.root
        if not has_samples(root, run_id):
            return step_time_only(load_run(root, run_id))

        def score() -> dict[str, Any]:
            return fidelity(load_run(root, run_id), seeds=seeds, progress=progress, from_summaries=from_summaries)

        if not cache:
            return score()
        what = "fidelity_from_summaries" if from_summaries else "fidelity"
        res, hit = cached(root, run_id, what, score, seeds=list(seeds))
        if hit and progress:
            progress("run_start", {"run_id": run_id, "origins": 0})
            progress("run_done", {"run_id": run_id})
        return res

    @staticmethod
    def fidelity_criterion(results: list[dict[str, Any]]) -> dict[str, Any]:
        """Mean / minimum CRPS skill, pooled coverage, worst KS margin and the targets met."""
        from analyses.fit.fidelity_table import criterion

        return criterion(results)

    def fit_run(self, run_id: str, seeds: tuple[int, ...] | None = None, progress: Progress | None = None,
                cache: bool = True) -> RunFit:
        """One run's spec (``fits/<run>.spec.json``) and fidelity, or its step-time model when it
        has only a step log; from :mod:`analyses.fit.cache` when the run is unchanged since its
        last fit (unless ``cache`` is False). Too little data is said in ``skipped``, not raised."""
        with self._reading():
            return self._fit_run(run_id, _seeds(seeds), progress, cache)

    def _fit_run(self, run_id: str, seeds: tuple[int, ...], progress: Progress | None, cache: bool) -> RunFit:
        from analyses.export.spec import write_spec
        from analyses.fit.cache import is_fresh
        from analyses.fit.data import has_samples, has_step_times, load_run
        from analyses.fit.fidelity import step_time_only
        from analyses.fit.runs import fit_runs

        out = RunFit(run_id)
        root = self.root
        if not has_samples(root, run_id):
            return self._fit_step_only(out, root, cache)
        out.computed = not (cache and is_fresh(root, run_id, "workloads", seed=0)
                            and is_fresh(root, run_id, "fidelity", seeds=list(seeds)))
        try:
            out.spec = fit_runs(root, [run_id], cache=cache)
        except ValueError as exc:
            out.skipped = str(exc)
            if has_step_times(root, run_id):  # too few samples to fit: the step log may still say something
                out.step_model = step_time_only(load_run(root, run_id))
            return out
        self.layout.fits.mkdir(parents=True, exist_ok=True)
        out.spec_path = write_spec(out.spec, self.layout.spec_path(run_id))
        try:
            out.fidelity = self.fidelity(run_id, seeds=seeds, progress=progress, cache=cache)
        except ValueError as exc:
            out.skipped = f"fidelity: {exc}"
        return out

    def _fit_step_only(self, out: RunFit, root: Path, cache: bool) -> RunFit:
        """A run without per-sample lengths: its workload from its per-step summaries (with the
        fitted per-step quantiles beside the logged ones) and its step-time model, where it has them."""
        import polars as pl

        from analyses.export.spec import write_spec
        from analyses.fit.cache import is_fresh
        from analyses.fit.data import has_step_times, has_summaries, load_run, load_summaries
        from analyses.fit.fidelity import step_time_only
        from analyses.fit.runs import fit_runs
        from analyses.fit.summary_fit import summary_check

        run_id = out.run_id
        if has_summaries(root, run_id):
            out.computed = not (cache and is_fresh(root, run_id, "workloads", seed=0))
            try:
                out.spec = fit_runs(root, [run_id], cache=cache)
            except ValueError as exc:
                out.skipped = str(exc)
            else:
                self.layout.fits.mkdir(parents=True, exist_ok=True)
                out.spec_path = write_spec(out.spec, self.layout.spec_path(run_id))
                summ = load_summaries(root, run_id).summaries
                out.summary_check = pl.concat([summary_check(w, summ) for w in out.spec["workloads"].values()],
                                              how="diagonal_relaxed")
        if has_step_times(root, run_id):
            out.step_model = step_time_only(load_run(root, run_id))
        if out.spec is None and out.step_model is None and out.skipped is None:
            out.skipped = "neither per-sample lengths, per-step length summaries nor step times"
        return out

    def fit_warehouse(self, seeds: tuple[int, ...] | None = None, progress: Progress | None = None,
                      cache: bool = True) -> FitSummary:
        """Specs and fidelity for every run: ``fits/<run>.spec.json``, ``fits/all_runs.spec.json``
        and ``fits/fidelity.json``. A run too small to fit is reported, not fatal for the others.
        A run unchanged since its last fit is not fitted or scored again unless ``cache`` is False,
        so this costs one run's fit per new or changed run (:meth:`fit_run` per run)."""
        with self._reading():
            return self._fit_warehouse(_seeds(seeds), progress, cache)

    def _fit_warehouse(self, seeds: tuple[int, ...], progress: Progress | None, cache: bool) -> FitSummary:
        from analyses.export.spec import build_spec, write_spec

        out = FitSummary()
        self.layout.fits.mkdir(parents=True, exist_ok=True)
        specs: dict[str, dict[str, Any]] = {}
        for r in sorted(set(self.runs_with_samples()) | set(self.runs_with_summaries()) | set(self.runs_with_steps())):
            f = self.fit_run(r, seeds=seeds, progress=progress, cache=cache)
            if f.computed:
                out.computed.append(r)
            if f.spec is not None and f.spec_path is not None:
                specs[r] = f.spec
                out.specs[r] = f.spec_path
                out.runs.append(r)
            if f.fidelity is not None:
                out.fidelity.append(f.fidelity)
            if f.step_model is not None:
                out.step_models.append(f.step_model)
            if f.skipped:
                out.skipped[r] = f.skipped
        if out.runs:
            # the all-runs spec is the per-run specs side by side: no second fit
            merged = build_spec({k: v for r in out.runs for k, v in specs[r]["workloads"].items()}, out.runs)
            out.specs["*"] = write_spec(merged, self.layout.spec_path())
        write_text(self.layout.fidelity_path, json.dumps([*out.fidelity, *out.step_models], indent=1) + "\n")
        return out

    def fidelity_results(self) -> list[dict[str, Any]]:
        """The fidelity scores of the last :meth:`fit_warehouse` (empty before the first)."""
        p = self.layout.fidelity_path
        return json.loads(p.read_text()) if p.exists() else []

    # ------------------------------------------------------------------ export

    def export(self, spec: dict[str, Any] | Path, fmt: str, out: Path, **options: Any) -> list[Path]:
        """Write ``spec``'s workloads in ``fmt`` under ``out`` (see :mod:`analyses.export.registry`)."""
        from analyses.export.registry import export as export_spec
        from analyses.export.spec import read_spec

        doc = read_spec(spec) if isinstance(spec, Path) else spec
        return export_spec(doc, fmt, out, **options)

    def export_all(self, seed: int = 0) -> ExportSummary:
        """Every fitted run's spec (from samples or from summaries) in every format its workload
        holds the variables for, under ``exports/<run>/<format>/``; a format a run's logs cannot
        feed (a step-only run without prompt lengths) is listed in ``missing`` with the reason."""
        from analyses.export.registry import ExportError, format_names
        from analyses.export.registry import export as export_spec
        from analyses.export.spec import read_spec

        out = ExportSummary()
        for r in sorted(self.run_ids()):
            sp = self.layout.spec_path(r)
            if not sp.exists():
                continue
            spec = read_spec(sp)
            # the warehouse's own exports/ directories: replaced whole whatever an older version left in them
            out.files[r] = {}
            drawn: dict = {}  # each workload's steps drawn once for all the formats
            for fmt in format_names():
                try:
                    out.files[r][fmt] = export_spec(spec, fmt, self.layout.export_dir(r, fmt), seed=seed, owned=True,
                                                    drawn=drawn)
                except ExportError as exc:
                    out.missing.setdefault(r, {})[fmt] = str(exc)
        return out
