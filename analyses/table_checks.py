"""Data-quality checks on warehouse tables, as plain functions.

Each check returns ``(passed, metadata)``: metadata is a flat dict of plain values (numbers,
strings, short lists) saying what was measured, so a failure explains itself wherever it is
shown (a Dagster asset check, a test, the CLI). The ``*_partition`` helpers read one run's
partition from the warehouse and call the frame-level check.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from analyses.metadata import dtype_name
from analyses.schema import TABLES, Table
from analyses.warehouse import partition_files, scan_table

CheckOutcome = tuple[bool, dict[str, Any]]

# a reject share above this (rejected / candidate lines) is worth a look; see check_reject_share
MAX_REJECT_SHARE = 0.05
# step metrics logged again later in the same file, as a share of the file's step metrics; a resumed
# run re-logs a few steps, a log concatenated to itself half of them (see check_repeated_share)
MAX_REPEATED_SHARE = 0.02
EXAMPLES = 10  # offending values listed in metadata
# source_files statuses of a file read to its end (its lines are accounted for)
READ_STATUSES = ("ok", "partial", "no_data")


def _table(table: Table | str) -> Table:
    return TABLES[table] if isinstance(table, str) else table


# --- schema ------------------------------------------------------------------------------------


def schema_problems(actual: Mapping[str, pl.DataType], table: Table | str) -> list[str]:
    """How one Parquet file's schema differs from the contract's stored columns (empty if equal)."""
    t = _table(table)
    want = t.stored_columns
    problems = [f"missing column {c}" for c in want if c not in actual]
    problems += [f"unexpected column {c}" for c in actual if c not in want]
    problems += [
        f"{c}: {dtype_name(actual[c])}, contract says {dtype_name(d)}"
        for c, d in want.items()
        if c in actual and actual[c] != d
    ]
    if not problems and list(actual) != list(want):
        problems.append("columns out of contract order")
    return problems


def check_schema(file_schemas: Mapping[str, Mapping[str, pl.DataType]], table: Table | str) -> CheckOutcome:
    """Every part file of a partition has exactly the contract's columns, dtypes and order.

    A partition with no part file fails too: a committed run always writes every table,
    an empty one included (see ``RunStaging.commit``).
    """
    t = _table(table)
    bad = {path: p for path, schema in file_schemas.items() if (p := schema_problems(schema, t))}
    meta: dict[str, Any] = {"table": t.name, "files": len(file_schemas), "files_failing": len(bad)}
    if not file_schemas:
        meta["problems"] = ["partition has no Parquet file"]
        return False, meta
    if bad:
        path, problems = next(iter(bad.items()))
        meta["first_failing_file"] = path
        meta["problems"] = problems[:EXAMPLES]
    return not bad, meta


def check_schema_partition(root: Path, table: str, run_id: str) -> CheckOutcome:
    files = partition_files(root, table, run_id)
    schemas = {p.name: pl.read_parquet_schema(p) for p in files}
    passed, meta = check_schema(schemas, table)
    meta["run_id"] = run_id
    return passed, meta


def blocking_problems(files: Mapping[str, Path]) -> list[str]:
    """What stops a staged run version from being published (empty: publish it).

    ``files`` maps each table to its one staged file. Every view and fit reads columns by name
    and type, so each file must match the contract; a duplicate or shuffled step double-counts
    or misplaces every per-step aggregate. The same checks run as blocking Dagster asset checks.
    """
    problems = []
    for name in TABLES:
        path = files.get(name)
        if path is None:
            problems.append(f"{name}: no file staged")
            continue
        passed, meta = check_schema({path.name: pl.read_parquet_schema(path)}, name)
        if not passed:
            problems.extend(f"{name}: {p}" for p in meta.get("problems", []))
    if "steps" in files:
        steps = pl.read_parquet(files["steps"], columns=["step"])
        if _strictly_ascending(steps.get_column("step")):  # the check passes: its counts are not needed
            return problems
        passed, meta = check_steps_unique_ordered(steps)
        if not passed:
            problems.append(f"steps: {meta['null_steps']} null, {meta['duplicated_steps']} duplicated, "
                            f"{meta['out_of_order_rows']} out-of-order step(s)")
    return problems


def _strictly_ascending(s: pl.Series) -> bool:
    """No null and each value above the one before: one row per step, in order (a run's staged
    steps), which is what :func:`check_steps_unique_ordered` passes, at a fraction of its cost
    (its group-by and distinct count took 0.3 s of every publish of a run of 870k steps)."""
    return s.null_count() == 0 and (s.len() < 2 or bool((s.diff(null_behavior="drop") > 0).all()))


# --- steps -------------------------------------------------------------------------------------


def check_steps_unique_ordered(steps: pl.DataFrame) -> CheckOutcome:
    """``steps`` as stored: step never null, one row per (run_id, step), ascending within a run.

    Downstream views join on (run_id, step) and compute drift over step order, so a duplicate
    would double-count and a shuffled order would misplace the drift.
    """
    by = ["run_id"] if "run_id" in steps.columns else []
    nulls = int(steps["step"].null_count())
    dup = (
        steps.filter(pl.col("step").is_not_null())
        .group_by([*by, "step"])
        .len()
        .filter(pl.col("len") > 1)
        .sort([*by, "step"])
    )
    # position of the first row whose step is not above the previous one of the same run
    prev = pl.col("step").shift(1).over(by) if by else pl.col("step").shift(1)
    disorder = steps.with_row_index("_row").filter(pl.col("step") <= prev)
    meta: dict[str, Any] = {
        "rows": steps.height,
        "distinct_steps": int(steps.select(pl.struct([*by, "step"]).n_unique()).item())
        if steps.height
        else 0,
        "null_steps": nulls,
        "duplicated_steps": dup.height,
        "out_of_order_rows": disorder.height,
    }
    if steps.height:
        meta["min_step"] = int(steps["step"].min())  # type: ignore[arg-type]
        meta["max_step"] = int(steps["step"].max())  # type: ignore[arg-type]
    if dup.height:
        meta["duplicate_examples"] = dup["step"].head(EXAMPLES).to_list()
    if disorder.height:
        meta["first_out_of_order_row"] = int(disorder["_row"][0])
    return nulls == 0 and dup.height == 0 and disorder.height == 0, meta


def check_steps_partition(root: Path, run_id: str) -> CheckOutcome:
    passed, meta = check_steps_unique_ordered(scan_table(root, "steps", [run_id]).collect())
    meta["run_id"] = run_id
    return passed, meta


# --- times -------------------------------------------------------------------------------------


def time_columns(table: Table | str) -> tuple[str, ...]:
    """Columns of ``table`` that hold a duration in seconds (by the contract's naming)."""
    t = _table(table)
    return tuple(
        c
        for c, d in t.columns.items()
        if d == pl.Float64() and (c.endswith("_time_s") or c.endswith("latency_s") or c == "seconds")
    )


TIME_TABLES: tuple[str, ...] = tuple(name for name in TABLES if time_columns(name))


def check_non_negative(df: pl.DataFrame, columns: tuple[str, ...] | list[str]) -> CheckOutcome:
    """No negative value in ``columns`` (nulls are fine: a stage the log did not time).

    NaN counts as a failure too: it means a reader let a non-number through.
    """
    cols = [c for c in columns if c in df.columns]
    if not cols:
        return True, {"rows": df.height, "columns_checked": []}
    counts = df.select(
        [(pl.col(c) < 0).sum().alias(f"neg:{c}") for c in cols]
        + [pl.col(c).is_nan().sum().alias(f"nan:{c}") for c in cols]
    ).row(0, named=True)
    negative = {c: int(counts[f"neg:{c}"] or 0) for c in cols if counts[f"neg:{c}"]}
    nan = {c: int(counts[f"nan:{c}"] or 0) for c in cols if counts[f"nan:{c}"]}
    meta: dict[str, Any] = {
        "rows": df.height,
        "columns_checked": cols,
        "negative_values": negative,
        "nan_values": nan,
    }
    if negative:
        c = next(iter(negative))
        meta["min_value"] = float(df[c].min())  # type: ignore[arg-type]
    return not negative and not nan, meta


def check_non_negative_partition(root: Path, table: str, run_id: str) -> CheckOutcome:
    cols = time_columns(table)
    passed, meta = check_non_negative(scan_table(root, table, [run_id]).select(cols).collect(), cols)
    meta["run_id"] = run_id
    return passed, meta


# --- line accounting and rejects ---------------------------------------------------------------


def check_lines_accounted(source_files: pl.DataFrame) -> CheckOutcome:
    """rows_ok + rows_rejected + rows_skipped == lines for every file that was read.

    Files that could not be read at all (error, unsupported, empty, skipped) have nothing to account for.
    """
    read = source_files.filter(pl.col("status").is_in(READ_STATUSES))
    off = read.filter(pl.col("rows_ok") + pl.col("rows_rejected") + pl.col("rows_skipped") != pl.col("lines"))
    meta: dict[str, Any] = {
        "files": source_files.height,
        "files_read": read.height,
        "files_unaccounted": off.height,
        "lines": int(read["lines"].sum()),
    }
    if off.height:
        meta["unaccounted_examples"] = [
            f"{r['path']}: lines={r['lines']} ok={r['rows_ok']} rejected={r['rows_rejected']} skipped={r['rows_skipped']}"
            for r in off.head(EXAMPLES).iter_rows(named=True)
        ]
    return off.height == 0, meta


def check_reject_share(
    source_files: pl.DataFrame, rejects: pl.DataFrame | None = None, max_share: float = MAX_REJECT_SHARE
) -> CheckOutcome:
    """Rejected lines are at most ``max_share`` of the candidate lines (parsed + rejected).

    Skipped lines (banners, config dumps, blank lines) are left out of the denominator: a console
    log is mostly noise, and counting it would hide a reader that rejects every step line.
    ``rejects`` (the table) adds the most frequent reasons to the metadata.
    """
    ok = int(source_files["rows_ok"].sum())
    rejected = int(source_files["rows_rejected"].sum())
    share = rejected / (ok + rejected) if ok + rejected else 0.0
    worst = (
        source_files.filter(pl.col("rows_rejected") > 0)
        .with_columns(share=pl.col("rows_rejected") / (pl.col("rows_ok") + pl.col("rows_rejected")))
        .sort("share", descending=True)
        .head(EXAMPLES)
    )
    meta: dict[str, Any] = {
        "rows_ok": ok,
        "rows_rejected": rejected,
        "reject_share": round(share, 6),
        "max_share": max_share,
        "files_with_rejects": int((source_files["rows_rejected"] > 0).sum()),
    }
    if worst.height:
        meta["worst_files"] = [
            f"{r['path']}: {r['share']:.2%} ({r['rows_rejected']:,})" for r in worst.iter_rows(named=True)
        ]
    if rejects is not None and rejects.height:
        reasons = (
            rejects.group_by("reason").len().sort(["len", "reason"], descending=[True, False]).head(EXAMPLES)
        )
        meta["top_reasons"] = {str(r): int(n) for r, n in reasons.iter_rows()}
        meta["rejects_rows"] = rejects.height
    return share <= max_share, meta


def check_rejects_partition(root: Path, run_id: str, max_share: float = MAX_REJECT_SHARE) -> CheckOutcome:
    sf = scan_table(root, "source_files", [run_id]).collect()
    rj = scan_table(root, "rejects", [run_id]).select("reason").collect()
    passed, meta = check_reject_share(sf, rj, max_share)
    meta["run_id"] = run_id
    return passed, meta


def check_lines_accounted_partition(root: Path, run_id: str) -> CheckOutcome:
    passed, meta = check_lines_accounted(scan_table(root, "source_files", [run_id]).collect())
    meta["run_id"] = run_id
    return passed, meta


# --- repeated steps ----------------------------------------------------------------------------


def check_repeated_share(source_files: pl.DataFrame, step_metric_rows: int,
                         max_share: float = MAX_REPEATED_SHARE) -> CheckOutcome:
    """Step metrics a file logged again later (``rows_repeated``: stored once, the later occurrence
    kept, docs/integrity.md) are at most ``max_share`` of the run's step metrics as read
    (``step_metric_rows`` stored + the repeated ones). A resumed run that re-logs a few steps into
    its log passes; a log concatenated to itself, or a run restarted from step 1 into the same file,
    does not: every count over its raw lines would be wrong, and the files say where."""
    repeated = int(source_files["rows_repeated"].sum())
    share = repeated / (step_metric_rows + repeated) if step_metric_rows + repeated else 0.0
    worst = source_files.filter(pl.col("rows_repeated") > 0).sort("rows_repeated", descending=True).head(EXAMPLES)
    meta: dict[str, Any] = {
        "step_metric_rows": step_metric_rows,
        "rows_repeated": repeated,
        "repeated_share": round(share, 6),
        "max_share": max_share,
        "rows_superseded": int(source_files["rows_superseded"].sum()),
    }
    if worst.height:
        meta["files_repeating_steps"] = [f"{r['path']}: {r['rows_repeated']:,} row(s) logged again later in the file"
                                         for r in worst.iter_rows(named=True)]
    return share <= max_share, meta


def check_repeated_partition(root: Path, run_id: str, max_share: float = MAX_REPEATED_SHARE) -> CheckOutcome:
    sf = scan_table(root, "source_files", [run_id]).collect()
    n = scan_table(root, "step_metrics", [run_id]).select(pl.len()).collect().item()
    passed, meta = check_repeated_share(sf, n, max_share)
    meta["run_id"] = run_id
    return passed, meta


# --- a run of nothing --------------------------------------------------------------------------


def check_run_has_data(source_files: pl.DataFrame) -> CheckOutcome:
    """Some file of the run gave a parsed line (``rows_ok > 0``). A directory of junk, binary files
    or logs of no known format lands (its ``source_files`` say why) but is not a run: nothing
    downstream should treat it as one. The metadata lists each file's status and reason."""
    parsed = int(source_files["rows_ok"].sum()) if source_files.height else 0
    meta: dict[str, Any] = {
        "files": source_files.height,
        "parsed_lines": parsed,
        "files_with_data": int((source_files["rows_ok"] > 0).sum()) if source_files.height else 0,
    }
    if not parsed:
        meta["files_and_reasons"] = [
            f"{r['path']}: {r['status']}" + (f" ({r['error']})" if r["error"] else "")
            for r in source_files.sort("path").head(EXAMPLES).iter_rows(named=True)
        ] or ["the run has no file"]
    return parsed > 0, meta


def check_run_has_data_partition(root: Path, run_id: str) -> CheckOutcome:
    passed, meta = check_run_has_data(scan_table(root, "source_files", [run_id]).collect())
    meta["run_id"] = run_id
    return passed, meta
