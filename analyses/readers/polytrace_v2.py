"""PolyTrace v2 workload logs: one JSON-lines file per step (plus one DAPO filter file per run).

* ``packed_lengths_step_N.jsonl`` — one record per prompt: ``input`` (prompt tokens), ``output``
  (list of n response token counts), rank, dp_rank, tp_rank, local_index, n_sampling, validate.
  One ``samples`` row per output; the prompt's length is repeated on each.
* ``reward_timings_step_N.jsonl`` — one record per rank: reward_time_s, batch_size and the
  rank's response-token sum/mean/max. One ``rank_times`` row (phase ``reward``).
* ``multiturn_workload_step_N.jsonl`` — one record per trajectory with ``turns[]`` and
  ``tool_calls[]``. Rows in ``samples``, ``turns`` and ``tool_calls``.
* ``dapo_filter_indices.jsonl`` — one record per generation batch of a filtering run.
  One ``filter_batches`` row. In such a run the ``N`` of ``packed_lengths_step_N`` (and so
  ``samples.step``) is the generation batch, ``filter_batches.workload_step``, not the trainer
  step: join on it to get ``trainer_step``.

Every record is checked (types, non-negative lengths, its ``step`` against the ``N`` of the file
name, response lengths against the run's limit, duplicates); a bad record is rejected with its
reason and the rest of the file still lands. Decoding is columnar (see ``typed_jsonl``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, FilesChunk, ReaderBase
from analyses.readers.typed_jsonl import (
    FILE_COLUMN,
    Decoded,
    Field,
    FileKeys,
    decode_files,
    decode_jsonl,
    files_chunk,
    first_json_objects,
    step_from_name,
)

RECORDED = "recorded"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _sniff(head: str, path: Path, name_pattern: str, looks_like: Callable[[dict], bool]) -> bool:
    """Content first; a JSON-lines file named like the format is ours even when its first lines
    are bad, so they are rejected with reasons rather than the file being left unrecognized.
    The first object alone decides most files (a step file of the format: one ``json.loads``
    rather than five, for each of hundreds of files); the others, up to five."""
    if any(looks_like(o) for o in first_json_objects(head, 1)) or any(looks_like(o) for o in first_json_objects(head)):
        return True
    return re.match(name_pattern, path.name) is not None and head.lstrip().startswith("{")


def _step_check(file_step: int | pl.Expr | None, col: str = "step") -> pl.Expr | None:
    """``file_step``: the step the file name states (an expression per row of several files)."""
    if file_step is None:
        return None
    want = file_step if isinstance(file_step, pl.Expr) else pl.lit(file_step)
    return (
        pl.when(pl.col(col) != want)
        .then(pl.format("step {} contradicts the file name (step {})", pl.col(col), want))
    )


def _file_steps(ctxs: list[FileContext], pattern: str) -> pl.Expr:
    """Per row of :func:`decode_files`, the step its file's name states (null: none)."""
    steps = pl.Series([step_from_name(c.path, pattern) for c in ctxs], dtype=pl.Int64)
    return pl.lit(steps).gather(pl.col(FILE_COLUMN))


def _carried(dec: Decoded) -> list[str]:
    """The file index of rows decoded from several files, which each table keeps."""
    return [FILE_COLUMN] if FILE_COLUMN in dec.ok.columns else []


def _first_reason(*exprs: pl.Expr | None) -> pl.Expr:
    """The first non-null reason among ``exprs`` (null = the row is fine)."""
    live = [e for e in exprs if e is not None]
    return pl.coalesce(live) if live else pl.lit(None, dtype=pl.String)


def _with_first(dec: Decoded, keys: FileKeys) -> Decoded:
    """``dec`` with ``_first``: the line its key first appeared on in the file (all batches)."""
    return replace(dec, ok=dec.ok.with_columns(_first=keys.first_line(dec.ok)))


def _duplicate(what: str) -> pl.Expr:
    """A repeat of an earlier record's key in the file (needs ``_first``, see _with_first)."""
    return pl.when(pl.col("_first") != pl.col("line_no")).then(pl.lit(f"duplicate record for {what}"))


def _val_prefix() -> pl.Expr:
    # validation and training records of one step reuse indices; keep their sample ids apart
    return pl.when(pl.col("validate").fill_null(False)).then(pl.lit("val-")).otherwise(pl.lit(""))


def _truncated(length: pl.Expr, limit: pl.Expr) -> pl.Expr:
    """Reached the limit exactly or beyond; unknown (null) when the run's limit is unknown."""
    return pl.when(limit.is_null()).then(None).otherwise(length >= limit)


# --------------------------------------------------------------------------- packed lengths


def _who() -> pl.Expr:
    """The data-parallel rank that generated a prompt (the global rank when dp_rank is absent)."""
    return pl.coalesce(pl.col("dp_rank"), pl.col("rank")).cast(pl.String).fill_null("na").alias("_who")


PACKED_NAME = r"^packed_lengths_step_(\d+)\.jsonl$"
PACKED_FIELDS = (
    Field("step", "int", nonneg=True),
    Field("rank", "int", required=False, nonneg=True),
    Field("dp_rank", "int", required=False, nonneg=True),
    Field("tp_rank", "int", required=False, nonneg=True),
    Field("local_index", "int", nonneg=True),
    Field("input", "int", nonneg=True),
    Field("output", "int_list", nonneg=True),
    Field("n_sampling", "int", required=False, nonneg=True),
    Field("validate", "bool", required=False),
)


class PackedLengthsReader(ReaderBase):
    name = "polytrace_packed_lengths"

    def sniff(self, head: str, path: Path) -> bool:
        def looks(o: dict) -> bool:
            return _is_int(o.get("input")) and isinstance(o.get("output"), list) and "local_index" in o

        return _sniff(head, path, PACKED_NAME, looks)

    # the sample id's identity: tensor-parallel peers logging the same prompt are duplicates
    @staticmethod
    def _keys() -> tuple[pl.Expr, ...]:
        return pl.col("validate"), _who(), pl.col("local_index")

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        file_step = step_from_name(ctx.path, PACKED_NAME)
        keys = FileKeys(*self._keys())
        for dec in decode_jsonl(ctx.path, PACKED_FIELDS):
            dec = self._checked(_with_first(dec, keys), file_step, ctx)
            yield dec.chunk({"samples": self._samples(dec, ctx, ctx.manifest.max_response_length)})

    def read_many(self, ctxs: list[FileContext]) -> FilesChunk | None:
        got = decode_files([c.path for c in ctxs], PACKED_FIELDS, [c.data for c in ctxs])
        if got is None:
            return None
        dec, counts = got
        dec = self._checked(_with_first(dec, FileKeys(pl.col(FILE_COLUMN), *self._keys())),
                            _file_steps(ctxs, PACKED_NAME), ctxs[0])
        return files_chunk(dec, counts, {"samples": self._samples(dec, ctxs[0], ctxs[0].manifest.max_response_length)})

    @staticmethod
    def _checked(dec: Decoded, file_step: int | pl.Expr | None, ctx: FileContext) -> Decoded:
        limit = ctx.manifest.max_response_length
        over = None
        if limit is not None:
            over = pl.when(pl.col("output").list.max() > limit).then(
                pl.format("response length {} exceeds max_response_length {}", pl.col("output").list.max(), pl.lit(limit))
            )
        return dec.reject_where(_first_reason(
            _step_check(file_step),
            pl.when(pl.col("output").list.len() == 0).then(pl.lit("empty output list")),
            over,
            _duplicate("this dp_rank and local_index"),
        ))

    @staticmethod
    def _samples(dec: Decoded, ctx: FileContext, limit: int | None) -> pl.DataFrame:
        group = pl.concat_str([_val_prefix(), _who(), pl.lit("-"), pl.col("local_index").cast(pl.String)])
        # one query (three eager steps materialized each: 10 -> 6.5 ms for 315 packed step files)
        return (
            dec.ok.lazy().select(
                *_carried(dec), "step", "rank", "dp_rank", "tp_rank", "local_index", "validate", "line_no",
                group_id=group,
                prompt_tokens=pl.col("input"),
                response_tokens=pl.col("output"),
                k=pl.int_ranges(pl.col("output").list.len()),
            )
            .explode("response_tokens", "k")
            .with_columns(
                sample_id=pl.concat_str([pl.col("group_id"), pl.lit("-"), pl.col("k").cast(pl.String)]),
                truncated=_truncated(pl.col("response_tokens"), pl.lit(limit, dtype=pl.Int64)),
                task=pl.lit(ctx.manifest.task, dtype=pl.String),
                token_source=pl.lit(RECORDED),
            )
            .drop("k")
            .collect()
        )


# --------------------------------------------------------------------------- reward timings

REWARD_NAME = r"^reward_timings_step_(\d+)\.jsonl$"
REWARD_FIELDS = (
    Field("step", "int", nonneg=True),
    Field("rank", "int", nonneg=True),
    Field("dp_rank", "int", required=False, nonneg=True),
    Field("tp_rank", "int", required=False, nonneg=True),
    Field("batch_size", "int", required=False, nonneg=True),
    Field("reward_time_s", "num", nonneg=True),
    Field("response_sum", "int", required=False, nonneg=True),
    Field("response_mean", "num", required=False, nonneg=True),
    Field("response_max", "int", required=False, nonneg=True),
    Field("validate", "bool", required=False),
)


class RewardTimingsReader(ReaderBase):
    name = "polytrace_reward_timings"

    def sniff(self, head: str, path: Path) -> bool:
        return _sniff(head, path, REWARD_NAME, lambda o: "reward_time_s" in o and "rank" in o)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        file_step = step_from_name(ctx.path, REWARD_NAME)
        keys = FileKeys(pl.col("validate"), pl.col("rank"))
        for dec in decode_jsonl(ctx.path, REWARD_FIELDS):
            dec = self._checked(_with_first(dec, keys), file_step, ctx)
            yield dec.chunk({"rank_times": self._rows(dec)})

    def read_many(self, ctxs: list[FileContext]) -> FilesChunk | None:
        got = decode_files([c.path for c in ctxs], REWARD_FIELDS, [c.data for c in ctxs])
        if got is None:
            return None
        dec, counts = got
        dec = self._checked(_with_first(dec, FileKeys(pl.col(FILE_COLUMN), pl.col("validate"), pl.col("rank"))),
                            _file_steps(ctxs, REWARD_NAME), ctxs[0])
        return files_chunk(dec, counts, {"rank_times": self._rows(dec)})

    @staticmethod
    def _checked(dec: Decoded, file_step: int | pl.Expr | None, ctx: FileContext) -> Decoded:
        limit = ctx.manifest.max_response_length
        over = None
        if limit is not None:
            over = pl.when(pl.col("response_max") > limit).then(
                pl.format("response_max {} exceeds max_response_length {}", pl.col("response_max"), pl.lit(limit))
            )
        return dec.reject_where(_first_reason(_step_check(file_step), over, _duplicate("this rank")))

    def _rows(self, dec: Decoded) -> pl.DataFrame:
        return dec.ok.select(
            *_carried(dec), "step", "rank", "dp_rank",
            # validation reward passes are a separate phase, so (step, rank, phase) stays a key
            phase=pl.when(pl.col("validate").fill_null(False)).then(pl.lit("reward_validation")).otherwise(pl.lit("reward")),
            seconds=pl.col("reward_time_s"),
            tokens=pl.col("response_sum"),
            tokens_max=pl.col("response_max"),
            n_samples=pl.col("batch_size"),
            source=pl.lit(self.name),
        )


# --------------------------------------------------------------------------- multi-turn workload

MULTITURN_NAME = r"^multiturn_workload_step_(\d+)\.jsonl$"
_FEW_CALLS = 512  # up to this many tool calls the window is cheaper than checking for runs
_FEW_RECORDS = 64  # up to this many records, their tool calls are counted by the window outright
TURN_FIELDS = (
    Field("turn", "int", nonneg=True),
    Field("prompt_tokens", "int", required=False, nonneg=True),
    Field("cached_tokens", "int", required=False, nonneg=True),
    Field("completion_tokens", "int", nonneg=True),
    Field("engine_latency_s", "num", required=False, nonneg=True),
    Field("finish_reason", "str", required=False),
)
TOOL_FIELDS = (
    Field("turn", "int", nonneg=True),
    Field("tool_name", "str", required=False),
    Field("latency_s", "num", required=False, nonneg=True),
    Field("status", "str", required=False),
    Field("response_token_len", "int", required=False, nonneg=True),
)
MULTITURN_FIELDS = (
    Field("step", "int", nonneg=True),
    Field("prompt_len", "int", nonneg=True),
    Field("max_response_len", "int", required=False, nonneg=True),
    Field("final_response_len", "int", nonneg=True),
    Field("final_response_loss_len", "int", required=False, nonneg=True),
    Field("turn_count", "int", required=False, nonneg=True),
    Field("tool_call_count", "int", required=False, nonneg=True),
    Field("finish_reason", "str", required=False),
    Field("validate", "bool", required=False),
    Field("prompt_group_id", "int", required=False),
    Field("sample_id", "int", required=False, name="sample_index"),
    Field("turns", "obj_list", sub=TURN_FIELDS),
    Field("tool_calls", "obj_list", required=False, sub=TOOL_FIELDS),
)


class MultiturnWorkloadReader(ReaderBase):
    name = "polytrace_multiturn"

    def sniff(self, head: str, path: Path) -> bool:
        return _sniff(head, path, MULTITURN_NAME,
                      lambda o: isinstance(o.get("turns"), list) and ("turn_count" in o or "final_response_len" in o))

    @staticmethod
    def _keys() -> tuple[pl.Expr, ...]:
        return pl.col("validate"), pl.col("prompt_group_id"), pl.col("sample_index")

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        file_step = step_from_name(ctx.path, MULTITURN_NAME)
        keys = FileKeys(*self._keys())
        for dec in decode_jsonl(ctx.path, MULTITURN_FIELDS):
            dec, tables = self._tables(_with_first(dec, keys), file_step, ctx)
            yield dec.chunk(tables)

    def read_many(self, ctxs: list[FileContext]) -> FilesChunk | None:
        got = decode_files([c.path for c in ctxs], MULTITURN_FIELDS, [c.data for c in ctxs])
        if got is None:
            return None
        dec, counts = got
        dec, tables = self._tables(_with_first(dec, FileKeys(pl.col(FILE_COLUMN), *self._keys())),
                                   _file_steps(ctxs, MULTITURN_NAME), ctxs[0])
        return files_chunk(dec, counts, tables)

    def _tables(self, dec: Decoded, file_step: int | pl.Expr | None,
                ctx: FileContext) -> tuple[Decoded, dict[str, pl.DataFrame]]:
        """``dec`` with its bad records rejected, and the rows of its good ones per table (each
        with the file index of rows decoded from several files)."""
        # the record's own limit is the engine's; the run.toml one applies when it has none
        limit = pl.coalesce(pl.col("max_response_len"), pl.lit(ctx.manifest.max_response_length, dtype=pl.Int64))
        dec = dec.reject_where(_first_reason(
            _step_check(file_step),
            pl.when(pl.col("final_response_len") > limit).then(
                pl.format("final_response_len {} exceeds max response length {}", pl.col("final_response_len"), limit)
            ),
            _duplicate("this prompt_group_id and sample_id"),
        ))
        base = dec.ok.with_columns(
            sample_id=pl.concat_str([
                _val_prefix(),
                pl.col("prompt_group_id").cast(pl.String).fill_null("na"), pl.lit("-"),
                # a record without ids is still addressable by its line
                pl.coalesce(pl.col("sample_index").cast(pl.String), pl.format("L{}", pl.col("line_no"))),
            ]),
            _limit=limit,
        )
        # small queries over one frame: one collect (each costs more than its work); the tool
        # calls of many records apart (see _tool_calls)
        carried = _carried(dec)
        few = base.height <= _FEW_RECORDS
        plans = [self._samples(base.lazy(), ctx, carried), self._turns(base.lazy(), carried)]
        if few:
            plans.append(self._call_rows(base.lazy(), carried).select(
                *carried, *self._call_columns(self._call_window(carried))))
        samples, turns, *calls = pl.collect_all(plans)
        return dec, {"samples": samples, "turns": turns,
                     "tool_calls": calls[0] if few else self._tool_calls(base, carried)}

    @staticmethod
    def _samples(base: pl.LazyFrame, ctx: FileContext, carried: list[str]) -> pl.LazyFrame:
        return base.select(
            *carried, "step", "sample_id", "validate", "line_no", "finish_reason",
            group_id=pl.col("prompt_group_id").cast(pl.String),
            task=pl.lit(ctx.manifest.task, dtype=pl.String),
            prompt_tokens=pl.col("prompt_len"),
            response_tokens=pl.col("final_response_len"),
            generated_tokens=pl.col("final_response_loss_len"),
            n_turns=pl.coalesce(pl.col("turn_count"), pl.col("turns").list.len().cast(pl.Int64)),
            n_tool_calls=pl.coalesce(pl.col("tool_call_count"), pl.col("tool_calls").list.len().cast(pl.Int64), pl.lit(0)),
            truncated=_truncated(pl.col("final_response_len"), pl.col("_limit")),
            token_source=pl.lit(RECORDED),
        )

    @staticmethod
    def _turns(base: pl.LazyFrame, carried: list[str]) -> pl.LazyFrame:
        return (
            base.select(*carried, "step", "sample_id", "turns")
            .explode("turns", empty_as_null=False)
            .unnest("turns")
            .select(*carried, "step", "sample_id", "turn", "prompt_tokens", "cached_tokens", "completion_tokens",
                    "engine_latency_s", "finish_reason")
        )

    @staticmethod
    def _call_rows(base: pl.LazyFrame, carried: list[str]) -> pl.LazyFrame:
        return (
            base.select(*carried, "step", "sample_id", "line_no", "tool_calls")
            .explode("tool_calls", empty_as_null=False)
            # tool_calls is optional: a record without it explodes to one null row, not a call
            .filter(pl.col("tool_calls").is_not_null())
            .unnest("tool_calls")
        )

    @staticmethod
    def _call_window(carried: list[str]) -> pl.Expr:
        # several calls can share a turn; their order in the record is the call order: a call's
        # index among the earlier calls of its (sample_id, turn) in its file
        return pl.int_range(pl.len()).over(*carried, "sample_id", "turn").cast(pl.Int64)

    @staticmethod
    def _call_columns(call_index: pl.Expr) -> list[pl.Expr]:
        return [pl.col("step"), pl.col("sample_id"), pl.col("turn"), call_index.alias("call_index"),
                pl.col("tool_name"), pl.col("latency_s"), pl.col("status"),
                pl.col("response_token_len").alias("response_tokens")]

    @classmethod
    def _tool_calls(cls, base: pl.DataFrame, carried: list[str]) -> pl.DataFrame:
        calls = cls._call_rows(base.lazy(), carried).collect()
        i = pl.int_range(pl.len(), dtype=pl.Int64)
        rec, turn = pl.col("line_no"), pl.col("turn")
        new_rec = (rec != rec.shift(1)).fill_null(True)
        for c in carried:  # the first line of a file after a one-line file has the same number
            new_rec = new_rec | (pl.col(c) != pl.col(c).shift(1)).fill_null(True)
        # the usual file: no two records share a sample_id and each record's calls come in turn
        # order, so each (sample_id, turn) is one run of rows; counting within runs avoids a
        # window over groups (~1.5 ms of a 3 MB step file)
        runs = calls.height > _FEW_CALLS and base.select(pl.struct(*carried, "sample_id").is_unique().all()).item() \
            and calls.select((new_rec | (turn >= turn.shift(1)).fill_null(False)).all()).item()
        if runs:
            start = new_rec | (turn != turn.shift(1)).fill_null(True)
            call_index = i - pl.when(start).then(i).forward_fill()
        else:
            call_index = cls._call_window(carried)
        return calls.select(*carried, *cls._call_columns(call_index))


# --------------------------------------------------------------------------- DAPO filter batches

DAPO_NAME = r"^dapo_filter_indices.*\.jsonl$"
DAPO_FIELDS = (
    Field("workload_step", "int", required=False, nonneg=True),
    Field("trainer_step", "int", nonneg=True),
    Field("gen_batch_index", "int", nonneg=True),
    Field("prompt_count", "int", nonneg=True),
    Field("n_sampling", "int", required=False, nonneg=True),
    Field("train_batch_size", "int", required=False, nonneg=True),
    Field("kept_prompt_count", "int", nonneg=True),
    Field("used_prompt_count", "int", nonneg=True),
    Field("kept_prompt_indices", "int_list", required=False, nonneg=True),
    Field("used_prompt_indices", "int_list", required=False, nonneg=True),
)


class DapoFilterReader(ReaderBase):
    name = "polytrace_dapo_filter"

    def sniff(self, head: str, path: Path) -> bool:
        return _sniff(head, path, DAPO_NAME,
                      lambda o: "kept_prompt_count" in o or ("trainer_step" in o and "gen_batch_index" in o))

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        keys = FileKeys(pl.col("trainer_step"), pl.col("gen_batch_index"))
        for dec in decode_jsonl(ctx.path, DAPO_FIELDS):
            dec = _with_first(dec, keys)
            kept, used, gen = pl.col("kept_prompt_count"), pl.col("used_prompt_count"), pl.col("prompt_count")
            dec = dec.reject_where(_first_reason(
                pl.when(kept > gen).then(pl.format("kept_prompt_count {} exceeds prompt_count {}", kept, gen)),
                pl.when(used > kept).then(pl.format("used_prompt_count {} exceeds kept_prompt_count {}", used, kept)),
                pl.when(pl.col("kept_prompt_indices").list.len() != kept).then(
                    pl.format("kept_prompt_indices has {} entries, kept_prompt_count says {}",
                              pl.col("kept_prompt_indices").list.len(), kept)),
                pl.when(pl.col("used_prompt_indices").list.len() != used).then(
                    pl.format("used_prompt_indices has {} entries, used_prompt_count says {}",
                              pl.col("used_prompt_indices").list.len(), used)),
                _duplicate("this trainer_step and gen_batch_index"),
            ))
            n = pl.col("n_sampling")
            rows = dec.ok.select(
                "trainer_step", "workload_step", "train_batch_size", "line_no",
                gen_batch=pl.col("gen_batch_index"),
                prompts_generated=gen, prompts_kept=kept, prompts_used=used,
                samples_generated=gen * n, samples_kept=kept * n,
            )
            yield dec.chunk({"filter_batches": rows})
