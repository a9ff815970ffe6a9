"""verl console logs: ``step:N - key:value - key:value ...`` lines among everything else a
training job prints.

Every generation of verl writes one line per step from ``trainer.logger=['console']`` (or the
wandb capture of the console, ``files/output.log``). Quirks handled:

* Ray/ANSI prefixes: ``\\x1b[36m(main_task pid=54569)\\x1b[0m step:0 - ...``,
  ``\\x1b[2m\\x1b[36m(...)``, ``(pid=N)``; an optional timestamp prefix
  (``2024-12-10 06:50:29,276 INFO``, read as UTC) goes to the ``steps`` attribute ``ts``.
* ``timing/<stage>`` (verl < 0.3) and ``timing_s/<stage>`` map to the same canonical metric
  (:func:`analyses.steps.canonical_metric`); ``raw_metric`` keeps the name as written.
* Values: plain ints/floats, scientific notation, ``nan``/``inf``, numpy reprs
  (``np.float64(0.3)``, ``np.int32(2)``, ``numpy.float32(...)``), ``True``/``False`` and
  ``np.True_``/``np.False_`` as 1/0. Parsed by regex and a float cast, never evaluated.
* ``is_validation`` is set per metric (:func:`analyses.steps.is_validation_metric`); a line whose
  metrics all are validation metrics is a validation line and does not make a training step.

Line rule (documented, counted in ``source_files``):

* A line is a **step line** iff, after stripping ANSI escapes, an optional timestamp prefix and an
  optional Ray ``(name pid=N)`` prefix, it starts with ``step:`` followed by a non-blank. Every
  other line (config dumps, banners, Ray worker chatter, model generations, wandb messages,
  progress bars, blank lines) is **skipped** (``rows_skipped``).
* A step line must read ``step:<int> - key:value( - key:value)*``. If the step is not an integer,
  there is no `` - key:value`` part, or no pair has a numeric value, the line is **rejected**
  (``rows_rejected``, one ``rejects`` row with the reason).
* Otherwise the line is **parsed** (``rows_ok``) and each good pair becomes a ``step_metrics`` row.
  A pair that does not read as ``key:number`` inside such a line is dropped with its own
  ``rejects`` row (raw = the pair); the rest of the line is kept.
* A line of exactly :data:`CONSOLE_CUT_CHARS` (4096) characters was cut by the console capture
  (wandb's ``output.log``): its last pair may be partial (``...best@30/mean:`` or worse, a
  number cut short), so it is dropped and recorded as a ``rejects`` row ("line truncated at 4096
  chars: partial pair dropped"); the line still counts as parsed and its step gets the
  ``steps`` attribute ``truncated_line=True``.

So ``rows_ok + rows_rejected + rows_skipped == lines`` counts *lines*, while ``rejects`` may hold
more rows than ``rows_rejected``: the pair-level and truncation rows describe data lost from lines
that were still parsed (``source_files.rows_rejected`` counts whole lines only). Every parsed line
also yields a ``steps`` attribute row ``(step, ts, truncated_line)``.

How: :func:`analyses.readers.lines.iter_line_batches` streams the file and lets only lines holding
the literal ``step:`` out of Polars' scanner (the others are counted, never materialized); each
batch of those is parsed with Polars expressions only — split on `` - ``, explode, ``splitn`` on
the first ``:``, a float cast with a regex fallback for reprs; names are canonicalized and
validation-flagged once per distinct key. Memory is bounded by one batch of step lines.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, rejects_frame
from analyses.readers.lines import iter_line_batches
from analyses.steps import canonical_metric, is_validation_metric

CONSOLE_CUT_CHARS = 4096
# step lines per batch (only prefiltered lines are batched): ~10 MB of typical step lines, small
# enough that a batch's exploded pairs stay far below the memory budget
BATCH_STEP_LINES = 8192

_ANSI = r"\x1b\[[0-9;?]*[A-Za-z]"
_TS = r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?"
_LEVEL = r"\[?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]?"
# what may precede "step:" on a step line (ANSI stripped): [ts] [sep] [LEVEL] [sep] [(name pid=N)],
# e.g. "2024-12-10 06:50:29,276 INFO ", "2025-01-01 10:00:00,001 - INFO - ", "(main_task pid=54569) "
_PREFIX_BODY = rf"\s*(?:\[?{_TS}\]?[\s|:-]*(?:{_LEVEL}[\s|:-]*)?)?(?:\([^()\n]*pid=\d+[^()\n]*\)\s*)?"
_PREFIX = rf"^{_PREFIX_BODY}$"
_NUMPY_REPR = r"^(?:np|numpy)\.(?:float|int|uint)\d*\((.*)\)$"
_BOOLS = {"True": "1", "False": "0", "np.True_": "1", "np.False_": "0"}
_PAIR_SEP = " - "
_STEP_KW = "step:"
_OLD_TIMING, _NEW_TIMING = "timing/", "timing_s/"  # what canonical_metric renames (checked per batch)

_SNIFF_ANSI = re.compile(_ANSI)
_SNIFF_STEP = re.compile(rf"^{_PREFIX_BODY}step:\d+ - [^\s:]+:\S", re.M)
# verl prints its whole OmegaConf config as a Python dict at start-up
_SNIFF_CONFIG = re.compile(r"\{'actor_rollout_ref': \{")

_TRUNC_REASON = "line truncated at {} chars: partial pair dropped"


class VerlConsoleReader:
    """verl ``step:N - key:value`` console logs (any generation, plain or gzip)."""

    name = "verl_console"

    def __init__(
        self, batch_lines: int = BATCH_STEP_LINES, cut_chars: int = CONSOLE_CUT_CHARS, max_workers: int = 2
    ) -> None:
        self.batch_lines = batch_lines
        self.cut_chars = cut_chars
        self.max_workers = max_workers

    def sniff(self, head: str, path: Path) -> bool:
        text = _SNIFF_ANSI.sub("", head) if "\x1b" in head else head
        return bool(_SNIFF_STEP.search(text) or _SNIFF_CONFIG.search(text))

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        # only lines containing "step:" leave the line scanner; the rest are counted as skipped
        batches = iter_line_batches(ctx.path, self.batch_lines, contains=_STEP_KW)
        workers = min(self.max_workers, pl.thread_pool_size())
        if workers <= 1:
            for batch in batches:
                yield parse_batch(batch.lines, self.cut_chars, n_lines=batch.n_lines)
            return
        # most of parse_batch runs single-threaded eager kernels that release the GIL, so batches
        # are parsed on `workers` threads (in flight: at most `workers`, results in file order)
        with ThreadPoolExecutor(workers) as pool:
            pending: deque[Future[Chunk]] = deque()
            for batch in batches:
                pending.append(pool.submit(parse_batch, batch.lines, self.cut_chars, batch.n_lines))
                if len(pending) >= workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


def parse_batch(batch: pl.DataFrame, cut_chars: int = CONSOLE_CUT_CHARS, n_lines: int | None = None) -> Chunk:
    """Parse ``(line_no, line)`` rows into a :class:`Chunk` (vectorized, no per-line Python).

    ``n_lines`` is the number of physical lines the batch covers when ``batch`` holds only the
    prefiltered lines (the others count as skipped); by default, ``batch.height``.
    """
    n_lines = batch.height if n_lines is None else n_lines
    lines = _step_lines(batch, cut_chars)
    n_skipped = n_lines - lines.height
    if lines.height == 0:
        return Chunk(lines=n_lines, rows_skipped=n_skipped)

    has_pairs = pl.col("n_parts") >= pl.col("k") + 2
    bad_head = lines.filter(~pl.col("step_ok") | ~has_pairs)
    line_rejects = bad_head.select(
        "line_no",
        reason=pl.when(~pl.col("step_ok"))
        .then(pl.format("malformed step line: step '{}' is not an integer", pl.col("token").str.slice(0, 40)))
        .otherwise(pl.lit("malformed step line: no ' - key:value' pairs after step:N")),
        raw=pl.col("line"),
    )
    lines = lines.filter(pl.col("step_ok") & has_pairs)
    # a cut line: its last pair may be partial, so it is dropped (and said so in rejects)
    trunc_tail = lines.filter(pl.col("truncated")).select(
        "line_no", reason=pl.lit(_TRUNC_REASON.format(cut_chars)), raw=pl.col("parts").list.last()
    )
    n_pairs = pl.col("n_parts") - 1 - pl.col("k") - pl.col("truncated").cast(pl.Int64)
    lines = lines.select(
        "line_no",
        "line",
        "ts",
        "truncated",
        pl.col("token").str.strip_chars_end().cast(pl.Int64).alias("step"),
        "parts",
        "k",
        n_pairs.alias("n_pairs"),
        # where each line's parts start once exploded
        (pl.col("n_parts").cum_sum() - pl.col("n_parts")).alias("start"),
    )
    # explode whole lines, then drop each line's head parts (and a cut line's partial last pair)
    # by position: cheaper than slicing every list
    pos = pl.int_range(pl.len(), dtype=pl.Int64) - pl.col("start")
    last = pl.col("line_no") != pl.col("line_no").shift(-1, fill_value=-1)
    pairs = _parse_pairs(
        lines.lazy()
        .select("line_no", "step", "truncated", "k", "start", pl.col("parts").alias("pair"))
        .explode("pair")
        .filter((pos > pl.col("k")) & ~(last & pl.col("truncated")))
        .drop("truncated", "k", "start")
    )
    lines = lines.drop("parts")

    bad_pairs = pairs.filter(pl.col("value").is_null())
    # a line with no usable pair at all is rejected whole
    n_bad = bad_pairs.group_by("line_no").agg(pl.len().alias("n_bad"))
    lines = lines.join(n_bad, on="line_no", how="left").with_columns(pl.col("n_bad").fill_null(0))
    dead = lines.filter(pl.col("n_bad") >= pl.col("n_pairs"))
    dead_rejects = dead.select(
        "line_no",
        reason=pl.when(pl.col("truncated"))
        .then(pl.lit(f"malformed step line: no numeric key:value pair (line cut at {cut_chars} chars)"))
        .otherwise(pl.lit("malformed step line: no numeric key:value pair")),
        raw=pl.col("line"),
    )
    alive = ~pl.col("line_no").is_in(dead.get_column("line_no").implode())
    good_lines = lines.filter(alive) if dead.height else lines
    pair_rejects = bad_pairs.filter(alive).select(
        "line_no",
        reason=pl.format(
            "non-numeric pair dropped, rest of line kept: key '{}'", pl.col("key").str.slice(0, 80)
        ),
        raw=pl.col("pair"),
    )
    trunc_tail = trunc_tail.filter(alive)

    tables: dict[str, pl.DataFrame] = {
        "step_metrics": _metric_rows(pairs.filter(pl.col("value").is_not_null()))
    }
    # one attribute row per parsed line, so that steps.truncated_line is a definite False (not
    # unknown) for every step whose line was read whole
    if good_lines.height:
        tables["steps"] = good_lines.select(
            "step", ts=_ts_expr(pl.col("ts")), truncated_line=pl.col("truncated")
        )

    rej = pl.concat([line_rejects, dead_rejects, pair_rejects, trunc_tail], how="vertical_relaxed")
    return Chunk(
        tables=tables,
        rejects=rejects_frame(rej["line_no"], rej["reason"], rej["raw"]).sort("line_no")
        if rej.height
        else None,
        lines=n_lines,
        rows_ok=good_lines.height,
        rows_rejected=line_rejects.height + dead_rejects.height,
        rows_skipped=n_skipped,
    )


def _step_lines(batch: pl.DataFrame, cut_chars: int) -> pl.DataFrame:
    """The batch's step lines: ``line_no, line, ts, truncated, token, step_ok, parts, n_parts, k``.

    ``parts`` is the line split on `` - ``; parts ``0..k`` are the head (``<prefix>step:<token>``;
    ``k > 0`` only when the prefix itself holds `` - ``, as in ``%(asctime)s - %(levelname)s - ``),
    the rest are the pairs. Only the short prefix is cleaned of ANSI and checked, never the long
    tail of pairs.
    """
    at = pl.col("line").str.find(_STEP_KW, literal=True)
    # `at` is a byte offset and str.slice counts characters; they agree on every valid prefix
    # (ASCII), and a non-ASCII prefix over-extends the slice so that the prefix test fails: skipped
    raw_prefix = pl.col("line").str.slice(0, pl.col("at"))
    # the step token: up to the next " - " (40 chars are plenty for an integer step)
    token = pl.col("line").str.slice(pl.col("at") + len(_STEP_KW), 40).str.split(_PAIR_SEP).list.first()
    lines = (
        batch.lazy()
        .filter(pl.col("line").str.contains(_STEP_KW, literal=True))  # no-op when prefiltered
        .with_columns(at.alias("at"))
        .with_columns(raw_prefix.str.replace_all(_ANSI, "").alias("prefix"), token.alias("token"))
        .filter(pl.col("prefix").str.contains(_PREFIX))
        # "step:" then blank ("Next step: ..." after a Ray prefix) is prose, not a step line
        .filter((pl.col("token").str.len_bytes() > 0) & ~pl.col("token").str.contains(r"^\s"))
        .with_columns(pl.col("line").str.split(_PAIR_SEP).alias("parts"))
        .select(
            "line_no",
            "line",
            pl.col("prefix").str.extract(rf"({_TS})", 1).alias("ts"),
            (pl.col("line").str.len_chars() == cut_chars).alias("truncated"),
            "token",
            pl.col("token").str.contains(r"^\d{1,18}\s*$").alias("step_ok"),
            "parts",
            pl.col("parts").list.len().alias("n_parts"),
            raw_prefix.str.count_matches(_PAIR_SEP, literal=True).alias("k"),
        )
    )
    return lines.collect(engine="streaming")


def _parse_pairs(pairs: pl.LazyFrame) -> pl.DataFrame:
    """``line_no, step, pair`` -> ``+ key, value, metric, is_validation``; value is null for a pair
    that is not ``key:number``.

    Names repeat on every line, so the key rules, the canonical name and the validation flag are
    worked out once per distinct key and mapped back with cheap ``is_in`` tests.
    """
    kv = (
        pairs.with_columns(pl.col("pair").str.splitn(":", 2).struct.rename_fields(["key", "v"]).alias("kv"))
        .unnest("kv")
        .with_columns(pl.col("v").cast(pl.Float64, strict=False).alias("value"))
        .collect(engine="streaming")
    )
    keys = (
        kv.select(pl.col("key").unique().drop_nulls())
        .with_columns(metric=canonical_metric(pl.col("key")))
        .with_columns(
            is_validation=is_validation_metric(pl.col("metric")),
            bad=(pl.col("key").str.len_bytes() == 0) | pl.col("key").str.contains(r"\s"),
        )
    )
    renamed = keys.filter(pl.col("metric") != pl.col("key")).get_column("key")
    val_keys = keys.filter("is_validation").get_column("key")
    bad_keys = keys.filter("bad").get_column("key")
    bad_key = pl.col("key").is_null() | (pl.col("key").is_in(bad_keys.implode()) if len(bad_keys) else False)
    kv = kv.with_columns(
        _canonical_per_row(keys, len(renamed) > 0).alias("metric"),
        (pl.col("key").is_in(val_keys.implode()) if len(val_keys) else pl.lit(False)).alias("is_validation"),
        pl.when(bad_key).then(None).otherwise(pl.col("value")).alias("value"),
    )
    # the cast above is the fast path (plain numbers); only the rest goes through the
    # numpy-repr / boolean rules
    slow_rows = pl.col("value").is_null() & pl.col("v").is_not_null() & ~bad_key
    if not kv.select(slow_rows.any()).item():
        return kv.drop("v")
    slow = kv.filter(slow_rows).with_columns(_value_expr(pl.col("v")).alias("value"))
    return pl.concat([kv.filter(~slow_rows), slow]).drop("v")


def _canonical_per_row(keys: pl.DataFrame, any_renamed: bool) -> pl.Expr:
    """:func:`canonical_metric` for every row, as cheaply as the distinct keys allow: nothing to do
    when no key is renamed; a literal first-occurrence replace (3x cheaper than the anchored
    regex) when it gives the same name as ``canonical_metric`` on every distinct key."""
    if not any_renamed:
        return pl.col("key")
    literal = pl.col("key").str.replace(_OLD_TIMING, _NEW_TIMING, literal=True, n=1)
    if keys.select((literal == pl.col("metric")).all()).item():
        return literal
    return canonical_metric(pl.col("key"))


def _metric_rows(good: pl.DataFrame) -> pl.DataFrame:
    return good.select(
        "step", "metric", "value", pl.col("key").alias("raw_metric"), "is_validation", "line_no"
    )


def _value_expr(v: pl.Expr) -> pl.Expr:
    """A console value as float: numpy repr unwrapped, booleans as 1/0, else a strict float cast."""
    num = v.str.strip_chars().str.replace(_NUMPY_REPR, "${1}")
    num = num.replace(_BOOLS)
    return num.cast(pl.Float64, strict=False)


def _ts_expr(ts: pl.Expr) -> pl.Expr:
    return (
        ts.str.replace(",", ".", literal=True)
        .str.replace("T", " ", literal=True)
        .str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
        .dt.replace_time_zone("UTC")
    )
