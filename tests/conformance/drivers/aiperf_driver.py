"""Runs under aiperf's own environment: load files with aiperf's own classes.

    python aiperf_driver.py JOBS.json   ->  one JSON list of verdicts on the last line of stdout

A job is ``{"check": C, "file": PATH}`` with C one of
  ``sequence_distribution``  DistributionParser.parse(<file text>) (what ``--sequence-distribution`` does with
                             the .txt string or the .json document): formats, positive lengths, probabilities
                             summing to 100 within 1e-6.
  ``mooncake``               MooncakeTraceDatasetLoader.can_load(<first record>), then load_dataset() (every line
                             through the MooncakeTrace model, grouped into sessions by session_id) and
                             convert_to_conversations() (prompts synthesised from hash_ids / input_length, one
                             Turn per line). Also reported: whether timestamps are integer milliseconds and
                             non-decreasing, and the prefill tokens aiperf's multi-turn mode would send: it keeps a
                             session's history and threads each turn's response into it, so turn k carries
                             sum(input_length[:k+1]) + sum(output_length[:k]).
The prompt generator needs a tokenizer; the machine has no model hub, so one is trained here on aiperf's own
corpus (``assets/shakespeare.txt``), laid out as a cached hub snapshot in a private ``HF_HOME`` and loaded
offline by name through aiperf's Tokenizer (its decode worker processes load it again the same way).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from verdicts import run_jobs

# Before anything imports huggingface_hub: a private cache (in the working directory, which the suite
# removes afterwards), and never the network.
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="aiperf-hf-home-", dir=os.getcwd())
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
TOKENIZER_REPO = "polytrace/conformance-bpe"
TOKENIZER_REVISION = "0" * 40

logging.disable(logging.CRITICAL)

_PROMPT_GENERATOR: Any = None


def sequence_distribution(job: dict[str, Any]) -> dict[str, Any]:
    from aiperf.common.models.sequence_distribution import DistributionParser

    dist = DistributionParser.parse(Path(job["file"]).read_text())
    stats = dist.get_statistics()
    return {"ok": True, "pairs": stats["num_pairs"], "total_probability": stats["total_probability"],
            "expected_isl": stats["expected_isl"], "expected_osl": stats["expected_osl"]}


def _prompt_generator() -> Any:
    global _PROMPT_GENERATOR
    if _PROMPT_GENERATOR is None:
        import aiperf
        from aiperf.common import random_generator as rng
        from aiperf.common.tokenizer import Tokenizer
        from aiperf.dataset.generator.prompt import PromptGenerator
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        rng.init(0)
        corpus = Path(aiperf.__file__).parent / "dataset" / "generator" / "assets" / "shakespeare.txt"
        tok = HFTokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=2000, special_tokens=["[UNK]", "<s>", "</s>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                     show_progress=False))
        repo = Path(os.environ["HF_HOME"]) / "hub" / ("models--" + TOKENIZER_REPO.replace("/", "--"))
        snapshot = repo / "snapshots" / TOKENIZER_REVISION
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>",
                                eos_token="</s>").save_pretrained(snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(TOKENIZER_REVISION)
        _PROMPT_GENERATOR = PromptGenerator(prompts=None, prefix_prompts=None,
                                            tokenizer=Tokenizer.from_pretrained(TOKENIZER_REPO))
    return _PROMPT_GENERATOR


def mooncake(job: dict[str, Any]) -> dict[str, Any]:
    from aiperf.dataset.loader.mooncake_trace import MooncakeTraceDatasetLoader

    path = job["file"]
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    out: dict[str, Any] = {"lines": len(lines)}
    if not lines:
        return {**out, "ok": False, "error": "empty file"}
    first = json.loads(lines[0])
    out["can_load"] = MooncakeTraceDatasetLoader.can_load(first, path)
    if not out["can_load"]:
        return {**out, "ok": False, "error": "MooncakeTraceDatasetLoader.can_load refused the first record"}
    loader = MooncakeTraceDatasetLoader(filename=path, prompt_generator=_prompt_generator())
    data = loader.load_dataset()
    traces = [t for ts in data.values() for t in ts]
    stamps = [t.timestamp for t in traces if t.timestamp is not None]
    file_stamps = [json.loads(ln).get("timestamp") for ln in lines]
    prefill = 0
    for ts in data.values():
        history = 0
        for t in ts:
            history += t.input_length or 0
            prefill += history
            history += t.output_length or 0
    out.update(
        traces=len(traces), sessions=len(data), multi_turn_sessions=sum(1 for ts in data.values() if len(ts) > 1),
        max_turns=max((len(ts) for ts in data.values()), default=0),
        input_length_sum=sum(t.input_length or 0 for t in traces),
        multiturn_prefill_tokens=prefill,
        timestamps=len(stamps),
        timestamps_integer_ms=all(isinstance(s, int) or (isinstance(s, float) and math.isfinite(s) and s.is_integer())
                                  for s in stamps),
        timestamps_non_decreasing=all(a is not None and b is not None and a <= b
                                      for a, b in zip(file_stamps, file_stamps[1:], strict=False)),
    )
    try:  # the load facts above stand even when aiperf refuses to build the requests
        conversations = loader.convert_to_conversations(data)
    except Exception as exc:
        return {**out, "ok": False, "error": f"{type(exc).__name__}: {exc}", "where": traceback.format_exc(limit=-2)}
    out["conversations"] = len(conversations)
    out["turns_built"] = sum(len(c.turns) for c in conversations)
    out["max_tokens_match"] = all(turn.max_tokens == t.output_length
                                  for c in conversations for turn, t in zip(c.turns, data[c.session_id], strict=True))
    out["ok"] = out["turns_built"] == len(lines) and out["max_tokens_match"]
    if not out["ok"]:
        out["error"] = f"{out['turns_built']} turns built from {len(lines)} lines"
    return out


CHECKS = {"sequence_distribution": sequence_distribution, "mooncake": mooncake}


def main() -> int:
    return run_jobs("aiperf", CHECKS)


if __name__ == "__main__":
    sys.exit(main())
