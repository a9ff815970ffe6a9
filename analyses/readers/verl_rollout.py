"""verl rollout dumps (``trainer.rollout_data_dir``): one ``<step>.jsonl`` per training step, one
record per sample with the decoded ``input`` and ``output`` text, ``score``, ``step`` and, in newer
verl, ``request_id``.

The dump has text, not token counts: counts come from the run's tokenizer when ``run.toml`` names a
local ``tokenizer.json``, else from the documented estimate (``tokens.py``); ``samples.token_source``
says which.

Multi-turn structure. verl decodes with special tokens skipped, so a Qwen chat turn boundary shows
as a bare role line: an agent-loop output reads ``…<tool_call>{…}</tool_call>\\nuser\\n
<tool_response>…</tool_response>\\nassistant\\n…``. An assistant turn therefore starts the output
and after every ``</tool_response>`` followed by an ``assistant`` role line (with or without the
``<|im_end|>``/``<|im_start|>`` tokens, for dumps that kept them). Bare ``assistant`` lines elsewhere
are the model imitating the template, not turns (seen in the hecate dump), so they do not count.
``n_tool_calls`` counts complete ``<tool_call>…</tool_call>`` blocks the model emitted, malformed
ones included; an unterminated ``<tool_call>`` (cut output) is not a call.

Truncation is exact only with a tokenizer: with estimated counts ``truncated`` is null (unknown)
and no record is rejected for exceeding the limit, because an estimate can overshoot it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, ReaderBase
from analyses.readers.tokens import TOKENIZER_SOURCE, count_tokens
from analyses.readers.typed_jsonl import Field, FileKeys, decode_jsonl, first_json_objects, step_from_name

STEP_NAME = r"^(\d+)\.jsonl$"
FIELDS = (
    Field("input", "str"),
    Field("output", "str"),
    Field("step", "int", nonneg=True),
    Field("score", "num", required=False),
    Field("request_id", "str", required=False),
)
TOOL_CALL = r"(?s)<tool_call>.*?</tool_call>"
# the end of a tool response followed by the next assistant turn's role header
NEXT_TURN = r"</tool_response>\s*(?:<\|im_end\|>\s*)?(?:<\|im_start\|>)?assistant\n"
# where an assistant turn's own text ends: the user/tool message that answers its calls
TURN_TEXT = r"(?s)^(.*?)(?:\n?(?:<\|im_end\|>\n?)?(?:<\|im_start\|>)?user\n<tool_response>|$)"
TOOL_NAME = r'"name"\s*:\s*"([^"]*)"'
_SEP = "\x00"


class VerlRolloutDumpReader(ReaderBase):
    name = "verl_rollout_dump"
    framework = "verl"

    def sniff(self, head: str, path: Path) -> bool:
        objs = first_json_objects(head)
        if any(isinstance(o.get("input"), str) and isinstance(o.get("output"), str)
               and isinstance(o.get("step"), int) and not isinstance(o.get("step"), bool) for o in objs):
            return True
        # a step file whose first lines are all broken JSON is still ours (they get rejected with
        # reasons); parseable records of another shape are some other format's
        return (not objs and re.match(STEP_NAME, path.name) is not None and head.lstrip().startswith("{")
                and '"output"' in head)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        file_step = step_from_name(ctx.path, STEP_NAME)
        limit = ctx.manifest.max_response_length
        tok = ctx.manifest.tokenizer_path()
        # whole-file state: a repeated request_id, and the first line of each prompt (its group)
        ids, prompts = FileKeys(pl.col("request_id")), FileKeys(pl.col("input"))
        for dec in decode_jsonl(ctx.path, FIELDS):
            dec = replace(dec, ok=dec.ok.with_columns(_first_id=ids.first_line(dec.ok)))
            reasons = [pl.when((pl.col("_first_id") != pl.col("line_no")) & pl.col("request_id").is_not_null())
                       .then(pl.lit("duplicate request_id"))]
            if file_step is not None:
                reasons.insert(0, pl.when(pl.col("step") != file_step).then(
                    pl.format("step {} contradicts the file name (step {})", pl.col("step"), pl.lit(file_step))))
            dec = dec.reject_where(pl.coalesce(reasons))
            dec = replace(dec, ok=dec.ok.with_columns(_group_line=prompts.first_line(dec.ok)))
            counted, source = count_tokens(dec.ok, {"prompt_tokens": "input", "response_tokens": "output"}, tok)
            dec = replace(dec, ok=counted)
            exact = source == TOKENIZER_SOURCE
            if exact and limit is not None:
                dec = dec.reject_where(pl.when(pl.col("response_tokens") > limit).then(
                    pl.format("response has {} tokens, over max_response_length {}", pl.col("response_tokens"), pl.lit(limit))))
            counted = dec.ok
            samples = self._samples(counted, ctx, source, limit if exact else None)
            turns, calls = self._turns_and_calls(counted, samples, tok)
            yield dec.chunk({"samples": samples, "turns": turns, "tool_calls": calls})

    @staticmethod
    def _samples(df: pl.DataFrame, ctx: FileContext, source: str, limit: int | None) -> pl.DataFrame:
        return df.select(
            "step", "line_no", "prompt_tokens", "response_tokens",
            sample_id=pl.coalesce(pl.col("request_id"), pl.format("L{}", pl.col("line_no"))),
            # samples of one prompt share its text; the first line holding it in the file names
            # the group (FileKeys: a group split by a batch boundary stays one group)
            group_id=pl.format("g{}", pl.col("_group_line")),
            task=pl.lit(ctx.manifest.task, dtype=pl.String),
            reward=pl.col("score"),
            n_turns=(pl.col("output").str.count_matches(NEXT_TURN) + 1).cast(pl.Int64),
            n_tool_calls=pl.col("output").str.count_matches(TOOL_CALL).cast(pl.Int64),
            truncated=pl.lit(None, dtype=pl.Boolean) if limit is None else pl.col("response_tokens") >= limit,
            validate=pl.lit(False),  # rollout_data_dir holds training rollouts; validation goes elsewhere
            token_source=pl.lit(source),
        )

    @staticmethod
    def _turns_and_calls(df: pl.DataFrame, samples: pl.DataFrame, tok: Path | None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """One ``turns`` row per assistant turn and one ``tool_calls`` row per emitted call."""
        segs = (
            df.select(
                "step", "prompt_tokens",
                sample_id=samples["sample_id"],
                seg=pl.col("output").str.replace_all(NEXT_TURN, "</tool_response>" + _SEP).str.split(_SEP),
            )
            .with_columns(turn=pl.int_ranges(pl.col("seg").list.len()))
            .explode("seg", "turn")
            .with_columns(text=pl.col("seg").str.extract(TURN_TEXT, 1))
        )
        segs, _ = count_tokens(segs, {"completion_tokens": "text", "seg_tokens": "seg"}, tok)
        turns = segs.select(
            "step", "sample_id", "turn", "completion_tokens",
            # the context a turn sees: the prompt plus every earlier turn and its tool responses
            prompt_tokens=pl.col("prompt_tokens") + pl.col("seg_tokens").cum_sum().over("sample_id") - pl.col("seg_tokens"),
        )
        calls = (
            segs.select("step", "sample_id", "turn", call=pl.col("text").str.extract_all(TOOL_CALL))
            .explode("call", empty_as_null=False)
            .filter(pl.col("call").is_not_null())
            .select(
                "step", "sample_id", "turn",
                call_index=pl.int_range(pl.len()).over("sample_id", "turn").cast(pl.Int64),
                tool_name=pl.col("call").str.extract(TOOL_NAME, 1),
            )
        )
        return turns, calls
