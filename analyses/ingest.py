"""Ingest one run: discover its files, sniff each, stream it through its reader, stage the
rows, derive ``steps``, account for every line in ``source_files``, and swap the run in.

A file that cannot be read at all is recorded with its status and error; the other files and
runs still land. Nothing in an input file is ever executed or ``eval``-ed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl

from analyses.alignment import derive_step_windows
from analyses.append_ingest import AppendFallback, append_run
from analyses.atomic_output import writing
from analyses.catalog import refresh_catalog
from analyses.ingest_files import (  # noqa: F401 - FileReport, RunFiles, ... are imported from here too
    FileReport,
    ProgressFn,
    RunFiles,
    RunReport,
    append_info,
    content_fingerprint,
    discover_files,
    finish_run_tables,
    infer_facts,
    needs_truncation,
)
from analyses.ingest_many import ingest_files
from analyses.manifest import RunManifest, load_manifest, run_id_from_name, validate_run_id
from analyses.readers import reader_by_name
from analyses.run_facts import (
    ConfigFacts,
    RunFacts,
    with_truncation,
)
from analyses.schema import STEP_METRICS
from analyses.steps import StepsAccumulator, derive_steps
from analyses.table_checks import blocking_problems
from analyses.warehouse import (
    DEFAULT_LOCK_WAIT_S,
    RunStaging,
    clean_stale,
    encode_empty_parts,
    kill_point,
    read_published,
    run_lock,
)


def resolve_run_id(run_path: Path, manifest: RunManifest, run_id: str | None) -> str:
    """The run's id: ``run_id`` (checked against the rule), else run.toml's, else the name of the
    directory (or file) made to follow the rule; :class:`RunIdError` when none can."""
    if run_id is not None:
        return validate_run_id(run_id)
    if manifest.run_id is not None:
        return validate_run_id(manifest.run_id, "run_id in run.toml")
    return run_id_from_name(run_path.name if run_path.is_dir() else run_path.stem)


def ingest_run(
    run_path: Path,
    root: Path,
    run_id: str | None = None,
    progress: ProgressFn | None = None,
    lock_wait_s: float = DEFAULT_LOCK_WAIT_S,
    only: frozenset[Path] | None = None,
    report_skipped: bool = True,
    skip_under: tuple[Path, ...] = (),
    source: str | None = None,
    replace: bool = False,
    previous: dict | None = None,
    append: bool = True,
    catalog_views: bool = False,
) -> RunReport:
    """Ingest ``run_path`` (a directory or one file) as one run into the warehouse at ``root``.

    When the run is published already from the same source and its files only grew since
    (``append``), only the appended lines are read and the new version reuses the previous one's
    files (:mod:`analyses.append_ingest`; ``report.mode == "append"``); anything else is a full
    ingest, and ``report.refresh_notes`` says why when the previous version could not be continued.

    The run is staged privately and published atomically (:meth:`RunStaging.commit`): readers
    see the previous version or the new one, whatever happens. A second writer of the same run
    id waits up to ``lock_wait_s`` (told through ``progress`` as ``"lock_wait"``) and then raises
    :class:`~analyses.warehouse.RunLocked`. A version that fails the blocking checks is kept
    aside and raises :class:`~analyses.warehouse.CommitRefused`. Re-ingesting the same inputs
    gives identical tables. The catalog file's base-table views are refreshed on publish; its
    derived views are the facade's business (:meth:`analyses.api.PolyTrace.refresh_catalog`), or
    created in the same refresh with ``catalog_views`` (one write of the file instead of two; an
    append-only refresh leaves them be: they are there from the run's first ingest).

    ``only``, ``report_skipped`` and ``skip_under`` ingest part of a directory that holds several
    runs (:func:`analyses.run_split.plan_runs`): only those files, and the files discovery skipped
    (symlinks out, ...) reported by one of the runs, not below another run's directory.

    ``source`` says what the run is read from (default: ``run_path``; a part of a directory says which,
    :attr:`analyses.run_split.PlannedRun.source`); it is recorded in the run's manifest. When the
    warehouse already holds the run id from another source with other content, the ingest raises
    :class:`RunSourceConflict` before publishing, unless ``replace``. ``previous``: the published
    run's manifest ``info`` when the warehouse is elsewhere (an object store); else it is read here.
    """
    t0 = time.perf_counter()
    run_path = run_path.resolve()
    manifest = load_manifest(run_path)
    rid = resolve_run_id(run_path, manifest, run_id)
    report = RunReport(run_id=rid, source=str(run_path))
    emit = progress or (lambda _e, _d: None)
    with writing(root):
        clean_stale(root)
    with run_lock(root, rid, lock_wait_s, on_wait=lambda msg: emit("lock_wait", {"run_id": rid, "message": msg})):
        if only is None and append and previous is None and _appended(run_path, root, rid, manifest, report, emit,
                                                                      source or str(run_path)):
            report.seconds = time.perf_counter() - t0
            emit("run_done", {"run_id": rid, "seconds": report.seconds})
            return report
        staging = RunStaging(root, rid)
        steps_acc = StepsAccumulator()
        try:
            found = discover_files(run_path, manifest)
            files = found.files if only is None else [f for f in found.files if f in only]
            skipped = [(rel, why) for rel, why in found.skipped
                       if report_skipped and not any((run_path / rel).is_relative_to(d) for d in skip_under)]
            emit("run_start", {"run_id": rid, "files": len(files), "bytes": sum(p.stat().st_size for p in files)})
            run_files = frozenset(files)
            one_file = run_path.is_file()
            report.files.extend(ingest_files(
                [(idx, path, path.name if one_file else path.relative_to(run_path).as_posix())
                 for idx, path in enumerate(files)],
                rid, manifest, staging, steps_acc, emit, run_files, after_each=lambda: kill_point("read"),
                meanwhile=lambda: _while_reading(catalog_views)))
            report.files.extend(FileReport(path=rel, format="unknown", bytes=0, status="skipped", error=why)
                                for rel, why in skipped)
            # from here on every read and write is the warehouse's own: a failure (a full disk) is
            # WriteFailed, never a bad input; nothing is published and the staging goes
            with writing(root):
                config, facts = _finish_run(staging, steps_acc, report, manifest, run_path)
                info = {"source": source or str(run_path), "fingerprint": content_fingerprint(report.files),
                        "append": append_info(report, config, facts) if only is None else None}
                if not replace:
                    check_same_source(rid, info, _published_info(root, rid) if previous is None else previous,
                                      run_path)
                staging.commit(check=blocking_problems, holding_lock=True,
                               after_publish=lambda: refresh_or_warn(root, report, catalog_views), info=info)
        except BaseException:
            staging.abort()
            raise
    report.seconds = time.perf_counter() - t0
    emit("run_done", {"run_id": rid, "seconds": report.seconds})
    return report


def _appended(run_path: Path, root: Path, rid: str, manifest: RunManifest, report: RunReport,
              emit: ProgressFn, source: str) -> bool:
    """Try the append-only refresh (holding the run lock); False (with the reason in the report,
    when there was a version to continue) means: ingest in full."""
    try:
        append_run(run_path, root, rid, manifest, report, emit, lambda: refresh_or_warn(root, report), source)
    except AppendFallback as exc:
        if exc.note:
            report.refresh_notes.append(exc.note)
        report.files.clear()
        report.table_rows.clear()
        return False
    return True


class RunSourceConflict(Exception):
    """The warehouse holds the run id from another source, with other content: publishing would
    silently replace that run (``polytrace ingest`` exits 2 with this one line; ``--replace``)."""


def check_same_source(run_id: str, new: dict, old: dict | None, run_path: Path) -> None:
    """Refuse (:class:`RunSourceConflict`) to publish run ``run_id`` read from ``new["source"]`` over
    the published one read from ``old["source"]``, unless it is the same run: the same source, the
    same content wherever it lives now (a moved directory: equal fingerprints), or a run an older
    version recorded by its whole directory (``run_path``) before that directory was split."""
    if not old or not old.get("source"):
        return
    if old["source"] in (new["source"], str(run_path)) or old.get("fingerprint") == new["fingerprint"]:
        return
    raise RunSourceConflict(
        f"run {run_id!r} in the warehouse came from {old['source']}; {new['source']} holds other logs and would "
        "replace it: give one of them another run id (--run-id, or run_id in run.toml), or pass --replace")


def _published_info(root: Path, run_id: str) -> dict | None:
    try:
        pub = read_published(root, run_id)
    except (OSError, ValueError):  # an unreadable manifest is the commit's business, not ours
        return None
    return pub.info if pub is not None else None


def _while_reading(catalog_views: bool) -> None:
    """What the commit needs later and a thread waiting for files being read can do: encode the
    empty tables' files and import the derived views' modules (~30, for the catalog refresh)."""
    encode_empty_parts()
    if catalog_views:
        from analyses.views import view_groups

        view_groups()


def refresh_or_warn(root: Path, report: RunReport, views: bool = False) -> None:
    """The catalog file follows the new version (with every derived view when ``views``); failing
    that is reported, not fatal: queries through ``polytrace``/the facade never read the file.
    Once it has every view after the run's publish (``report.catalog_views``), asking again
    does nothing (another publish since refreshed it with its own)."""
    if report.catalog_views:
        return
    try:
        if views:
            from analyses.views import all_views

            refresh_catalog(root, all_views())
            report.catalog_views = True
        else:
            refresh_catalog(root)
    except (TimeoutError, OSError, duckdb.Error) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        note = (f"catalog file not refreshed ({why}); run `polytrace ingest` again or open the warehouse "
                "through polytrace")
        if note not in report.warnings:
            report.warnings.append(note)


# the dedupe's DuckDB: bounded memory, spilling to the run's staging directory beyond it
DEDUPE_MEMORY_LIMIT = "256MB"


def _dedupe_step_metrics(staging: RunStaging, paths: list[str], repeated: list[str], report: RunReport) -> None:
    """Keep one row per step-metric key (step, metric, is_validation) of the run (the rule is in
    docs/integrity.md, "Repeated steps"): within a file, the later line wins (then the later row of
    that line): a step logged again (a resumed run re-logging its steps into the same log, a log
    concatenated to itself) keeps its last values, as ``steps`` does; across files, the more exact
    source (:data:`analyses.readers.base.METRIC_SOURCE_BINARY` first), then the later file by path.
    Each file's lost rows count as its ``rows_superseded``; those lost to a later copy in the same
    file also as its ``rows_repeated``.

    ``paths``: the files that gave step metrics; ``repeated``: those in which a key may occur more
    than once (:attr:`analyses.steps.StepsAccumulator.repeated_paths`, found while reading). One file
    without repeats is left alone (and not re-read). In DuckDB over the staged parts, in bounded
    memory (a fuzzed gzip of 2.5 M repeated metric rows took 0.9 GB sorted in Polars), as two hash
    aggregates and no sort of the rows: per file and key, then per key."""
    parts = [str(p) for p in staging.parts("step_metrics")]
    if not parts or (len(paths) < 2 and not repeated):
        return
    spill = staging.dir / "_spill"
    spill.mkdir(exist_ok=True)
    con = duckdb.connect(config={"memory_limit": DEDUPE_MEMORY_LIMIT, "temp_directory": str(spill), "threads": 2})
    out = staging.dir / "_dedupe.parquet"
    key = ", ".join(STEP_METRICS.key[1:])  # within one run
    cols = ", ".join(f'"{c}"' for c in STEP_METRICS.stored_columns)
    try:
        con.execute("SET enable_progress_bar = false")
        con.register("_staged", con.read_parquet(parts, filename=True, file_row_number=True))
        fmt = {f.path: f.format for f in report.files}
        ranks = pl.DataFrame({"path": paths, "_rank": [reader_by_name(fmt[p]).metric_source for p in paths]},
                             schema={"path": pl.String, "_rank": pl.Int64})
        con.register("_ranks", ranks.to_arrow())
        # per file and key: how many copies, and the last (line, then row as staged)
        con.execute(f"""
            CREATE TEMP TABLE _per_file AS
            SELECT {key}, path, count(*) AS n,
                   max_by(struct_pack({cols}, filename, file_row_number),
                          (coalesce(line_no, -1), filename, file_row_number)) AS w
            FROM _staged GROUP BY {key}, path""")
        counts = con.sql("SELECT path, sum(n), count(*) FROM _per_file GROUP BY path").fetchall()
        before = {p: int(n) for p, n, _k in counts}
        repeats = {p: int(n) - int(k) for p, n, k in counts if int(n) > int(k)}
        # per key, the best file's row, written in the order the rows were staged (file, then row)
        con.execute(f"""
            COPY (
                SELECT {", ".join(f'w."{c}" AS "{c}"' for c in STEP_METRICS.stored_columns)} FROM (
                    SELECT max_by(w, (-r._rank, p.path)) AS w FROM _per_file p JOIN _ranks r USING (path)
                    GROUP BY {key}
                ) ORDER BY w.filename, w.file_row_number
            ) TO '{out}' (FORMAT parquet)""")
        after = dict(con.read_parquet(str(out)).aggregate("path, count(*)", "path").fetchall())
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    if sum(after.values()) == sum(before.values()):
        out.unlink()
        return
    staging.replace_with_file("step_metrics", out)
    for f in report.files:
        dropped = before.get(f.path, 0) - after.get(f.path, 0)
        if dropped:
            f.rows_superseded = dropped
            f.rows_repeated = repeats.get(f.path, 0)
            f.rows_out -= dropped


def _dedupe_gpu_samples(staging: RunStaging, report: RunReport) -> None:
    """One telemetry sample once: a scrape that two files of the run both hold (a DCGM scrape saved
    as ``.prom`` and quoted in a ``.md``) has identical rows (host, gpu, ts, metric, value); the
    first file's are kept, the others' count as ``rows_superseded`` of their file."""
    parts = staging.parts("gpu_samples")
    if len({p.name.split("-", 1)[0] for p in parts}) < 2:
        return
    key = ["host", "gpu", "ts", "metric", "value"]
    lf = pl.scan_parquet(parts, include_file_paths="_part")
    n_dup = lf.select(pl.len() - pl.struct(key).n_unique()).collect().item()
    if not n_dup:
        return
    full = lf.with_columns(_file=pl.col("_part").str.extract(r"f(\d{5})-[^/]*$").cast(pl.Int64)).collect()
    kept = full.sort("_file", maintain_order=True).unique(subset=key, keep="first", maintain_order=True)
    dropped = (full.group_by("_file").len().join(kept.group_by("_file").len(), on="_file", how="left", suffix="_kept")
               .with_columns(d=pl.col("len") - pl.col("len_kept").fill_null(0)))
    staging.replace("gpu_samples", kept.drop("_part", "_file"))
    for idx, d in dropped.select("_file", "d").iter_rows():
        if d and idx is not None and idx < len(report.files):
            report.files[idx].rows_superseded += d
            report.files[idx].rows_out -= d


def _finish_run(
    staging: RunStaging, steps_acc: StepsAccumulator, report: RunReport, manifest: RunManifest, run_path: Path
) -> tuple[ConfigFacts, RunFacts]:
    _dedupe_step_metrics(staging, steps_acc.metric_paths, steps_acc.repeated_paths, report)
    _dedupe_gpu_samples(staging, report)
    config, facts = infer_facts(staging.scan, report, manifest, run_path)
    if needs_truncation(facts, manifest):
        samples = staging.scan("samples")
        if samples.select(pl.col("truncated").is_null().any()).collect().item():
            # written while the run's other tables are derived and staged
            staging.replace("samples", with_truncation(samples, facts.max_response_length).collect(), background=True)
    # the common case (one file of metrics, read in line order): steps were derived chunk by
    # chunk as the file was read; otherwise from the staged (deduplicated) rows
    if steps_acc.exact:
        steps = steps_acc.finish(n_gpus=facts.n_gpus)
    else:
        steps = derive_steps(staging.scan("step_metrics"), steps_acc.step_attrs(), n_gpus=facts.n_gpus)
    staging.replace("steps", steps)
    staging.replace("step_windows", derive_step_windows(steps, manifest))
    finish_run_tables(staging, report, manifest, config, facts, run_path)
    return config, facts


def iter_run_dirs(root: Path) -> Iterator[Path]:
    """Immediate subdirectories of ``root`` (each one run), hidden ones excluded."""
    for p in sorted(root.iterdir()):
        if p.is_dir() and not p.name.startswith("."):
            yield p
