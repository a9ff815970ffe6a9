"""Our own structural checks of written exports: what each consumer's loader needs of a file,
checked without the consumer (``make demo`` reports them; the conformance suite runs the consumers
themselves). Each function takes a workload's export directory and returns the problems found
(empty: the files are laid out as the consumer reads them). Files are small (one workload), so
they are read whole.
"""

from __future__ import annotations

import csv
import json
import math
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import scipy.stats

MOONCAKE_BLOCK = 512  # tokens per hash block, as aiperf's mooncake loader materialises them


def jsonl_objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; a line that is not one raises ValueError naming it."""
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError(f"{path.name}:{i}: not a JSON object")
        out.append(obj)
    return out


def missing(recs: Iterable[dict[str, Any]], keys: Iterable[str], where: str) -> list[str]:
    """``where: no <key>`` for each key some record lacks (once per key)."""
    keys = list(keys)
    gone = {k for r in recs for k in keys if k not in r}
    return [f"{where}: no {k}" for k in keys if k in gone]


def step_numbers(files: list[Path]) -> list[int]:
    return sorted(int(m.group(1)) for p in files if (m := re.search(r"_step_(\d+)\.jsonl$", p.name)))


def check_polytrace_v2(d: Path) -> list[str]:
    """Step files numbered 0..N-1; packed records as Generator.py reads them; multi-turn records with
    every replay field, each turn's generation_prompt_len its prompt_tokens (what upstream's replay
    prefills) and the first equal to the record's prompt_len."""
    packed, multi = sorted(d.glob("packed_lengths_step_*.jsonl")), sorted(d.glob("multiturn_workload_step_*.jsonl"))
    files = multi or packed
    if not files:
        return ["no packed_lengths_step_<k>.jsonl or multiturn_workload_step_<k>.jsonl"]
    steps = step_numbers(files)
    problems = [] if steps == list(range(len(steps))) else [f"steps {steps} are not numbered 0..{len(steps) - 1}"]
    for p in files:
        recs = jsonl_objects(p)
        if not recs:
            problems.append(f"{p.name}: no records")
        elif not multi:
            problems += missing(recs, ("step", "rank", "dp_rank", "local_index", "input", "output"), p.name)
        else:
            problems += missing(recs, ("prompt_len", "turns", "tool_calls", "final_response_len", "response_loss_mask_rle",
                                       "prompt_group_id", "sample_id"), p.name)
            turns = [t for r in recs for t in r.get("turns") or []]
            calls = [c for r in recs for c in r.get("tool_calls") or []]
            problems += missing(turns, ("turn", "generation_prompt_len", "prompt_tokens", "assistant_append_len"), f"{p.name} turns")
            problems += missing(calls, ("turn", "append_len"), f"{p.name} tool_calls")
            if not problems:
                off = sum(1 for r in recs for i, t in enumerate(r["turns"])
                          if t["generation_prompt_len"] != t["prompt_tokens"] or (i == 0 and t["prompt_tokens"] != r["prompt_len"]))
                if off:
                    problems.append(f"{p.name}: {off} turn(s) whose generation_prompt_len is not their prompt_tokens")
    return problems


def check_polytrace_v1(d: Path) -> list[str]:
    files = sorted(d.glob("*.json"))
    if len(files) != 1:
        return [f"{len(files)} JSON files (one expected)"]
    doc = json.loads(files[0].read_text())
    problems = []
    for step, e in doc.items():
        n_in = len(e.get("input") or [])
        groups = e.get("output_groups")
        flat = e.get("output")
        if not n_in:
            problems.append(f"step {step}: no input")
        elif groups is not None and len(groups) != n_in:
            problems.append(f"step {step}: {n_in} inputs, {len(groups)} output_groups")
        elif groups is None and (flat is None or len(flat) % n_in):
            problems.append(f"step {step}: outputs do not split over {n_in} inputs")
    return problems or ([] if doc else ["no steps"])


def check_polytrace_params(d: Path) -> list[str]:
    files = sorted(d.glob("*.json"))
    if len(files) != 1:
        return [f"{len(files)} JSON files (one expected)"]
    doc = json.loads(files[0].read_text())
    tasks = [k for k in doc if k.endswith("_task")]
    problems = [] if tasks else ["no <name>_task entry"]
    for t in tasks:
        for name in ("input_distribution", "output_distribution"):
            dist = doc[t].get(name)
            if dist is None:
                continue
            family = getattr(scipy.stats, str(dist.get("type")), None)
            if family is None:
                problems.append(f"{t}.{name}: {dist.get('type')!r} is not a scipy.stats distribution")
            elif not math.isfinite(_median(family, dist["parameters"])):
                problems.append(f"{t}.{name}: {dist['type']}{tuple(dist['parameters'])} has no finite median")
    return problems


def _median(family: Any, params: list[Any]) -> float:
    with warnings.catch_warnings():  # rv_histogram over uneven bins warns that it assumes a density
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(family(*params).median())


VIDUR_COLUMNS = {
    "vidur_trace.csv": ("num_prefill_tokens", "num_decode_tokens"),  # TraceRequestLengthGenerator
    "vidur_replay_trace.csv": ("Date", "Time", "PromptTokenCount", "CompletionTokenCount"),  # TraceReplayRequestGenerator
    "vidur_interval_trace.csv": ("arrival_time",),  # TraceRequestIntervalGenerator
}


def check_vidur(d: Path) -> list[str]:
    problems = []
    for name, cols in VIDUR_COLUMNS.items():
        p = d / name
        if not p.is_file():
            problems.append(f"no {name}")
            continue
        with open(p, newline="") as fh:
            rows = csv.reader(fh)
            header = next(rows, [])
            n = sum(1 for _ in rows)
        problems += [f"{name}: no column {c}" for c in cols if c not in header]
        if not n:
            problems.append(f"{name}: no rows")
    return problems


def check_mooncake(d: Path) -> list[str]:
    """Integer-ms non-decreasing timestamps; ceil(input_length / 512) hash ids per request; every hash id
    standing for one block size (aiperf refuses an id materialised at two sizes)."""
    p = d / "mooncake_trace.jsonl"
    if not p.is_file():
        return ["no mooncake_trace.jsonl"]
    recs = jsonl_objects(p)
    problems = missing(recs, ("timestamp", "input_length", "output_length", "hash_ids"), p.name)
    if problems or not recs:
        return problems or [f"{p.name}: no requests"]
    ts = [r["timestamp"] for r in recs]
    if not all(isinstance(t, int) for t in ts):
        problems.append("fractional-millisecond timestamps")
    if any(b < a for a, b in zip(ts, ts[1:], strict=False)):
        problems.append("timestamps go backwards")
    size: dict[int, int] = {}
    for i, r in enumerate(recs, 1):
        n, ids = int(r["input_length"]), r["hash_ids"]
        if len(ids) != -(-n // MOONCAKE_BLOCK):
            problems.append(f"line {i}: {len(ids)} hash ids for {n} tokens")
            break
        for j, h in enumerate(ids):
            s = MOONCAKE_BLOCK if j < len(ids) - 1 else n - MOONCAKE_BLOCK * j
            if size.setdefault(h, s) != s:
                problems.append(f"line {i}: hash id {h} stands for {s} tokens, earlier for {size[h]}")
                return problems
    return problems


AIPERF_PAIR = re.compile(r"^\s*(\d+)(?:\|[\d.]+)?\s*,\s*(\d+)(?:\|[\d.]+)?\s*:\s*([\d.]+)\s*$")


def check_aiperf(d: Path) -> list[str]:
    """Both files: positive lengths, probabilities summing to 100 (aiperf allows 1e-6)."""
    problems = []
    txt, js = d / "aiperf_sequence_distribution.txt", d / "aiperf_sequence_distribution.json"
    if not txt.is_file() or not js.is_file():
        return [f"no {p.name}" for p in (txt, js) if not p.is_file()]
    probs = []
    for part in txt.read_text().strip().split(";"):
        m = AIPERF_PAIR.match(part)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            return [f"{txt.name}: bad pair {part!r}"]
        probs.append(float(m.group(3)))
    pairs = json.loads(js.read_text()).get("pairs") or []
    for name, ps in ((txt.name, probs), (js.name, [float(q["prob"]) for q in pairs])):
        if abs(sum(ps) - 100.0) > 1e-6:
            problems.append(f"{name}: probabilities sum to {sum(ps):.6f}, not 100")
    return problems
