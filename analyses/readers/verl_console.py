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
batch of those is parsed with Polars expressions only, no per-line Python. The line head
(prefix, step) is checked per line; the tail after ``step:N - `` is split on `` - `` and the lists
flattened without a copy. Since a run's step lines repeat the same key sequence, each pair is
read against a per-batch *template* (the key sequence of one line per pair count): a pair that
starts with its template key's ``key:`` needs only a prefix strip and a float cast, and its
names and flags are gathered from the template (exact: such a pair splits on its first ``:``
into exactly that key). Pairs that do not match go through the general ``splitn`` on the first
``:``; values the cast cannot read go through the numpy-repr/boolean rules. Memory is bounded by
one batch of step lines.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from analyses.readers import limits
from analyses.readers.base import Chunk, FileContext, ReaderBase, rejects_frame
from analyses.readers.lines import iter_line_batches
from analyses.steps import canonical_metric, is_validation_metric, summarize_chunk

if TYPE_CHECKING:  # numpy is imported where it is used: detection never needs it
    import numpy as np

CONSOLE_CUT_CHARS = 4096
# step lines per batch (only prefiltered lines are batched): ~10 MB of typical step lines, small
# enough that a batch's exploded pairs stay far below the memory budget
BATCH_STEP_LINES = 8192
# and at most ~8 MB of text per batch: two batches are parsed at once, and a batch of lines dense
# with pairs costs ~30x its size once split (a 16 MiB line of 1.7M pairs peaks near 550 MB)
BATCH_BYTES = 8 << 20

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
_EMPTY_REJECTS = pl.DataFrame(schema={"line_no": pl.Int64, "reason": pl.String, "raw": pl.String})
_TS_DTYPE = pl.Datetime("us", "UTC")


class VerlConsoleReader(ReaderBase):
    """verl ``step:N - key:value`` console logs (any generation, plain or gzip)."""

    name = "verl_console"
    framework = "verl"
    resumable = True  # each batch is parsed on its own (parse_batch): a line's rows depend on that line alone
    # a wandb output.log can open with megabytes of prints before its first step line: the second
    # look of format detection offers this sniff the lines holding these (see readers.late_sniff)
    late_sniff = ("step:", "{'actor_rollout_ref': {")

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
        batches = iter_line_batches(ctx.path, self.batch_lines, contains=_STEP_KW, batch_bytes=BATCH_BYTES)
        workers = min(self.max_workers, pl.thread_pool_size())
        if workers <= 1:
            for batch in batches:
                yield parse_batch(batch.lines, self.cut_chars, n_lines=batch.n_lines)
            return
        # most of parse_batch runs single-threaded eager kernels that release the GIL, so batches
        # are parsed on `workers` threads, results in file order; the next batch is submitted before
        # the oldest result is handed on, so that every worker parses while the caller stages a chunk
        # (at most `workers` parsing, one batch queued)
        with ThreadPoolExecutor(workers) as pool:
            pending: deque[Future[Chunk]] = deque()
            for batch in batches:
                pending.append(pool.submit(parse_batch, batch.lines, self.cut_chars, batch.n_lines))
                if len(pending) > workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


def parse_batch(batch: pl.DataFrame, cut_chars: int = CONSOLE_CUT_CHARS, n_lines: int | None = None) -> Chunk:
    """Parse ``(line_no, line)`` rows into a :class:`Chunk` (vectorized, no per-line Python).

    ``n_lines`` is the number of physical lines the batch covers when ``batch`` holds only the
    prefiltered lines (the others count as skipped); by default, ``batch.height``.
    """
    import numpy as np

    n_lines = batch.height if n_lines is None else n_lines
    lines = _step_lines(batch, cut_chars)
    n_skipped = n_lines - lines.height
    if lines.height == 0:
        return Chunk(lines=n_lines, rows_skipped=n_skipped)

    # the rejects are built only when there is something to reject: a batch of clean step lines
    # (the common case) pays nothing for them
    # a line of more pairs than a JSON record may hold values is rejected before it is split:
    # split, a 16 MiB line of 1.7M pairs costs ~550 MB (real step lines hold a few hundred)
    max_pairs = limits.current().max_json_values
    too_many: pl.Expr = pl.lit(False)
    # max_pairs separators take 3 x max_pairs bytes: only a tail that long is counted
    longest = lines.get_column("tail").str.len_bytes().max()
    if longest is not None and longest >= max_pairs * len(_PAIR_SEP):
        too_many = pl.col("tail").str.count_matches(_PAIR_SEP, literal=True) >= max_pairs
    good_head = pl.col("step_ok") & pl.col("tail").is_not_null() & ~too_many.fill_null(False)
    line_rejects = _EMPTY_REJECTS
    if not lines.select(good_head.all()).item():
        line_rejects = lines.filter(~good_head).select(
            "line_no",
            reason=pl.when(~pl.col("step_ok"))
            .then(
                pl.format(
                    "malformed step line: step '{}' is not an integer", pl.col("token").str.slice(0, 40)
                )
            )
            .when(pl.col("tail").is_null())
            .then(pl.lit("malformed step line: no ' - key:value' pairs after step:N"))
            .otherwise(pl.lit(f"too_many_values: more than {max_pairs} key:value pairs on one step line")),
            raw=pl.col("line"),
        )
        lines = lines.filter(good_head)
    lines = lines.select(
        "line_no",
        "line",
        "ts",
        "truncated",
        pl.col("token").str.strip_chars_end().cast(pl.Int64).alias("step"),
        # the pairs: everything after the first " - " that follows "step:N"
        pl.col("tail").str.split(_PAIR_SEP).alias("parts"),
    )
    parts = lines.get_column("parts")
    n_parts = parts.list.len().to_numpy().astype(np.int64)
    truncated = lines.get_column("truncated").to_numpy()
    # a cut line: its last pair may be partial, so it is dropped (and said so in rejects)
    trunc_tail = _EMPTY_REJECTS
    if truncated.any():
        trunc_tail = lines.filter(pl.col("truncated")).select(
            "line_no", reason=pl.lit(_TRUNC_REASON.format(cut_chars)), raw=pl.col("parts").list.last()
        )
    lines = lines.drop("parts")
    tmpl, has_bad, line_base = _templates(parts, n_parts, truncated)
    rows = _pair_rows(lines, parts, n_parts, truncated, line_base, tmpl.height - 1)
    pairs = _parse_rows(rows, tmpl, has_bad)

    good_lines, dead_rejects, pair_rejects = lines, _EMPTY_REJECTS, _EMPTY_REJECTS
    bad_mask = pairs.get_column("value").is_null()
    n_pairs = n_parts - truncated
    # (a cut line of one partial pair has no pair left at all)
    if bad_mask.any() or not n_pairs.all():
        bad_pairs = pairs.filter(bad_mask)
        pairs = pairs.filter(~bad_mask)
        # a line with no usable pair at all is rejected whole
        n_bad = bad_pairs.group_by("line_no").agg(pl.len().alias("n_bad"))
        lines = (
            lines.with_columns(n_pairs=pl.Series(n_pairs, dtype=pl.Int64))
            .join(n_bad, on="line_no", how="left")
            .with_columns(pl.col("n_bad").fill_null(0))
        )
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
                "non-numeric pair dropped, rest of line kept: key '{}'",
                pl.col("key").cast(pl.String).str.slice(0, 80),
            ),
            raw=pl.col("pair"),
        )
        trunc_tail = trunc_tail.filter(alive)

    rows = _metric_rows(pairs)
    # the steps accumulator's share of the work, here on the parsing thread (see Chunk.step_summary),
    # from the categorical names; the names leave categorical: the staging writer hands them to the
    # Parquet encoder as dictionaries (analyses.parquet_parts), conform() makes them strings elsewhere
    summary = summarize_chunk(rows) if rows.height else None
    tables: dict[str, pl.DataFrame] = {"step_metrics": rows}
    # one attribute row per parsed line, so that steps.truncated_line is a definite False (not
    # unknown) for every step whose line was read whole
    attrs = None
    if good_lines.height:
        ts = pl.col("ts")
        no_ts = good_lines.get_column("ts").null_count() == good_lines.height
        attrs = good_lines.select(
            "step",
            ts=pl.lit(None, dtype=_TS_DTYPE) if no_ts else _ts_expr(ts),
            truncated_line=pl.col("truncated"),
        )

    parts_rej = [r for r in (line_rejects, dead_rejects, pair_rejects, trunc_tail) if r.height]
    rej = pl.concat(parts_rej, how="vertical_relaxed") if parts_rej else None
    return Chunk(
        tables=tables,
        step_summary=summary,
        step_attrs=attrs,
        rejects=rejects_frame(rej["line_no"], rej["reason"], rej["raw"]).sort("line_no")
        if rej is not None
        else None,
        lines=n_lines,
        rows_ok=good_lines.height,
        rows_rejected=line_rejects.height + dead_rejects.height,
        rows_skipped=n_skipped,
    )


def _pair_rows(
    lines: pl.DataFrame,
    parts: pl.Series,
    n_parts: np.ndarray,
    truncated: np.ndarray,
    line_base: np.ndarray,
    no_key: int,
) -> pl.DataFrame:
    """One row per pair: ``line_no, step, pair, t`` (``t``: the template row for the pair's
    position in its line, ``no_key`` when its line has no template).

    The split lists are flattened as they are (no copy) and the per-line columns repeated by
    index, instead of exploding a frame; a cut line's partial last pair is dropped by position.
    """
    import numpy as np

    total = int(n_parts.sum())
    starts = np.cumsum(n_parts) - n_parts
    # the template row of each pair: its line's template start plus its position in the line; a
    # line without template starts at no_key, and every position past a template clips to no_key
    base = np.where(line_base >= 0, line_base, no_key)
    t = np.arange(total, dtype=np.int64) - np.repeat(starts - base, n_parts)
    np.minimum(t, no_key, out=t)
    # (numpy repeats of the per-line columns: 5x cheaper than Polars gathers by a repeated index)
    rows = pl.DataFrame(
        {
            "line_no": _repeat(lines.get_column("line_no"), n_parts),
            "step": _repeat(lines.get_column("step"), n_parts),
            "pair": parts.explode(),
            "t": pl.Series(t.astype(np.uint32)),
        }
    )
    if truncated.any():
        keep = np.ones(total, dtype=bool)
        keep[(starts + n_parts - 1)[truncated]] = False
        rows = rows.filter(pl.Series(keep))
    return rows


def _repeat(col: pl.Series, times: np.ndarray) -> pl.Series:
    """Each value of a numeric ``col`` repeated ``times[i]`` times."""
    import numpy as np

    if col.null_count():
        return col.gather(pl.Series(np.repeat(np.arange(len(times), dtype=np.uint32), times)))
    return pl.Series(col.name, np.repeat(col.to_numpy(), times), dtype=col.dtype)


def _step_lines(batch: pl.DataFrame, cut_chars: int) -> pl.DataFrame:
    """The batch's step lines: ``line_no, line, ts, truncated, token, step_ok, tail``.

    ``tail`` is the line after the first `` - `` that follows ``step:`` (null when there is none):
    exactly the part of the line split into pairs. Only the short prefix is cleaned of ANSI and
    checked, once per distinct prefix, never the long tail of pairs.
    """
    line = pl.col("line")
    # `at` is a byte offset and str.slice counts characters; they agree on every valid prefix
    # (ASCII), and a non-ASCII prefix over-extends the slice so that the prefix test fails: skipped
    at = line.str.find(_STEP_KW, literal=True)
    after = pl.col("at") + len(_STEP_KW)
    # the step token: up to the next " - " (40 chars are plenty for an integer step)
    window = line.str.slice(after, 40)
    token = pl.col("window").str.split(_PAIR_SEP).list.first()
    lines = (
        batch.lazy()
        .with_columns(at.alias("at"))
        .filter(pl.col("at").is_not_null())  # all of them when the batch was prefiltered
        .with_columns(line.str.slice(0, pl.col("at")).alias("raw_prefix"), window.alias("window"))
        .with_columns(token.alias("token"))
        # "step:" then blank ("Next step: ..." after a Ray prefix) is prose, not a step line
        .filter((pl.col("token").str.len_bytes() > 0) & ~pl.col("token").str.contains(r"^\s"))
        .with_columns(pl.col("window").str.find(_PAIR_SEP, literal=True).alias("sep"))
        .select(
            "line_no",
            "line",
            "raw_prefix",
            "at",
            (line.str.len_bytes() >= cut_chars).alias("truncated"),  # exact test below, if any
            "token",
            step_ok=pl.col("token").str.contains(r"^\d{1,18}\s*$"),
            # the tail starts after the token and its " - " (token length in characters, as
            # str.slice counts them); a token filling the whole window is settled below
            tail=pl.when(pl.col("sep").is_not_null()).then(
                line.str.slice(after + pl.col("token").str.len_chars() + len(_PAIR_SEP))
            ),
            odd=pl.col("sep").is_null() & (pl.col("window").str.len_chars() == 40),
        )
        .collect()
    )
    # the prefix rules, once per distinct prefix (a run prints the same few over and over)
    distinct = lines.select(pl.col("raw_prefix").unique())
    prefixes = (
        distinct.with_columns(prefix=pl.col("raw_prefix").str.replace_all(_ANSI, ""))
        .filter(pl.col("prefix").str.contains(_PREFIX))
        .select("raw_prefix", ts=pl.col("prefix").str.extract(rf"({_TS})", 1))
    )
    if distinct.height == 1:  # one prefix on every line (the usual case): no join of every line
        keep = lines if prefixes.height else lines.clear()
        lines = keep.with_columns(ts=pl.lit(prefixes.get_column("ts").first() if prefixes.height else None,
                                            dtype=pl.String))
    else:
        lines = lines.join(prefixes, on="raw_prefix", how="inner", maintain_order="left")
    if lines.get_column("truncated").any():
        lines = lines.with_columns(truncated=line.str.len_chars() == cut_chars)
    if lines.get_column("odd").any():  # no " - " within 40 chars of "step:": find it the long way
        far = line.str.slice(after).str.splitn(_PAIR_SEP, 2).struct.field("field_1")
        lines = lines.with_columns(tail=pl.when(pl.col("odd")).then(far).otherwise(pl.col("tail")))
    return lines.select("line_no", "line", "ts", "truncated", "token", "step_ok", "tail")


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
    keys = _key_table(kv.get_column("key").unique().drop_nulls())
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


_PAIR_COLS = ("line_no", "step", "pair", "key", "value", "metric", "is_validation")
# key sequences per batch (see _templates); the pairs of lines without one take the general path
MAX_TEMPLATES = 4
# a prefix that no pair can start with (lines never hold a newline): "no template key here"
_NO_KEY = "\n"


# built templates by key sequences: a run repeats the same few, batch after batch (bounded)
_TEMPLATE_CACHE: dict[tuple[tuple[str, ...], ...], tuple[pl.DataFrame, bool]] = {}
_TEMPLATE_CACHE_MAX = 64


def _templates(
    parts: pl.Series, n_parts: np.ndarray, truncated: np.ndarray
) -> tuple[pl.DataFrame, bool, np.ndarray]:
    """The batch's key templates, whether any template key is bad, and, per line, where its
    template starts (-1: none).

    A template is the key sequence of one whole line, chosen per number of pairs (a run's step
    lines nearly all share one sequence; every N steps validation adds keys, giving a second
    length): the first line of each of the :data:`MAX_TEMPLATES` most common lengths. Template
    rows: ``prefix`` (``key:``), ``key``, ``metric``, ``is_validation``, ``bad``, then one last
    "no key" row. Which line uses which template is only a guess; :func:`_parse_rows` checks every
    pair against its template key.
    """
    import numpy as np

    whole = ~truncated
    sizes, counts = np.unique(n_parts[whole], return_counts=True)
    chosen = sizes[np.argsort(-counts, kind="stable")[:MAX_TEMPLATES]]
    line_base = np.full(len(n_parts), -1, dtype=np.int64)
    seqs: list[tuple[str, ...]] = []
    offset = 0
    for size in chosen.tolist():
        of_size = whole & (n_parts == size)
        ref = int(np.flatnonzero(of_size)[0])
        seqs.append(tuple(parts[ref].str.splitn(":", 2).struct.field("field_0").to_list()))
        line_base[of_size] = offset
        offset += size
    key = tuple(seqs)
    hit = _TEMPLATE_CACHE.get(key)
    if hit is None:
        if len(_TEMPLATE_CACHE) >= _TEMPLATE_CACHE_MAX:
            _TEMPLATE_CACHE.clear()
        key_col = pl.Series("key", [k for seq in seqs for k in seq] + [None], dtype=pl.String)
        tmpl = (
            key_col.to_frame()
            .join(_key_table(key_col.drop_nulls().unique()), on="key", how="left", maintain_order="left")
            .with_columns(
                prefix=pl.when(pl.col("key").is_not_null())
                .then(pl.col("key") + ":")
                .otherwise(pl.lit(_NO_KEY)),
                # categorical: gathered per pair as a code, and the steps accumulator reads the codes
                metric=pl.col("metric").cast(pl.Categorical),
                key_code=pl.col("key").cast(pl.Categorical),
            )
        )
        hit = _TEMPLATE_CACHE[key] = (tmpl, bool(tmpl.get_column("bad").any()))
    return hit[0], hit[1], line_base


def _parse_rows(rows: pl.DataFrame, tmpl: pl.DataFrame, has_bad: bool) -> pl.DataFrame:
    """``line_no, step, pair, t`` -> :data:`_PAIR_COLS`: the same rows and values as
    :func:`_parse_pairs` gives, cheaper.

    Consecutive step lines of a run write the same keys in the same order, so each pair is
    first read with its line's template (:func:`_templates`): a pair that starts with the
    template's ``key:`` is that key and the rest is its value. That is a prefix strip and a float
    cast instead of a ``splitn`` per pair, with names and flags gathered from the template
    instead of worked out per row; and it is exact, not a guess: a pair starting with
    ``key + ":"`` (``key`` free of ``:``) splits on its first ``:`` into exactly that key. The
    (rare) pairs that do not match their template take the general path.
    """
    t = rows.get_column("t")
    pair = rows.get_column("pair")
    v = pair.str.strip_prefix(tmpl.get_column("prefix").gather(t))
    matched = v.str.len_bytes() < pair.str.len_bytes()
    rest = None
    if not matched.any():  # no template here: all of it the general way
        return _parse_pairs(rows.lazy().drop("t")).select(_PAIR_COLS)
    if not matched.all():
        rest = rows.filter(~matched).drop("t")
        rows, t, v = rows.filter(matched), t.filter(matched), v.filter(matched)
    bad = tmpl.get_column("bad").gather(t) if has_bad else None
    value = v.cast(pl.Float64, strict=False)
    if bad is not None:  # a key that is not a key: no value at all
        value = value.zip_with(~bad, pl.repeat(None, len(value), dtype=pl.Float64, eager=True))
    hit = pl.DataFrame(
        {
            "line_no": rows.get_column("line_no"),
            "step": rows.get_column("step"),
            "pair": rows.get_column("pair"),
            "key": tmpl.get_column("key_code").gather(t),
            "value": value,
            "metric": tmpl.get_column("metric").gather(t),
            "is_validation": tmpl.get_column("is_validation").gather(t),
        }
    )
    # the cast is the fast path (plain numbers); only the rest goes through the numpy-repr /
    # boolean rules, as in _parse_pairs
    slow = value.is_null() if bad is None else value.is_null() & ~bad
    if slow.any():
        fixed = v.filter(slow).to_frame("v").select(_value_expr(pl.col("v")).alias("value"))
        hit = pl.concat([hit.filter(~slow), hit.filter(slow).with_columns(fixed.get_column("value"))])
    if rest is None or rest.height == 0:
        return hit
    return pl.concat([hit, _parse_pairs(rest.lazy()).select(_PAIR_COLS).with_columns(_CATEGORICAL_NAMES)])


def _key_table(keys: pl.Series) -> pl.DataFrame:
    """Per distinct key: ``key, metric, is_validation, bad`` (the rules of :func:`_parse_pairs`)."""
    return (
        keys.to_frame("key")
        .with_columns(metric=canonical_metric(pl.col("key")))
        .with_columns(
            is_validation=is_validation_metric(pl.col("metric")),
            bad=(pl.col("key").str.len_bytes() == 0) | pl.col("key").str.contains(r"\s"),
        )
    )


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


# the pairs' names are categorical (gathered as codes from the templates): the steps summary maps
# them to step inputs without hashing a row (analyses.steps.metric_ids), and the Parquet encoder
# takes them as dictionaries (analyses.parquet_parts)
_CATEGORICAL_NAMES = (pl.col("metric").cast(pl.Categorical), pl.col("key").cast(pl.Categorical))


def _metric_rows(good: pl.DataFrame) -> pl.DataFrame:
    # (a cast of a categorical to itself still maps every row: only the general path's strings are cast)
    casts = [e for c, e in zip(("metric", "key"), _CATEGORICAL_NAMES, strict=True) if good.schema[c] != pl.Categorical]
    return good.with_columns(casts).select(
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
