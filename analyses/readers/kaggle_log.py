"""Kaggle kernel (notebook) logs: the JSON array Kaggle saves of a run's console output.

``kaggle kernels output`` (and the notebook's "Logs" download) gives the run's output as one JSON
array of ``{"stream_name": "stdout"|"stderr", "time": <s since start>, "data": "<text>"}`` records,
one per line (``[{...}``, then ``,{...}``, then ``]``). Kaggle is where many people run TRL /
Unsloth GRPO: the ``data`` strings carry the trainer's console text, tqdm's ``\\r`` redraws on
stderr, the log dicts on stdout (newer transformers print their values as strings,
``'loss': '0.005131'``). Read as a plain text file, no dict ends a line (each is followed by
``\\n"}``): 0 of 100 step dicts landed and 101 lines were rejected.

Rules (counted in ``source_files``; the unit is the file's physical line, i.e. the record):

* A line that is only the array's punctuation (``[``, ``]``, ``,``) or blank is **skipped**.
* A record line (its leading ``[``/``,`` and trailing ``,``/``]`` aside) must be a JSON object with
  a string ``stream_name`` and a string ``data`` (``time`` a number if present); else it is
  **rejected** with the reason (checked per line, as :mod:`analyses.readers.typed_jsonl` does).
* The ``data`` of each stream, in record order, is that stream's console text; it is split into
  console lines at ``\\n`` and at ``\\r`` (a line may span records: a print flushed in parts; each
  tqdm redraw is a line of its own, so bar states and log dicts of the two streams keep the order
  of their records). These lines are
  read by the TRL console rules (:mod:`analyses.readers.trl_console`: log dicts, training-bar
  states, step times, canonical names; a number printed as a string is that number). A record is
  **parsed** when a console line it holds part of is parsed (a log dict or a training-bar state),
  **rejected** when one is rejected (a cut log dict) and none is parsed, else **skipped** (banners,
  warnings, other bars). Metric rows and rejects carry the number of the record line where their
  console line's text starts.
* Kaggle's ``time`` counts from the kernel's start, not a clock: steps get time stamps only from
  ``run.toml`` ``started_at`` plus the bar's elapsed time, as for any console capture.

How: lines stream through :func:`analyses.readers.lines.iter_line_batches`, records are decoded
with DuckDB's JSON functions per batch, and the console text is assembled and split with Polars
expressions (no Python loop per line); the records' console lines are resolved at the end of the
file, like the TRL console reader's examined lines (a few rows per step are kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, ReaderBase, rejects_frame
from analyses.readers.lines import iter_line_batches
from analyses.readers.trl_console import logging_steps_of, resolve_lines, run_start, scan_lines
from analyses.readers.typed_jsonl import Field, decode_frame

RECORD_FIELDS = (Field("stream_name", "str"), Field("time", "num", required=False), Field("data", "str"))
_SNIFF = re.compile(r'^\ufeff?\s*\[\s*\{\s*"stream_name"\s*:\s*"[^"]*"\s*,\s*"time"\s*:', re.S)
_PUNCTUATION = r"^\s*[\[\],]*\s*$"
# a piece of a stream's text: up to and with a line end (a tqdm redraw's \r ends one too), or a tail without
_PIECE = r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+"
_RANK = {"ok": 2, "rejected": 1, "skipped": 0}


class KaggleLogReader(ReaderBase):
    """Kaggle kernel logs (a JSON array of stdout/stderr records) of TRL / Unsloth runs."""

    name = "kaggle_log"
    framework = "trl"

    def sniff(self, head: str, path: Path) -> bool:
        return bool(_SNIFF.match(head))

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        pieces: list[pl.DataFrame] = []  # (record line, stream, piece of text), in file order
        n_lines = 0
        record_lines: list[pl.DataFrame] = []
        for batch in iter_line_batches(ctx.path):
            lines = batch.lines
            n_lines += batch.n_lines
            punct = lines.get_column("line").str.contains(_PUNCTUATION)
            skipped = int(punct.sum())
            recs = lines.filter(~punct).with_columns(
                pl.col("line").str.strip_chars().str.strip_prefix("\ufeff").str.strip_prefix("[")
                .str.strip_prefix(",").str.strip_chars().str.strip_suffix("]").str.strip_suffix(",").str.strip_chars())
            dec = decode_frame(recs, RECORD_FIELDS) if recs.height else None
            if dec is not None and dec.ok.height:
                record_lines.append(dec.ok.select("line_no"))
                pieces.append(dec.ok.select(
                    "line_no", "stream_name", piece=pl.col("data").str.extract_all(_PIECE)).explode("piece"))
            # records are accounted for at the end (their console lines decide); punctuation and bad ones now
            bad = dec.rejects if dec is not None else None
            n_bad = 0 if bad is None else bad.height
            yield Chunk(rejects=bad if n_bad else None, lines=skipped + n_bad, rows_rejected=n_bad,
                        rows_skipped=skipped + (dec.skipped if dec is not None else 0))
        yield _resolve(pieces, record_lines, ctx)


def _console_lines(pieces: pl.DataFrame) -> pl.DataFrame:
    """Each stream's text split into console lines: ``cl`` (their number, in the order their text
    starts), ``line`` (the text, its line end removed), ``start_line`` (the record line where its
    text starts), and, per piece, which console line it belongs to (``pieces``: ``line_no,
    stream_name, piece``)."""
    p = pieces.filter(pl.col("piece").str.len_bytes() > 0).with_row_index("_i").with_columns(
        _nl=pl.col("piece").str.ends_with("\n") | pl.col("piece").str.ends_with("\r"))
    # a piece belongs to the console line its stream's next newline ends
    p = p.with_columns(_id=(pl.col("_nl").cast(pl.Int64).cum_sum() - pl.col("_nl").cast(pl.Int64)).over("stream_name"))
    # a line is where its text is: a tqdm redraw writes "\r" then the bar, so the \r that ends a bar
    # state comes with the next redraw; ordered by its end, each state would follow the dict after it
    text = pl.col("piece").str.strip_chars_end("\r\n").str.len_bytes() > 0
    lines = p.group_by("stream_name", "_id", maintain_order=True).agg(
        line=pl.col("piece").str.join("").str.strip_chars_end("\r\n"),
        start_line=pl.coalesce(pl.col("line_no").filter(text).first(), pl.col("line_no").first()),
        _start=pl.coalesce(pl.col("_i").filter(text).first(), pl.col("_i").first()))
    lines = lines.sort("_start").with_row_index("cl", offset=1).with_columns(pl.col("cl").cast(pl.Int64))
    return p.join(lines.select("stream_name", "_id", "cl", "line", "start_line"), on=["stream_name", "_id"], how="left")


def _resolve(pieces: list[pl.DataFrame], record_lines: list[pl.DataFrame], ctx: FileContext) -> Chunk:
    records = pl.concat(record_lines) if record_lines else pl.DataFrame(schema={"line_no": pl.Int64})
    if not pieces or records.height == 0:
        return Chunk(lines=records.height, rows_skipped=records.height)
    joined = _console_lines(pl.concat(pieces))
    cons = joined.unique("cl", keep="first").sort("cl").select(line_no="cl", line="line", start_line="start_line")
    cand = cons.filter(
        pl.col("line").str.contains("{'", literal=True) | pl.col("line").str.contains("%|", literal=True)
    ).select("line_no", "line")
    status, pairs, states = scan_lines(cand)
    res = resolve_lines(status, pairs, states, logging_steps_of(ctx.manifest), run_start(ctx.manifest, None, ctx.path))
    # console line -> the record line where its text starts (metric rows, rejects); records -> their status
    start = cons.select(cl="line_no", start_line="start_line")
    sm = res.step_metrics.join(start, left_on="line_no", right_on="cl", how="left").with_columns(
        line_no="start_line").drop("start_line")
    rej = res.rejects.join(start, left_on="line_no", right_on="cl", how="left").select(
        line_no="start_line", reason="reason", raw="raw")
    line_status = res.statuses.select(cl="line_no", rank=pl.col("status").replace_strict(_RANK, return_dtype=pl.Int64))
    per_record = (
        joined.select("line_no", "cl").unique()
        .join(line_status, on="cl", how="left")
        .group_by("line_no").agg(rank=pl.col("rank").fill_null(0).max())
    )
    per_record = records.join(per_record, on="line_no", how="left").with_columns(pl.col("rank").fill_null(0))
    n = {r: int((per_record["rank"] == k).sum()) for r, k in _RANK.items()}
    return Chunk(
        tables={"step_metrics": sm} if sm.height else {},
        step_attrs=res.attrs if res.attrs.height else None,
        rejects=rejects_frame(rej["line_no"], rej["reason"], rej["raw"]) if rej.height else None,
        lines=records.height,
        rows_ok=n["ok"],
        rows_rejected=n["rejected"],
        rows_skipped=n["skipped"],
    )
