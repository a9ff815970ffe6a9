"""Append-only refresh: when a run's files only grew, read just the new lines.

A published version remembers, per input file (:mod:`analyses.append_state`), where its read
stopped, a digest of the 64 KiB before that point and its line accounting. At the next ingest of
the run, :func:`append_run` checks every file against it:

* same file list (no file added or removed), none shorter, the 64 KiB before the old end
  unchanged (same prefix: not rewritten, truncated or rotated);
* a file that grew was read to the end of a line last time, is plain text (not gzip), and its
  reader is ``resumable`` (each line parsed on its own: :attr:`analyses.readers.base.ReaderBase.resumable`);
* at most one file carries step metrics and one GPU telemetry (across files the full ingest
  deduplicates them: appended rows could change which copy wins);
* the run's facts (response-length cap, GPU count: :mod:`analyses.run_facts`) come out the same.

Then only the complete lines appended to each file are parsed (a partial last line waits for the
next refresh), staged as one new segment per table, and the new version publishes the previous
version's segments plus that one (:meth:`analyses.warehouse.RunStaging.commit` ``reuse``).
``steps`` is derived again from the first step the new lines touch on (a step depends on itself
and the step before it); ``step_windows``, ``source_files``, ``runs`` and ``run_config`` are
rebuilt (one row per step or file). Anything else raises :class:`AppendFallback`: the caller
ingests the run whole and reports why. The tables after any sequence of appends equal one full
ingest of the final files (tests/test_append_ingest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl

from analyses import resumable_sha256, run_facts
from analyses.alignment import derive_step_windows
from analyses.append_state import TAIL_BYTES, read_state, tail_digest
from analyses.atomic_output import writing
from analyses.ingest_files import (
    FileReport,
    ProgressFn,
    RunReport,
    append_info,
    content_fingerprint,
    discover_files,
    file_done,
    file_sha256,
    finish_run_tables,
    infer_facts,
    ingest_file,
    needs_truncation,
    set_status,
    stage_chunk,
)
from analyses.manifest import RunManifest
from analyses.readers import read_file, reader_by_name
from analyses.readers.base import FileContext, UnreadableFile
from analyses.readers.lines import LineWindow, line_window
from analyses.run_facts import ConfigFacts, with_truncation
from analyses.steps import StepsAccumulator, derive_steps
from analyses.table_checks import blocking_problems
from analyses.warehouse import PublishedRun, RunStaging, TableFile, read_published

# the tables readers write rows to: an append adds a segment to each; the others are rebuilt
APPENDED_TABLES = ("step_metrics", "samples", "turns", "tool_calls", "rank_times", "gpu_samples", "filter_batches",
                   "rejects")
REBUILT_TABLES = ("steps", "step_windows", "source_files", "runs", "run_config")
_NEWLINE_SEARCH = 1 << 20


class AppendFallback(Exception):
    """The run cannot be continued from its published version; ``note`` says why (None: there was
    no version to continue, which is no news)."""

    def __init__(self, note: str | None) -> None:
        super().__init__(note or "no published version")
        self.note = note


def _last_newline(path: Path, start: int, end: int) -> int:
    """The offset just past the last ``\\n`` in ``[start, end)`` of ``path``; ``start`` if none."""
    with open(path, "rb") as fh:
        pos = end
        while pos > start:
            lo = max(start, pos - _NEWLINE_SEARCH)
            fh.seek(lo)
            block = fh.read(pos - lo)
            i = block.rfind(b"\n")
            if i >= 0:
                return lo + i + 1
            pos = lo
    return start


# tables whose rows say their file and line (path, line_no): those of a partial last line read by
# the previous version can be told apart and dropped; steps are derived again past them anyway
_LINE_TABLES = ("step_metrics", "rejects", "steps")


class _Grown:
    """A file that grew: read bytes ``[start, end)``, numbering from ``first_line``, on from the
    counts in ``prev`` (the previous read, less its partial last line when it had one: ``drop``)."""

    def __init__(self, idx: int, path: Path, rel: str, prev: dict, end: int) -> None:
        self.idx, self.path, self.rel, self.end = idx, path, rel, end
        part = prev.get("partial") if not prev["newline_end"] else None
        self.drop: dict | None = part
        if part is None:
            self.prev, self.start, self.first_line = prev, prev["size"], prev["lines"] + 1
            return
        base = dict(prev)
        for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped", "rows_out"):
            base[k] = prev[k] - part[k]
        if part["first_reason"] is not None and base["rows_rejected"] == 0:
            base["first_reason"] = None  # the partial line gave the file's first reject
        base["sha_state"] = part["sha_state"]
        self.prev, self.start, self.first_line = base, part["offset"], part["line_no"]


def _reads_siblings(fmt: str) -> bool:
    try:
        return bool(getattr(reader_by_name(fmt), "reads_siblings", False))
    except KeyError:
        return False


def _plan(run_path: Path, prev: PublishedRun, manifest: RunManifest) -> tuple[list[tuple[Path, str]], list[_Grown],
                                                                              set[str]]:
    """Every input file (path, rel) in ingest order, those that grew with where to read to, and the
    files added since (read whole); :class:`AppendFallback` when the previous version cannot be
    continued."""
    state = prev.info.get("append")
    if not isinstance(state, dict) or not isinstance(state.get("files"), dict):
        raise AppendFallback("full ingest: the published version keeps no append state (written before it existed, "
                             "or from part of a directory)")
    known: dict = state["files"]
    found = discover_files(run_path, manifest)
    files = [(p, p.name if run_path.is_file() else p.relative_to(run_path).as_posix()) for p in found.files]
    rels = {rel for _, rel in files}
    added = rels - set(known)
    if added and any(rec is not None and _reads_siblings(rec["format"]) for rec in known.values()):
        raise AppendFallback(f"full ingest: new file {sorted(added)[0]} beside an archive whose members it may copy")
    if set(known) - rels:
        raise AppendFallback(f"full ingest: file {sorted(set(known) - rels)[0]} is gone")
    grown: list[_Grown] = []
    metric_files, gpu_files = 0, 0
    for idx, (path, rel) in enumerate(files):
        if rel in added:
            continue
        rec = known[rel]
        if rec is None:
            raise AppendFallback(f"full ingest: {rel} changed while it was last read")
        metric_files += "step_metrics" in rec["tables"]
        gpu_files += "gpu_samples" in rec["tables"]
        try:
            size = path.stat().st_size
            if size < rec["size"]:
                raise AppendFallback(f"full ingest: {rel} is shorter than when last read (truncated or rotated)")
            if tail_digest(path, rec["size"]) != rec["tail"]:
                raise AppendFallback(f"full ingest: {rel} was rewritten (its last {TAIL_BYTES >> 10} KiB read differ)")
        except OSError as exc:
            raise AppendFallback(f"full ingest: {rel}: {exc}") from exc
        if size == rec["size"]:
            continue
        part = rec.get("partial")
        why = ("it is gzip" if rec["gzip"]
               else f"its format ({rec['format']}) is not read line by line" if not rec["resumable"]
               else f"it was {rec['status']}" if rec["status"] not in ("ok", "partial")
               else "its last line read had no newline" if not rec["newline_end"] and (
                   part is None or not set(part["tables"]) <= set(_LINE_TABLES))
               else None)
        if why:
            raise AppendFallback(f"full ingest: {rel} grew and {why}")
        end = _last_newline(path, rec["size"], size)
        if end > rec["size"]:
            grown.append(_Grown(idx, path, rel, rec, end))
            metric_files += "step_metrics" not in rec["tables"]  # may gain them now: counted as a carrier
    if metric_files > 1 or gpu_files > 1:
        raise AppendFallback(_SEVERAL)
    return files, grown, added


_SEVERAL = "full ingest: several files carry step metrics or GPU telemetry (deduplicated across files)"


def _report_of(rec: dict, rel: str) -> FileReport:
    fr = FileReport(path=rel, format=rec["format"], bytes=rec["size"], lines=rec["lines"], rows_ok=rec["rows_ok"],
                    rows_rejected=rec["rows_rejected"], rows_skipped=rec["rows_skipped"], rows_out=rec["rows_out"],
                    status=rec["status"], error=rec["error"])
    fr.rows_superseded, fr.rows_repeated = rec.get("rows_superseded", 0), rec.get("rows_repeated", 0)
    fr.tables = set(rec["tables"])
    fr.first_reason = rec["first_reason"]
    return fr


def _read_appended(g: _Grown, rid: str, manifest: RunManifest, staging: RunStaging, emit: ProgressFn,
                   attrs: list[pl.DataFrame], run_files: frozenset[Path]) -> FileReport:
    """Parse lines ``[prev size, end)`` of a grown file into the staging; its report continues the previous one."""
    import time

    t0 = time.perf_counter()
    rec = g.prev
    fr = _report_of(rec, g.rel)
    reader = reader_by_name(rec["format"])
    ctx = FileContext(run_id=rid, path=g.path, rel_path=g.rel, manifest=manifest, run_files=run_files)
    prefix = f"f{g.idx:05d}"
    emit("file_start", {"path": g.rel, "bytes": g.end - g.start})
    try:
        with line_window(LineWindow(g.path, g.start, g.end, g.first_line)):
            for chunk in read_file(reader, ctx):
                fr.lines += chunk.lines
                fr.rows_ok += chunk.rows_ok
                fr.rows_rejected += chunk.rows_rejected
                fr.rows_skipped += chunk.rows_skipped
                if chunk.step_attrs is not None and chunk.step_attrs.height:
                    attrs.append(chunk.step_attrs)
                stage_chunk(chunk, g.rel, prefix, staging, fr)
        staging.seal(prefix)
    except UnreadableFile as exc:  # the full read has the paths for what the window does not take
        raise AppendFallback(f"full ingest: {g.rel}: {exc}") from exc
    set_status(fr, fr.first_reason)
    fr.bytes = g.end
    sha_state = rec.get("sha_state")
    if sha_state and resumable_sha256.available():
        state = resumable_sha256.extend_file(sha_state, g.path, g.start, g.end)
        fr.sha256 = f"{resumable_sha256.digest(state)}:{state}"
    else:
        fr.sha256 = file_sha256(g.path, g.end)
    fr.state = read_state(g.path, fr, g.end, reader)
    return file_done(fr, t0, emit)


def _read_new(idx: int, path: Path, rel: str, rid: str, manifest: RunManifest, staging: RunStaging, emit: ProgressFn,
              attrs: list[pl.DataFrame], run_files: frozenset[Path]) -> FileReport:
    """A file added since the previous version, read whole as the full ingest reads it."""
    acc = StepsAccumulator()
    fr = ingest_file(idx, path, rel, rid, manifest, staging, acc, emit, run_files)
    if fr.format != "unknown" and _reads_siblings(fr.format):
        raise AppendFallback(f"full ingest: new file {rel} is an archive whose members may be copied beside it")
    got = acc.step_attrs()
    if got is not None:
        attrs.append(got.collect())
    return fr


class _Steps:
    """The new version's ``steps``: ``rows`` are the whole table, or (``appended``) the rows that
    follow the previous version's, which it keeps as they are (``old_max``: its last step)."""

    def __init__(self, rows: pl.DataFrame, appended: bool, old_max: int | None) -> None:
        self.rows, self.appended, self.old_max = rows, appended, old_max


def _steps(prev_scan: Callable[[str], pl.LazyFrame], new_sm: pl.LazyFrame, attrs: list[pl.DataFrame],
           n_gpus: int | None) -> _Steps | None:
    """``steps`` with the new rows: the previous rows before the first step the new lines touch
    (less one: a step reads the one before it), derived again from there on; None when unchanged.
    When the new lines only add steps after the previous version's last (a growing log), those
    rows alone (``appended``): re-reading and rewriting the whole table cost most of a refresh."""
    touched = pl.concat([new_sm.select(pl.col("step").cast(pl.Int64))]
                        + [a.lazy().select(pl.col("step").cast(pl.Int64)) for a in attrs]).select(pl.col("step").min())
    first = touched.collect().item()
    if first is None:
        return None
    lo = first - 1
    old_steps = prev_scan("steps").drop("run_id", strict=False)
    old_max = old_steps.select(pl.col("step").max()).collect().item()
    old_sm = prev_scan("step_metrics").filter(pl.col("step") >= lo)
    types = {"step": pl.Int64, "ts": pl.Datetime("us", "UTC"), "truncated_line": pl.Boolean}
    kept_attrs = old_steps.filter(pl.col("step") >= lo).select([pl.col(c).cast(t) for c, t in types.items()])
    new_attrs = [a.lazy().select([(pl.col(c).cast(t) if c in a.columns else pl.lit(None, dtype=t)).alias(c)
                                  for c, t in types.items()]) for a in attrs]
    cols = ["step", "metric", "value", "is_validation", "path", "line_no"]
    sm = pl.concat([old_sm.select(cols), new_sm.select(cols)], how="vertical_relaxed")
    again = derive_steps(sm, pl.concat([kept_attrs, *new_attrs]), n_gpus=n_gpus).filter(pl.col("step") > lo)
    again = again.drop("run_id", strict=False)
    if old_max is None or old_max <= lo:  # every previous row is kept as it is
        return _Steps(again.sort("step"), True, old_max)
    before = old_steps.filter(pl.col("step") <= lo).collect()
    return _Steps(pl.concat([before.select(again.columns), again], how="vertical_relaxed").sort("step"), False,
                  old_max)


_WINDOW_INPUTS = ("step", "ts", "step_time_s", "gen_time_s")


def _step_windows(prev: PublishedRun, root: Path, prev_scan: Callable[[str], pl.LazyFrame], steps: _Steps,
                  manifest: RunManifest) -> pl.DataFrame | None:
    """The ``step_windows`` rows of the steps after the previous version's, when its rows stay as
    they were (None: derive the table whole). A window reads its step and the steps before it
    (the previous logged time stamp, or the sum of step times since the run's start), never later
    ones; so the previous rows stay unless the method changes (the first time stamp arrives) or
    the run's start does (run.toml): the previous version's last window, derived again, says so."""
    old_n = sum(f.rows for f in prev.tables["step_windows"])
    old = prev_scan("steps").select(_WINDOW_INPUTS)
    old_ts = old.select(pl.col("ts").is_not_null().any()).collect().item()
    new_ts = steps.rows["ts"].is_not_null().any()
    if not old_ts and not new_ts and manifest.started_at is None:
        return derive_step_windows(steps.rows.head(0), manifest)  # no time stamp, no start: no window at all
    if steps.rows.height == 0 or old_n == 0 or (new_ts and not old_ts):
        return None  # (the first time stamps: every window is derived from them now)
    whole = derive_step_windows(pl.concat([old.collect(), steps.rows.select(_WINDOW_INPUTS)], how="vertical_relaxed"),
                                manifest)
    kept = whole.filter(pl.col("step") <= steps.old_max)
    if kept.height != old_n:
        return None
    cols = [c for c in kept.columns if c != "run_id"]  # the partition's, not in the file
    last = pl.scan_parquet(root / prev.tables["step_windows"][-1].path).select(cols).tail(1).collect()
    if not kept.select(cols).tail(1).equals(last):
        return None
    return whole.filter(pl.col("step") > steps.old_max)


def append_run(run_path: Path, root: Path, rid: str, manifest: RunManifest, report: RunReport, emit: ProgressFn,
               after_publish: Callable[[], None], source: str) -> PublishedRun:
    """Publish the run's appended lines as a new version (the caller holds the run lock), or raise
    :class:`AppendFallback`. ``source``: what the run is read from (the published one must be the same)."""
    prev = read_published(root, rid)
    if prev is None:
        raise AppendFallback(None)
    if prev.info.get("source") != source:  # the full ingest decides (and refuses another source's run)
        raise AppendFallback(None)
    files, grown, added = _plan(run_path, prev, manifest)
    known = prev.info["append"]["files"]
    staging = RunStaging(root, rid)
    try:
        emit("run_start", {"run_id": rid, "files": len(grown), "bytes": sum(g.end - g.start for g in grown)})
        attrs: list[pl.DataFrame] = []
        by_idx = {g.idx: g for g in grown}
        run_files = frozenset(p for p, _ in files)
        for idx, (path, rel) in enumerate(files):
            if idx in by_idx:
                report.files.append(_read_appended(by_idx[idx], rid, manifest, staging, emit, attrs, run_files))
            elif rel in added:
                report.files.append(_read_new(idx, path, rel, rid, manifest, staging, emit, attrs, run_files))
            else:
                fr = _report_of(known[rel], rel)
                fr.sha256 = known[rel]["sha256"]
                fr.state = dict(known[rel])
                report.files.append(fr)
        if sum("step_metrics" in f.tables for f in report.files) > 1 or sum(
                "gpu_samples" in f.tables for f in report.files) > 1:
            raise AppendFallback(_SEVERAL)
        found = discover_files(run_path, manifest)
        report.files.extend(FileReport(path=rel, format="unknown", bytes=0, status="skipped", error=why)
                            for rel, why in found.skipped)
        with writing(root):
            drops = {g.rel: g.drop["line_no"] for g in grown if g.drop is not None}
            _finish(staging, prev, report, manifest, run_path, attrs, after_publish, root, drops, source, grown)
    except BaseException:
        staging.abort()
        raise
    report.mode = "append"
    return prev


def _finish(staging: RunStaging, prev: PublishedRun, report: RunReport, manifest: RunManifest, run_path: Path,
            attrs: list[pl.DataFrame], after_publish: Callable[[], None], root: Path, drops: dict[str, int],
            source: str, grown: list[_Grown]) -> None:
    """Derive, rebuild and publish. ``drops``: per file, the partial last line the previous version
    read (its rows, from that line on, leave the line tables: the line is read again complete)."""
    dropped = pl.lit(False)
    for rel, line_no in drops.items():
        dropped = dropped | ((pl.col("path") == rel) & (pl.col("line_no") >= line_no))

    def prev_scan(table: str) -> pl.LazyFrame:
        lf = pl.scan_parquet([root / f.path for f in prev.tables[table]])
        return lf.filter(~dropped) if drops and table in ("step_metrics", "rejects") else lf

    def union(table: str) -> pl.LazyFrame:
        return pl.concat([prev_scan(table), staging.scan(table)], how="diagonal_relaxed")

    info = prev.info["append"]
    heads = _heads_unchanged(report, info["files"], grown)
    config, facts = infer_facts(union, report, manifest, run_path,
                                known=ConfigFacts(**info["config"]) if heads else None)
    if {**info["facts"]} != _asdict(facts) or {**info["config"]} != _asdict(config):
        raise AppendFallback("full ingest: the run's facts (response-length cap, GPU count, config) changed")
    if needs_truncation(facts, manifest):
        samples = staging.scan("samples")
        if samples.select(pl.col("truncated").is_null().any()).collect().item():
            staging.replace("samples", with_truncation(samples, facts.max_response_length).collect())
    _no_repeats(prev_scan, staging.scan("step_metrics"))
    reuse: dict[str, list[TableFile]] = {t: prev.tables[t] for t in APPENDED_TABLES if t in prev.tables}
    steps = _steps(prev_scan, staging.scan("step_metrics"), attrs, facts.n_gpus)
    if steps is None:
        reuse["steps"] = prev.tables["steps"]
        reuse["step_windows"] = prev.tables["step_windows"]
    elif steps.appended:  # one more segment of each, after the previous version's
        staging.replace("steps", steps.rows)
        reuse["steps"] = prev.tables["steps"]
        windows = _step_windows(prev, root, prev_scan, steps, manifest)
        if windows is None:
            whole = pl.concat([prev_scan("steps").select(_WINDOW_INPUTS).collect(),
                               steps.rows.select(_WINDOW_INPUTS)], how="vertical_relaxed")
            staging.replace("step_windows", derive_step_windows(whole, manifest))
        else:
            staging.replace("step_windows", windows)
            reuse["step_windows"] = prev.tables["step_windows"]
    else:
        staging.replace("steps", steps.rows)
        staging.replace("step_windows", derive_step_windows(steps.rows, manifest))
    rewritten = ("step_metrics", "rejects") if drops else ()
    for t in rewritten:  # without the partial line's rows (once: later reads stop at a newline)
        out = staging.dir / f"_{t}.parquet"
        union(t).sink_parquet(out, compression="zstd")
        staging.replace_with_file(t, out)
        reuse.pop(t, None)
    # a table counts its reused segments and what is staged (a table staged whole: that alone)
    if heads:  # run_config is read from the same heads
        reuse["run_config"] = prev.tables["run_config"]
    finish_run_tables(staging, report, manifest, config, facts, run_path, run_config=not heads,
                      scan=lambda t: union(t) if t in reuse else staging.scan(t))
    staging.commit(check=blocking_problems, holding_lock=True, after_publish=after_publish, reuse=reuse,
                   info={"source": source, "fingerprint": content_fingerprint(report.files),
                         "append": append_info(report, config, facts)})


_READ = ("ok", "partial")  # the statuses whose files' config dumps count (ingest_files.infer_facts)


def _heads_unchanged(report: RunReport, known: dict, grown: list[_Grown]) -> bool:
    """Whether the run's config dumps (read from the first ``CONFIG_HEAD_BYTES`` of its files)
    say what they said at the previous version: no file is new, each file that grew had that
    much already and was read as it is now (same format, ok or partial), so its head is the same
    bytes (an append keeps the prefix); re-reading them cost ~0.2 s of every refresh."""
    grown_rels = {g.rel for g in grown}
    for f in report.files:
        if f.status == "skipped" or f.path not in grown_rels:
            if f.status != "skipped" and f.path not in known:
                return False  # a new file
            continue
        rec = known[f.path]
        if rec["size"] < run_facts.CONFIG_HEAD_BYTES or rec["status"] not in _READ or f.status not in _READ:
            return False
    return True


_KEY = ["step", "metric", "is_validation"]


def _no_repeats(prev_scan: Callable[[str], pl.LazyFrame], new_sm: pl.LazyFrame) -> None:
    """The appended step metrics log no (step, metric) again, among themselves or over the previous
    rows (a resumed run re-logging its steps): the full ingest keeps the later copy of each
    (analyses.ingest, "Repeated steps"), which would mean rewriting earlier segments."""
    new = new_sm.select(_KEY).collect()
    if new.height == 0:
        return
    if new.height != new.unique().height:
        raise AppendFallback("full ingest: the appended lines log a step metric twice (the later copy wins)")
    first = new.get_column("step").min()
    old = prev_scan("step_metrics").filter(pl.col("step") >= first).select(_KEY).unique()
    if old.join(new.lazy(), on=_KEY, how="semi").select(pl.len()).collect().item():
        raise AppendFallback("full ingest: the appended lines log steps again (their later values replace the earlier)")


def _asdict(x: object) -> dict:
    from dataclasses import asdict

    return asdict(x)  # type: ignore[call-overload]
