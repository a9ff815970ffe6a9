"""TRL / Unsloth console captures: transformers' ``Trainer`` log dicts among tqdm progress bars.

A ``GRPOTrainer`` run (TRL directly, or through Unsloth) prints, per logging step, the logs as a
Python dict on the console (``ProgressCallback.on_log``), behind the progress bar it clears first:
``\\r 20%|██   | 1/5 [10:44<42:59, 644.91s/it]\\r<spaces>\\r{'loss': 0.0, ...,
'completions/mean_length': 666.75, 'completions/clipped_ratio': 0.0, 'reward': 0.0, ...,
'epoch': 0.0}``. Captures from a terminal also hold the bars of dataset maps and checkpoint
loading, banners, user prints, and, in some captures, a repeated header block. No stage timings
are printed: the step time can only come from the progress bar.

Rules (documented; counted in ``source_files``):

* A **log dict** is the flat dict literal that ends a line (after any ``\\r``-separated progress
  and padding) and holds an ``'epoch': `` pair, which ``Trainer.log`` adds to every log. It is
  parsed, never evaluated: it must read ``{'key': value(, 'key': value)*}`` with values that are
  numbers (``nan``/``inf`` included), numpy reprs (``np.float64(0.3)``), ``True``/``False``,
  ``None`` or quoted strings; a dict longer than :data:`MAX_DICT_CHARS` is not read. A line that
  holds ``{'`` and ``'epoch': `` but no such dict at its end (nested, not literal, followed by
  text), or that ends in the start of a log dict never closed (``{'loss': 0.03, 'compl`` - a
  capture cut mid-line), is **rejected**. Other dicts (a reward function's debug print of a
  sample) are not log dicts.
* A **training-bar state** is a tqdm state without description (``23%|##3 | 10/43
  [14:12<44:45, 81.39s/it]``): the bar ``Trainer`` draws for the optimizer steps. Bars with a
  description (``Map:``, ``Loading checkpoint shards:``) are not. A line holding a log dict or a
  training-bar state is **parsed**; every other line (banners, user prints, other bars, blank
  lines) is **skipped**. The bar whose total the log dicts are drawn against is the training
  bar; states of other description-less bars (transformers' evaluation loop) are ignored.
* **Step** of a log dict: its own ``'step'`` when it has one; else the counter of the last
  training-bar state before it (``10/43`` -> step 10: the bar is updated before the step is
  logged); else, when the file shows no training bar at all, its order among the training log
  dicts times ``logging_steps`` (``run.toml``, default 1). A log dict whose step cannot be told
  otherwise is rejected.
* A **collapsed bar**: a capture that keeps only the last drawing of the bar (wandb's
  ``files/output.log`` of an HF Trainer run prints ``760/760`` once, before all 25 log dicts) gives
  every training log dict the same bar state, so the bar's counter is the step of none of them
  (it was the step of all 25, and 24 were superseded). Their steps are then their order times
  ``logging_steps``: ``run.toml``'s, else the one the file implies, the only integer ``L`` with
  ``n = floor(p / L)`` for ``n`` dicts and the bar at ``p`` (760 and 25 give 30, the steps
  30..750) when the dicts' epochs grow in proportion (``epoch_k = k x epoch_n / n`` to their
  printed precision). When neither holds, those dicts are rejected, saying so. The end-of-training
  summary and evaluation dicts are not counted; an evaluation dict takes the step of the training
  dict before it.
* **Metrics**: every numeric pair, under :func:`analyses.steps.canonical_metric` with
  transformers' names (``completions/mean_length`` -> ``response_length/mean``, ...).
  ``epoch`` and ``step`` are bookkeeping; ``None`` is no value; the end-of-training summary's
  ``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``, ``train_loss``,
  ``total_flos`` describe the run, not a step, and are not stored (the rest of that dict, TRL's
  metrics of the last steps, is). ``eval_*`` metrics are validation metrics. A number printed as
  a string (``'loss': '0.005131'``: newer transformers format the console's values) is that
  number; any other string value is dropped with its own ``rejects`` row, the rest of the line
  kept.
* **Step time** (:data:`analyses.steps.STEP_TIME_SOURCES`): for every step the training bar
  shows right after the step before it, ``progress/step_time_s/tqdm_elapsed`` = the bar's
  elapsed time at the step minus at the step before (printed to the second, so only kept when at
  least :data:`ELAPSED_MIN_S`), and ``progress/step_time_s/tqdm_rate`` = the bar's ``s/it`` (or
  ``1/(it/s)``), tqdm's exponential moving average (smoothing 0.3) of recent steps. The state
  counted is the first drawing of each counter value (later redraws show a later elapsed time).
  Both cover the whole wall time between the two bar updates, logging and evaluation included.
* **Time stamps** (``steps.ts``, for :mod:`analyses.alignment`): the training bar's elapsed time
  at the step, added to the run's start: ``run.toml`` ``started_at`` if given (the training
  start: exact), else a start time the capture states (a ``Time: YYYY-MM-DD HH:MM:SS`` header
  line), else a ``YYYYMMDD-HHMMSS`` / ``YYYYMMDD_HHMMSS`` stamp in the file's or its
  directory's name. The last two are when the script started, before the model was loaded, so
  the windows they give are early by that start-up time; naive times are read in ``run.toml``
  ``timezone`` (UTC by default), as nvidia-smi's are. When a log holds a second session (the
  bar's counter starts over), only the first session gets time stamps.

How: lines stream through :func:`analyses.readers.lines.iter_line_batches`; only lines holding
``{'`` or ``%|`` are examined, with Polars regex expressions (no per-line Python). Per batch the
other lines are accounted for at once; the log dicts' pairs and the training-bar states (a few
rows per step) are kept and resolved into steps at the end of the file, in one last chunk that
also accounts for the examined lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from analyses.manifest import RunManifest
from analyses.readers.base import Chunk, FileContext, ReaderBase, rejects_frame
from analyses.readers.lines import iter_line_batches
from analyses.schema import RAW_MAX_CHARS
from analyses.steps import (
    TQDM_ELAPSED_STEP_TIME,
    TQDM_RATE_STEP_TIME,
    canonical_metric,
    is_validation_metric,
    resolve_alias_collisions,
)
from analyses.telemetry_units import manifest_timezone, parse_ts_text

BATCH_LINES = 50_000
MAX_DICT_CHARS = 1 << 20
ELAPSED_MIN_S = 20.0  # elapsed is printed to the second: below this the rounding exceeds 5%
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")
SUMMARY_MARKER = "train_runtime"  # the key that makes a log dict the end-of-training summary
BOOKKEEPING_KEYS = ("epoch", "step")

_EPOCH = "'epoch': "
_KEY = r"'[^'\\\n]*'"
_BARE = r"[^,{}'\"\s]+"
_PAIR = rf"{_KEY}: (?:{_KEY}|{_BARE})"
DICT_GRAMMAR = rf"^\{{{_PAIR}(?:, {_PAIR})*\}}$"
_DICT_TAIL = r"(\{[^{}]*\})\s*$"
# the start of a trainer log (its first key) with no closing brace after it: a log dict cut short
_CUT_LOG_START = r"\{'(?:loss|train_runtime|eval_[^']*)': [^{}]*$"
_PAIR_CAPTURE = rf"'[^'\\\n]*': (?:{_KEY}|{_BARE})"
# a tqdm state: [description]NN%|bar| n/total [elapsed<remaining, rate]
TQDM_STATE = r"([^\r\]|%\n]*?)(\d{1,3})%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\[([0-9:]+)<([^,\]\r]*),\s*([^\]\r]*)\]"
_ELAPSED = r"^(?:(\d+):)?(\d+):(\d+)$"
_RATE = r"([0-9]*\.?[0-9]+)\s*(s/it|it/s)"
_NUMPY_REPR = r"^(?:np|numpy)\.(?:float|int|uint)\d*\((.*)\)$"
_QUOTED_NUMBER = r"^'\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|NaN|Infinity))\s*'$"
_BOOLS = {"True": "1", "False": "0", "np.True_": "1", "np.False_": "0"}
_HEADER_TIME = r"^\s*(?:[-*]\s*)?Time:\s*(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})\s*$"
_NAME_STAMP = re.compile(r"(?<!\d)(\d{4})(\d{2})(\d{2})[-_](\d{2})(\d{2})(\d{2})(?!\d)")
_IDX_BITS = 24  # a state's order in the file: line_no << 24 | position in the line

_SNIFF_KEY = re.compile(r"\{'[^'\n]{1,200}': ")

_TS_DTYPE = pl.Datetime("us", "UTC")
_PAIR_SCHEMA = {"line_no": pl.Int64, "pos": pl.Int64, "key": pl.String, "v": pl.String}
_STATE_SCHEMA = {
    "line_no": pl.Int64, "ord": pl.Int64, "n": pl.Int64, "total": pl.Int64, "elapsed_s": pl.Float64,
    "rate_s": pl.Float64,
}
_LINE_SCHEMA = {"line_no": pl.Int64, "status": pl.String, "reason": pl.String, "line": pl.String}


def has_log_dict(line: str) -> bool:
    """Whether ``line`` ends in a trainer log dict: ``{'key': ...'epoch': ...}`` closing the line.
    Linear in the line (one regex of the form ``{'..'..'epoch'..}$`` backtracked for minutes over a
    fuzzed 512 KB line): the last ``'epoch': ``, a ``}`` at the end, a ``{'key': `` before it."""
    s = line.rstrip(" \t\r")
    at = s.rfind(_EPOCH)
    return at >= 0 and s.endswith("}") and _SNIFF_KEY.search(s, 0, at) is not None


class TrlConsoleReader(ReaderBase):
    """transformers ``Trainer`` console captures (TRL ``GRPOTrainer``, Unsloth)."""

    name = "trl_console"
    framework = "trl"
    late_sniff = (_EPOCH,)  # its log dicts may first appear megabytes into a capture

    def __init__(self, batch_lines: int = BATCH_LINES) -> None:
        self.batch_lines = batch_lines

    def sniff(self, head: str, path: Path) -> bool:
        return _EPOCH in head and any(has_log_dict(line) for line in head.splitlines() if _EPOCH in line)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        examined: list[pl.DataFrame] = []  # per examined line: status, reason
        pairs: list[pl.DataFrame] = []
        states: list[pl.DataFrame] = []
        header_time: str | None = None
        for batch in iter_line_batches(ctx.path, self.batch_lines):
            lines = batch.lines
            if header_time is None:
                hit = lines.select(pl.col("line").str.extract(_HEADER_TIME, 1).drop_nulls().first()).item()
                header_time = hit
            cand = lines.filter(
                pl.col("line").str.contains("{'", literal=True) | pl.col("line").str.contains("%|", literal=True)
            )
            status, batch_pairs, batch_states = scan_lines(cand)
            examined.append(status)
            pairs.append(batch_pairs)
            states.append(batch_states)
            unseen = batch.n_lines - cand.height
            if unseen:
                yield Chunk(lines=unseen, rows_skipped=unseen)
        anchor = run_start(ctx.manifest, header_time, ctx.path)
        yield resolve_lines(
            pl.concat(examined) if examined else pl.DataFrame(schema=_LINE_SCHEMA),
            pl.concat(pairs) if pairs else pl.DataFrame(schema=_PAIR_SCHEMA),
            pl.concat(states) if states else pl.DataFrame(schema=_STATE_SCHEMA),
            logging_steps=logging_steps_of(ctx.manifest),
            anchor=anchor,
        ).chunk()


def scan_lines(cand: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Examine ``(line_no, line)`` rows that hold ``{'`` or ``%|``.

    Returns (per line: ``line_no, status, reason, line`` with status ok | rejected | skipped;
    log-dict pairs: ``line_no, pos, key, v``; training-bar states: see :data:`_STATE_SCHEMA`).
    """
    if cand.height == 0:
        return pl.DataFrame(schema=_LINE_SCHEMA), pl.DataFrame(schema=_PAIR_SCHEMA), pl.DataFrame(schema=_STATE_SCHEMA)
    line = pl.col("line")
    tail = pl.col("tail")
    df = cand.with_columns(
        tail=line.str.extract(_DICT_TAIL, 1),
        is_log=line.str.contains("{'", literal=True)
        & (line.str.contains(_EPOCH, literal=True) | line.str.contains(_CUT_LOG_START)),
    ).with_columns(
        dict_ok=pl.col("is_log")
        & tail.is_not_null()
        & tail.str.contains(_EPOCH, literal=True)
        & (tail.str.len_bytes() <= MAX_DICT_CHARS)
    ).with_columns(dict_ok=pl.col("dict_ok") & tail.str.contains(DICT_GRAMMAR))
    st = _training_states(df.filter(line.str.contains("%|", literal=True)).select("line_no", "line"))
    with_state = st.select("line_no").unique()
    reason = (
        pl.when(tail.is_null() | ~tail.str.contains(_EPOCH, literal=True))
        .then(pl.lit("trainer log dict does not end the line (cut, nested or followed by text)"))
        .when(tail.str.len_bytes() > MAX_DICT_CHARS)
        .then(pl.lit(f"trainer log dict longer than {MAX_DICT_CHARS} characters: not read"))
        .otherwise(pl.lit("trainer log dict is not a flat dict of literals"))
    )
    status = df.join(with_state.with_columns(has_state=pl.lit(True)), on="line_no", how="left").select(
        "line_no",
        status=pl.when(pl.col("dict_ok"))
        .then(pl.lit("ok"))
        .when(pl.col("is_log"))
        .then(pl.lit("rejected"))
        .when(pl.col("has_state").fill_null(False))
        .then(pl.lit("ok"))
        .otherwise(pl.lit("skipped")),
        reason=pl.when(~pl.col("dict_ok") & pl.col("is_log")).then(reason),
        # kept (as rejects keep it) for every log dict: one may still be rejected for want of a step
        line=pl.when(pl.col("is_log")).then(line.str.slice(0, RAW_MAX_CHARS)),
    )
    pairs = (
        df.filter("dict_ok")
        .select("line_no", p=tail.str.extract_all(_PAIR_CAPTURE))
        .with_columns(pos=pl.int_ranges(0, pl.col("p").list.len(), dtype=pl.Int64))
        .explode("p", "pos")
        .select(
            "line_no",
            "pos",
            key=pl.col("p").str.extract(r"^'([^']*)'", 1),
            v=pl.col("p").str.extract(r"^'[^']*': (.*)$", 1),
        )
    )
    return status, pairs, st


def _training_states(lines: pl.DataFrame) -> pl.DataFrame:
    """Description-less tqdm states of ``lines``, in file order (:data:`_STATE_SCHEMA`)."""
    if lines.height == 0:
        return pl.DataFrame(schema=_STATE_SCHEMA)
    s = (
        lines.select("line_no", s=pl.col("line").str.extract_all(TQDM_STATE))
        .with_columns(idx=pl.int_ranges(0, pl.col("s").list.len(), dtype=pl.Int64))
        .explode("s", "idx")
        .filter(pl.col("s").is_not_null())
        .with_columns(g=pl.col("s").str.extract_groups("^" + TQDM_STATE))
        .unnest("g")
    )
    # groups: 1 description, 2 percent, 3 n, 4 total, 5 elapsed, 6 remaining, 7 rate
    el = pl.col("5").str.extract_groups(_ELAPSED)
    rate_v = pl.col("7").str.extract(_RATE, 1).cast(pl.Float64, strict=False)
    rate_u = pl.col("7").str.extract(_RATE, 2)
    return (
        s.filter(pl.col("1").str.strip_chars() == "")
        .with_columns(el=el)
        .select(
            "line_no",
            ord=(pl.col("line_no") * (1 << _IDX_BITS)) + pl.col("idx").clip(upper_bound=(1 << _IDX_BITS) - 2),
            n=pl.col("3").cast(pl.Int64, strict=False),
            total=pl.col("4").cast(pl.Int64, strict=False),
            elapsed_s=_plausible_elapsed(
                pl.col("el").struct.field("1").cast(pl.Float64, strict=False).fill_null(0.0) * 3600
                + pl.col("el").struct.field("2").cast(pl.Float64, strict=False) * 60
                + pl.col("el").struct.field("3").cast(pl.Float64, strict=False)
            ),
            rate_s=pl.when(rate_u == "s/it").then(rate_v).when((rate_u == "it/s") & (rate_v > 0)).then(1.0 / rate_v),
        )
        .filter(pl.col("n").is_not_null() & pl.col("total").is_not_null())
    )


def _value_expr(v: pl.Expr) -> pl.Expr:
    """A dict value as float: numpy repr unwrapped, booleans 1/0, a number printed as a string
    (``'0.005131'``: newer transformers format values for the console) read as that number; null
    for None and other strings."""
    t = v.str.strip_chars()
    t = pl.when(t.str.contains(_QUOTED_NUMBER)).then(t.str.extract(_QUOTED_NUMBER, 1)).otherwise(t)
    num = t.str.replace(_NUMPY_REPR, "${1}").replace(_BOOLS)
    return num.cast(pl.Float64, strict=False)


@dataclass
class Resolved:
    """What the examined lines of a capture give: ``step_metrics`` rows, ``steps`` attributes,
    rejects (``line_no, reason, raw``) and each examined line's ``status`` (``line_no, status``)."""

    step_metrics: pl.DataFrame
    attrs: pl.DataFrame
    rejects: pl.DataFrame
    statuses: pl.DataFrame

    def chunk(self) -> Chunk:
        rej, st = self.rejects, self.statuses
        counts = st.group_by("status").len()
        n = dict(zip(counts["status"].to_list(), counts["len"].to_list(), strict=True))
        return Chunk(
            tables={"step_metrics": self.step_metrics} if self.step_metrics.height else {},
            step_attrs=self.attrs if self.attrs.height else None,
            rejects=rejects_frame(rej["line_no"], rej["reason"], rej["raw"]) if rej.height else None,
            lines=st.height,
            rows_ok=n.get("ok", 0),
            rows_rejected=n.get("rejected", 0),
            rows_skipped=n.get("skipped", 0),
        )


def resolve_lines(
    examined: pl.DataFrame,
    pairs: pl.DataFrame,
    states: pl.DataFrame,
    logging_steps: int | None = None,
    anchor: datetime | None = None,
) -> Resolved:
    """Steps of the log dicts, their metrics, the bar's step times and time stamps, and the status
    of every examined line. ``logging_steps``: run.toml's (None: not given; 1 where an interval is
    needed and the file implies none)."""
    logging_steps_set = logging_steps is not None
    logging_steps = logging_steps or 1
    dict_end = (1 << _IDX_BITS) - 1
    kinds = pairs.group_by("line_no").agg(
        keys=pl.col("key").filter(~pl.col("key").is_in(list(BOOKKEEPING_KEYS))),
        own_step=pl.col("v").filter(pl.col("key") == "step").first(),
        epoch=pl.col("v").filter(pl.col("key") == "epoch").first(),
    )
    dicts = kinds.select(
        "line_no",
        ord=pl.col("line_no") * (1 << _IDX_BITS) + dict_end,
        is_eval=pl.col("keys").list.eval(pl.element().str.starts_with("eval_")).list.all()
        & (pl.col("keys").list.len() > 0),
        # the end-of-training summary (TRL adds its last metrics to it): not a logging step
        is_summary=pl.col("keys").list.contains(SUMMARY_MARKER),
        own_step=_integral(_value_expr(pl.col("own_step"))),
        epoch=_value_expr(pl.col("epoch")),
    ).sort("ord")
    train_total = _training_total(dicts, states)
    bar = states.filter(pl.col("total") == train_total).sort("ord") if train_total is not None else states.clear()
    dicts = dicts.join_asof(bar.select("ord", bar_n="n", bar_ord="ord"), on="ord", strategy="backward")
    collapsed = _collapsed_steps(dicts, logging_steps if logging_steps_set else None) if bar.height else None
    if bar.height == 0:  # no progress bar at all: the order of the training dicts (an eval dict: the last one's)
        dicts = dicts.with_columns(order_step=(pl.col("is_eval").not_().cum_sum() * logging_steps).cast(pl.Int64))
    elif collapsed is not None:  # one bar state before every training dict: see _collapsed_steps
        dicts = dicts.with_columns(order_step=collapsed, bar_n=pl.when(pl.col("is_summary")).then("bar_n"))
    else:
        dicts = dicts.with_columns(order_step=pl.lit(None, dtype=pl.Int64))
    dicts = dicts.with_columns(step=pl.coalesce("own_step", "bar_n", "order_step"))
    no_step = dicts.filter(pl.col("step").is_null()).get_column("line_no")
    no_step_reason = (
        "trainer log dict without a step: the training log dicts all follow one progress-bar state (a capture that "
        "kept only the bar's last drawing) and their epochs do not tell the logging interval: set logging_steps in "
        "run.toml" if collapsed is not None
        else "trainer log dict without a step: no step key and no training progress bar before it"
    )

    rows = (
        pairs.join(dicts.select("line_no", "step"), on="line_no", how="inner")
        .filter(pl.col("step").is_not_null() & ~pl.col("key").is_in([*BOOKKEEPING_KEYS, *SUMMARY_KEYS]))
        .with_columns(value=_value_expr(pl.col("v")))
        .with_columns(is_str=pl.col("v").str.starts_with("'") & pl.col("value").is_null())
    )
    str_rejects = rows.filter("is_str").select(
        "line_no",
        reason=pl.format("non-numeric pair dropped, rest of line kept: key '{}'", pl.col("key").str.slice(0, 80)),
        raw=pl.format("'{}': {}", pl.col("key"), pl.col("v")),
    )
    metric_rows = (
        rows.filter(pl.col("value").is_not_null())
        .sort("line_no", "pos")
        .select(
            "step",
            metric=canonical_metric(pl.col("key"), hf=True),
            value="value",
            raw_metric="key",
            line_no="line_no",
        )
        .with_columns(is_validation=is_validation_metric(pl.col("metric")))
    )
    metric_rows = resolve_alias_collisions(metric_rows)
    time_rows, attrs = _bar_steps(bar, anchor)

    # accounting of the examined lines; a log dict without a step is rejected after all
    examined = examined.with_columns(
        status=pl.when(pl.col("line_no").is_in(no_step.implode())).then(pl.lit("rejected")).otherwise("status"),
        reason=pl.when(pl.col("line_no").is_in(no_step.implode())).then(pl.lit(no_step_reason)).otherwise("reason"),
    )
    line_rejects = examined.filter(pl.col("status") == "rejected").select("line_no", "reason", raw="line")
    rej = pl.concat([line_rejects, str_rejects], how="vertical_relaxed").sort("line_no")
    sm = pl.concat([metric_rows.select(_SM_COLS), time_rows.select(_SM_COLS)], how="vertical_relaxed")
    return Resolved(sm, attrs, rej, examined.select("line_no", "status"))


_SM_COLS = ("step", "metric", "value", "raw_metric", "is_validation", "line_no")


def _integral(t: pl.Expr) -> pl.Expr:
    x = t.cast(pl.Float64, strict=False)
    return pl.when(x.is_finite() & (x >= 0) & (x == x.floor())).then(x).cast(pl.Int64, strict=False)


# epochs print to 2 decimals (transformers rounds them for the console): k x epoch_n / n may be off
# by the two roundings
EPOCH_TOLERANCE = 0.011


def _collapsed_steps(dicts: pl.DataFrame, logging_steps: int | None) -> pl.Series | None:
    """The steps of the training log dicts when they all follow one bar state (see the module rules),
    as a column over ``dicts`` (null for eval and summary dicts... an eval dict takes the training
    dict's before it; null everywhere when the interval cannot be told); None when the bar is not
    collapsed (the dicts have bar states of their own)."""
    train = ~pl.col("is_eval") & ~pl.col("is_summary")
    t = dicts.filter(train & pl.col("own_step").is_null())
    if t.height < 2 or t.get_column("bar_ord").null_count() or t.get_column("bar_ord").n_unique() != 1:
        return None
    n, p = t.height, int(t.get_column("bar_n")[0])
    interval = logging_steps
    if interval is None:
        lo, hi = p // (n + 1) + 1, p // n  # the integers L with floor(p / L) == n
        epochs = t.get_column("epoch")
        k = pl.Series(range(1, n + 1), dtype=pl.Float64)
        proportional = epochs.null_count() == 0 and bool(
            ((epochs - k * epochs[-1] / n).abs() <= EPOCH_TOLERANCE).all())
        interval = lo if lo == hi and proportional else None
    if interval is None:
        return pl.Series("order_step", [None] * dicts.height, dtype=pl.Int64)
    order = train.cast(pl.Int64).cum_sum() * interval
    return dicts.select(
        pl.when(~pl.col("is_summary") & (train.cast(pl.Int64).cum_sum() > 0)).then(order).alias("order_step")
    ).get_column("order_step")


def _training_total(dicts: pl.DataFrame, states: pl.DataFrame) -> int | None:
    """The training bar's total: the commonest total of the bar states just before the training
    log dicts (evaluation loops draw description-less bars too, with their own totals)."""
    if states.height == 0:
        return None
    before = dicts.filter(~pl.col("is_eval")).join_asof(
        states.sort("ord").select("ord", "total"), on="ord", strategy="backward"
    )
    totals = before.get_column("total").drop_nulls()
    if totals.len() == 0:
        totals = states.get_column("total")
    return int(totals.mode().sort().item(0))


def _bar_steps(bar: pl.DataFrame, anchor: datetime | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(step-time rows for step_metrics, ``steps`` attribute rows ``step, ts``) from the training
    bar's states (see the module rules)."""
    empty_attrs = pl.DataFrame(schema={"step": pl.Int64, "ts": _TS_DTYPE})
    if bar.height == 0:
        return pl.DataFrame(schema={c: t for c, t in zip(_SM_COLS, _SM_TYPES, strict=True)}), empty_attrs
    # a session is a run of states whose counter never goes back; first drawing of each counter
    first = (
        bar.sort("ord")
        .with_columns(session=(pl.col("n") < pl.col("n").shift(1)).fill_null(False).cum_sum())
        .unique(["session", "n"], keep="first", maintain_order=True)
        .with_columns(
            prev_n=pl.col("n").shift(1).over("session"),
            prev_el=pl.col("elapsed_s").shift(1).over("session"),
        )
        .filter(pl.col("n") > 0)
    )
    step_after = pl.col("prev_n") == pl.col("n") - 1
    dt = pl.col("elapsed_s") - pl.col("prev_el")
    elapsed = first.filter(step_after & (dt >= ELAPSED_MIN_S)).select(
        step="n", metric=pl.lit(TQDM_ELAPSED_STEP_TIME), value=dt, raw_metric=pl.lit("tqdm:elapsed"),
        is_validation=pl.lit(False), line_no="line_no",
    )
    rate = first.filter(step_after & pl.col("rate_s").is_not_null()).select(
        step="n", metric=pl.lit(TQDM_RATE_STEP_TIME), value="rate_s", raw_metric=pl.lit("tqdm:rate"),
        is_validation=pl.lit(False), line_no="line_no",
    )
    attrs = empty_attrs
    if anchor is not None:
        start = pl.lit(anchor).cast(_TS_DTYPE)
        attrs = first.filter(pl.col("session") == 0).select(
            step="n", ts=start + pl.duration(microseconds=(pl.col("elapsed_s") * 1e6).round(0).cast(pl.Int64))
        )
    return pl.concat([elapsed, rate]).sort("line_no", "metric"), attrs


_SM_TYPES = (pl.Int64, pl.String, pl.Float64, pl.String, pl.Boolean, pl.Int64)
# a bar's elapsed time beyond a year is a corrupt line, not a run (its timestamp would overflow)
MAX_ELAPSED_S = 366 * 86400.0


def _plausible_elapsed(seconds: pl.Expr) -> pl.Expr:
    return pl.when(seconds.is_finite() & (seconds >= 0) & (seconds <= MAX_ELAPSED_S)).then(seconds)


def logging_steps_of(manifest: RunManifest) -> int | None:
    """run.toml's ``logging_steps``, None when it does not say."""
    v = manifest.tags.get("logging_steps")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def run_start(manifest: RunManifest, header_time: str | None, path: Path) -> datetime | None:
    """When the run started (see the module rules): ``run.toml`` ``started_at``, a ``Time:``
    header line, or a date-time stamp in the file's or its directory's name."""
    if manifest.started_at is not None:
        return manifest.started_at.astimezone(UTC)
    text = header_time
    if text is None:
        for name in (path.name, path.parent.name):
            m = _NAME_STAMP.search(name)
            if m:
                y, mo, d, h, mi, s = m.groups()
                text = f"{y}-{mo}-{d} {h}:{mi}:{s}"
                break
    if text is None:
        return None
    ts = pl.select(parse_ts_text(pl.lit(text), manifest_timezone(manifest))).item()
    return ts
