"""transformers' ``trainer_state.json`` (TRL ``GRPOTrainer``, Unsloth): the ``log_history``.

Every checkpoint of a ``Trainer`` run (``checkpoint-N/trainer_state.json``) and the output
directory hold this JSON document (``json.dumps(indent=2, sort_keys=True)``):
``{"best_metric": ..., "global_step": 12, "log_history": [{"completions/mean_length": 249.7,
"epoch": 2.5, "reward": 0.37, ..., "step": 10}, ...], "logging_steps": 10, "max_steps": 12,
"num_train_epochs": 3, ...}``. Each ``log_history`` entry is one ``Trainer.log`` call: a training
log (TRL's metrics averaged over the steps since the previous log), an evaluation log
(``eval_*``), or the end-of-training summary (``train_runtime``, ``train_loss``, ...). TRL >= 0.22
adds ``step_time`` (seconds per step, averaged the same way); older versions log no time at all.

Rules (line accounting unit: one ``log_history`` entry):

* **Step**: the entry's ``step`` (an integer >= 0; transformers always writes it); else
  ``round(epoch * max_steps / num_train_epochs)`` when the document gives both; else the
  entry's order among the training entries times ``logging_steps``. An entry without any is
  rejected, as is an entry that is not a JSON object.
* **Metrics**: the numeric leaves (:mod:`analyses.readers.flat_metrics` value rules), named by
  :func:`analyses.steps.canonical_metric` with transformers' names; ``epoch`` and ``step`` are
  bookkeeping; ``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``,
  ``train_loss``, ``total_flos`` describe the run, not a step, and are not stored. An entry left
  with no metric (the summary alone) is skipped; every other entry is parsed.
* The document is read whole (it is one JSON value); one that does not parse fails the file, and
  so does one over the document size limit, nested deeper than the JSON depth limit or holding
  more values than a parser should hold (:func:`check_document`; limits in
  :mod:`analyses.readers.limits`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl

from analyses.readers import limits
from analyses.readers.base import (
    METRIC_SOURCE_STRUCTURED,
    Chunk,
    FileContext,
    ReaderBase,
    UnreadableFile,
    rejects_frame,
)
from analyses.readers.flat_metrics import (
    add_counts,
    connect,
    dropped_counts,
    json_leaves,
    leaf_value,
    log_dropped,
)
from analyses.readers.json_scan import document_shape, split_too_deep
from analyses.readers.trl_console import BOOKKEEPING_KEYS, SUMMARY_KEYS
from analyses.steps import canonical_metric, is_validation_metric, resolve_alias_collisions

ENTRIES_PER_CHUNK = 5_000

_VALID_SQL = "SELECT json_valid(content) FROM read_text(?)"
_DOC_SQL = """
SELECT json_type(content) AS type,
       try_cast(json_extract_string(content, '$.logging_steps') AS DOUBLE) AS logging_steps,
       try_cast(json_extract_string(content, '$.max_steps') AS DOUBLE) AS max_steps,
       try_cast(json_extract_string(content, '$.num_train_epochs') AS DOUBLE) AS num_train_epochs,
       json_type(content, '$.log_history') AS history_type
FROM read_text(?)
"""
_ENTRIES_SQL = """
SELECT CAST(t.key AS BIGINT) + 1 AS line_no, t.value AS line, t.type AS type
FROM read_text(?) r, json_each(r.content, '$.log_history') t
ORDER BY line_no
"""


class TrainerStateReader(ReaderBase):
    metric_source = METRIC_SOURCE_STRUCTURED
    """transformers ``trainer_state.json`` documents."""

    name = "trl_trainer_state"
    framework = "trl"

    def sniff(self, head: str, path: Path) -> bool:
        return head.lstrip().startswith("{") and '"log_history"' in head and '"global_step"' in head

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        check_document(ctx.path)
        con, src = connect(), connect()  # src streams the entries while con flattens them
        dropped: dict[str, int] = {}
        try:
            doc = _document(con, ctx.path)
            reader = src.sql(_ENTRIES_SQL, params=[str(ctx.path)]).to_arrow_reader(ENTRIES_PER_CHUNK)
            order_base = 0  # training entries before this batch (for the order rule)
            for rb in reader:
                entries = pl.from_arrow(rb)
                assert isinstance(entries, pl.DataFrame)
                chunk, counts, n_train = _chunk(con, entries, doc, order_base)
                order_base += n_train
                add_counts(dropped, counts)
                yield chunk
        except duckdb.Error as exc:
            raise UnreadableFile(f"trainer_state.json: {type(exc).__name__}: {exc}") from exc
        finally:
            src.close()
            con.close()
        log_dropped(self.name, ctx.rel_path, dropped)


# a long run's log_history: 10,000 entries x 40 metrics; DuckDB holds ~200 bytes per JSON value
DOCUMENT_VALUES_PER_RECORD_LIMIT = 4


def check_document(path: Path) -> None:
    """Refuse a document DuckDB's JSON functions would parse at any cost: over the document size
    limit, nested deeper than the JSON depth limit (a fuzzed 600 KB document nested thousands deep
    took 6.7 GB), or holding more than ``DOCUMENT_VALUES_PER_RECORD_LIMIT`` x the per-record value
    limit. The document is one value, so it cannot be cut into records before a parser sees it."""
    lim = limits.current()
    size = path.stat().st_size
    if size > lim.max_document_bytes:
        raise UnreadableFile(f"trainer_state.json of {size} bytes, over the {lim.max_document_bytes}-byte document limit")
    depth, values = document_shape(path.read_bytes())
    if depth > lim.max_json_depth:
        raise UnreadableFile(f"trainer_state.json: json_too_deep: nested {depth} levels, over {lim.max_json_depth}")
    cap = DOCUMENT_VALUES_PER_RECORD_LIMIT * lim.max_json_values
    if values > cap:
        raise UnreadableFile(f"trainer_state.json: json_too_large: about {values} values, over {cap}")


def _document(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, float | None]:
    valid = con.execute(_VALID_SQL, [str(path)]).fetchall()
    if not valid or not valid[0][0]:
        raise UnreadableFile("trainer_state.json: not a valid JSON document (cut or corrupt?)")
    (kind, logging_steps, max_steps, epochs, history), = con.execute(_DOC_SQL, [str(path)]).fetchall()
    if kind != "OBJECT" or history != "ARRAY":
        raise UnreadableFile("trainer_state.json: no log_history array at the top level")
    return {"logging_steps": logging_steps, "max_steps": max_steps, "num_train_epochs": epochs}


def _chunk(
    con: duckdb.DuckDBPyConnection, entries: pl.DataFrame, doc: dict[str, float | None], order_base: int
) -> tuple[Chunk, dict[str, int], int]:
    """One chunk of ``log_history`` entries (``line_no`` = 1-based index, ``line`` = JSON text)."""
    objects, too_big = split_too_deep(entries.filter(pl.col("type") == "OBJECT").select("line_no", "line"),
                                      limits.current().max_json_depth)
    not_object = pl.concat([
        entries.filter(pl.col("type") != "OBJECT").select(
            "line_no", reason=pl.format("log_history entry is not an object but {}", pl.col("type")), raw="line"),
        too_big.select("line_no", "reason", raw="line"),
    ])
    leaves = json_leaves(con, objects) if objects.height else pl.DataFrame(
        schema={"line_no": pl.Int64, "name": pl.String, "kind": pl.String, "text": pl.String}
    )
    leaves = leaves.with_columns(value=leaf_value(pl.col("kind"), pl.col("text")))
    metric = ~pl.col("name").is_in([*BOOKKEEPING_KEYS, *SUMMARY_KEYS]) & pl.col("value").is_not_null()
    per = (
        objects.select("line_no")
        .join(
            leaves.group_by("line_no").agg(
                own=pl.col("value").filter(pl.col("name") == "step").first(),
                epoch=pl.col("value").filter(pl.col("name") == "epoch").first(),
                n_metrics=metric.sum(),
                is_eval=(pl.col("name").filter(metric).str.starts_with("eval_").all()) & (metric.sum() > 0),
            ),
            on="line_no",
            how="left",
        )
        .sort("line_no")
        .with_columns(pl.col("n_metrics").fill_null(0), pl.col("is_eval").fill_null(False))
    )
    training = (pl.col("n_metrics") > 0) & ~pl.col("is_eval")
    per = per.with_columns(order=pl.when(training).then(training.cum_sum() + order_base))
    own = pl.col("own")
    step = pl.when(own.is_finite() & (own >= 0) & (own == own.floor())).then(own)
    if doc["max_steps"] and doc["num_train_epochs"]:
        per_epoch = doc["max_steps"] / doc["num_train_epochs"]
        step = pl.coalesce(step, pl.when(pl.col("epoch") >= 0).then((pl.col("epoch") * per_epoch).round(0)))
    if doc["logging_steps"]:
        step = pl.coalesce(step, pl.col("order") * doc["logging_steps"])
    per = per.with_columns(step=step.cast(pl.Int64, strict=False))
    metric_lines = per.filter(pl.col("n_metrics") > 0)
    no_step = metric_lines.filter(pl.col("step").is_null()).select(
        "line_no", reason=pl.lit("log_history entry without a step (no step, epoch or logging_steps to place it)")
    )
    rows = (
        leaves.filter(metric)
        .join(per.filter(pl.col("step").is_not_null()).select("line_no", "step"), on="line_no", how="inner")
        .select(
            "step",
            metric=canonical_metric(pl.col("name"), hf=True),
            value="value",
            raw_metric="name",
            line_no="line_no",
        )
        .with_columns(is_validation=is_validation_metric(pl.col("metric")))
    )
    rows = resolve_alias_collisions(rows)
    raw_of = objects.select("line_no", raw="line")
    rej = pl.concat(
        [not_object, no_step.join(raw_of, on="line_no", how="left")], how="vertical_relaxed"
    ).sort("line_no")
    n_rejected = rej.height
    n_skipped = per.filter(pl.col("n_metrics") == 0).height
    chunk = Chunk(
        tables={"step_metrics": rows} if rows.height else {},
        rejects=rejects_frame(rej["line_no"], rej["reason"], rej["raw"]) if n_rejected else None,
        lines=entries.height,
        rows_ok=entries.height - n_rejected - n_skipped,
        rows_rejected=n_rejected,
        rows_skipped=n_skipped,
    )
    return chunk, dropped_counts(leaves), int(per.select(training.sum()).item())
