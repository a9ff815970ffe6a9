"""Token counts for rollout text: a real tokenizer when the run names one, else an estimate.

Rollout dumps hold decoded text, not token ids. When ``run.toml`` names a local ``tokenizer.json``
the counts come from it (``tokenizers`` reads it offline; ``encode_batch`` over a whole column).
Otherwise they come from :func:`estimate_tokens`, a pre-tokenizer count rather than chars/4:
the Qwen2/GPT-4-style pre-tokenizers split text into letter runs, single digits (Qwen2) and
punctuation runs, and a ~150k-entry BPE vocabulary makes nearly every common English word piece
one token. So a text costs about one token per letter run, per digit, per punctuation run and per
newline run, one more per 10 letters of a long word and per 4 characters of a long punctuation
run, and one per CJK character; the sum is scaled by ``ESTIMATE_SCALE`` for the pieces BPE still
splits (rare words, names).

Calibration: no production tokenizer is available offline, so the check is against logged token
counts of the same data. The ZyQiu6 verl rollout dump (step 1, 128 GSM8K samples) comes from
``Qwen/Qwen2.5-0.5B-Instruct`` PPO on GSM8K (its ``scripts/run_ppo_onpolicy.sh`` at the dump's
commit); verl's own GSM8K baseline log with the same model and prompt template
(``verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log``) reports ``prompt_length/mean``
103.6 over 435 steps (so about 98.6 once the 5 chat special tokens the dump strips are removed)
and ``response_length/mean`` 309.6 over its first 5 steps. On the dump's text:

=================  ===========  =============
mean tokens         prompt       response
=================  ===========  =============
logged (target)     ~98.6        ~309.6
chars / 4           98.5         239.8
pre-token count     94.1         283.4
this estimate x1.06 99.7         300.4
=================  ===========  =============

chars/4 is right on English prose but 23% low on math answers, whose digits are one token
each; the estimate is within ~3% on both. Targets carry sampling error (128 samples, different
seeds), so trust the estimate to about 10% on a population mean and much less per sample.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import polars as pl

ESTIMATE_SOURCE = "estimate_pretok_v1"
ESTIMATE_SCALE = 1.06
TOKENIZER_SOURCE = "tokenizer"

_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}"
_PATTERNS: tuple[str, ...] = (
    rf"[[\p{{L}}\p{{M}}]--[{_CJK}]]+",  # letter runs (words)
    rf"[[\p{{L}}\p{{M}}]--[{_CJK}]]{{10}}",  # one more token per 10 letters of a long word
    r"\p{N}",  # digits are single tokens in Qwen2-family vocabularies
    r"[^\s\p{L}\p{M}\p{N}]+",  # punctuation runs
    r"[^\s\p{L}\p{M}\p{N}]{4}",  # long punctuation runs split
    r"\n+",  # newline runs
    r"[ \t]{2,}",  # indentation / space runs
    rf"[{_CJK}]",  # CJK: about one token per character
)


def estimate_tokens(text: pl.Expr) -> pl.Expr:
    """Estimated token count of a String expression (null stays null)."""
    total = pl.lit(0, dtype=pl.Int64)
    for pat in _PATTERNS:
        total = total + text.str.count_matches(pat).cast(pl.Int64)
    return (total * ESTIMATE_SCALE).round(0).cast(pl.Int64)


@lru_cache(maxsize=4)
def _load_tokenizer(path: str):  # noqa: ANN202 - tokenizers.Tokenizer, imported lazily
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def tokenizer_counts(texts: pl.Series, path: Path) -> pl.Series:
    """Exact token counts of ``texts`` with the tokenizer.json at ``path`` (nulls stay null).

    Special tokens are not added: dumps hold decoded text, which already lost them.
    """
    tok = _load_tokenizer(str(path))
    filled = texts.fill_null("").to_list()
    encs = tok.encode_batch(filled, add_special_tokens=False)
    counts = pl.Series(texts.name, [len(e.ids) for e in encs], dtype=pl.Int64)
    return pl.select(pl.when(texts.is_null()).then(None).otherwise(counts)).to_series().alias(texts.name)


def count_tokens(df: pl.DataFrame, columns: dict[str, str], tokenizer: Path | None) -> tuple[pl.DataFrame, str]:
    """Add token-count columns (``{out_name: text_column}``) to ``df``; returns it and the source.

    The tokenizer is used when ``tokenizer`` exists; a named but missing tokenizer is an error
    of the run's manifest, so it raises rather than silently estimating.
    """
    if tokenizer is not None:
        if not tokenizer.exists():
            raise FileNotFoundError(f"run.toml names tokenizer {tokenizer}, which does not exist")
        return df.with_columns(tokenizer_counts(df[src], tokenizer).alias(out) for out, src in columns.items()), TOKENIZER_SOURCE
    return df.with_columns(estimate_tokens(pl.col(src)).alias(out) for out, src in columns.items()), ESTIMATE_SOURCE
