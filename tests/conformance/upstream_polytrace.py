"""A model of upstream PolyTrace's workload consumers, written from its account in
``../shared/upstream/PolyTrace/PROVENANCE.md`` (upstream has no licence, so none of its code is here).

Upstream is Zhou-jiecheng/PolyTrace at commit :data:`UPSTREAM_COMMIT`. Modelled:

* ``suite.py --validate CONFIG`` -> :func:`validate` (and ``python upstream_polytrace.py --validate``):
  ``step_groups``, multi-turn vs packed workloads, ``expected_records_per_step``,
  ``filter_indices_file``, ``reward_timing_glob``; a JSON result with ``ok`` and per-step entries.
* the readers of its benchmark forks (``*/verl/trainer/Generator.py``): :func:`read_packed_v2`,
  :func:`read_v1`, :func:`read_multiturn`.
* the multi-turn replay bookkeeping of ``_async_replay_workload_request`` (Search-R1's sglang rollout):
  :func:`replay_record`, :func:`replay_step`.

Where PROVENANCE.md is silent the choice is ours and says so in a comment ("not stated upstream").
Nothing here imports the project: the model must not share a bug with the exporters it judges.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UPSTREAM_REPO = "Zhou-jiecheng/PolyTrace"
UPSTREAM_COMMIT = "4246156f711a3990e26de1623ef3f726874a1013"
MULTITURN_FILE = "multiturn_workload_step_{step}.jsonl"
PACKED_FILE = "packed_lengths_step_{step}.jsonl"
DEFAULT_TOOL_NAME = "search"


# ----------------------------------------------------------------------------- configs


def load_config(path: Path) -> dict[str, Any]:
    """Upstream's benchmark configs are JSON text despite their ``.yaml`` suffix."""
    return json.loads(Path(path).read_text())


def parse_step_groups(step_groups: str) -> list[list[str]]:
    """``"0;1;2;3"`` -> [["0"], ["1"], ["2"], ["3"]]; ``"0,1;2,3"`` -> [["0", "1"], ["2", "3"]]."""
    groups = [[s.strip() for s in g.split(",") if s.strip()] for g in str(step_groups).split(";")]
    return [g for g in groups if g]


def config_steps(cfg: dict[str, Any]) -> list[str]:
    """Every step the config names, in order, each once."""
    seen: dict[str, None] = {}
    for group in parse_step_groups(cfg["step_groups"]):
        for s in group:
            seen.setdefault(s, None)
    return list(seen)


def with_workload_path(cfg: dict[str, Any], workload_path: Path) -> dict[str, Any]:
    """The config with only ``workload_path`` changed, as the conformance checks use it."""
    return {**cfg, "workload_path": str(workload_path)}


# ----------------------------------------------------------------------------- suite.py --validate


class BadWorkloadFile(ValueError):
    """A workload file upstream's ``json.loads`` per line would choke on."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (blank lines ignored); a line that is not a JSON object raises."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BadWorkloadFile(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
            if not isinstance(obj, dict):
                raise BadWorkloadFile(f"{path}:{lineno}: not a JSON object")
            out.append(obj)
    return out


def _multiturn_step(path: Path, step: str, expected: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"step": step, "path": str(path)}
    if not path.is_file():
        return {**entry, "ok": False, "error": f"missing {path}"}
    try:
        recs = read_jsonl(path)
    except BadWorkloadFile as exc:
        return {**entry, "ok": False, "error": str(exc)}
    sample_ids = [r["sample_id"] for r in recs if isinstance(r.get("sample_id"), int)]
    entry.update(
        records=len(recs),
        prompt_groups=len({json.dumps(r["prompt_group_id"]) for r in recs if "prompt_group_id" in r}),
        sample_id_min=min(sample_ids) if sample_ids else None,
        sample_id_max=max(sample_ids) if sample_ids else None,
        turns=sum(len(r.get("turns") or []) for r in recs),
        tool_calls=sum(len(r.get("tool_calls") or []) for r in recs),
    )
    if not recs:
        return {**entry, "ok": False, "error": f"no records in {path}"}
    if expected is not None and len(recs) != expected:
        return {**entry, "ok": False, "error": f"expected {expected} records, found {len(recs)} in {path}"}
    return {**entry, "ok": True}


def _packed_step(path: Path, step: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"step": step, "path": str(path)}
    if not path.is_file():
        return {**entry, "ok": False, "error": f"missing {path}"}
    try:
        recs = read_jsonl(path)
    except BadWorkloadFile as exc:
        return {**entry, "ok": False, "error": str(exc)}
    entry["records"] = len(recs)
    if not recs:
        return {**entry, "ok": False, "error": f"no records in {path}"}
    return {**entry, "ok": True}


def validate(cfg: dict[str, Any], workload_path: Path | None = None) -> dict[str, Any]:
    """What ``suite.py --validate`` reports for ``cfg`` (``workload_path`` overridden when given)."""
    wp = Path(workload_path) if workload_path is not None else Path(os.path.expandvars(cfg["workload_path"]))
    wl = cfg.get("workload") or {}
    kind = wl.get("type")
    steps = config_steps(cfg)
    res: dict[str, Any] = {"name": cfg.get("name"), "workload_path": str(wp), "type": kind,
                           "step_groups": cfg["step_groups"]}
    if kind == "multiturn":
        expected = wl.get("expected_records_per_step")
        res["expected_records_per_step"] = expected
        res["steps"] = [_multiturn_step(wp / MULTITURN_FILE.format(step=s), s, expected) for s in steps]
    else:
        res["steps"] = [_packed_step(wp / PACKED_FILE.format(step=s), s) for s in steps]
    ok = all(e["ok"] for e in res["steps"])
    if kind != "multiturn" and wl.get("filter_indices_file"):
        p = wp / wl["filter_indices_file"]
        fi: dict[str, Any] = {"path": str(p), "ok": p.is_file()}
        if not p.is_file():
            fi["error"] = f"missing {p}"
        res["filter_indices"] = fi
        ok = ok and fi["ok"]
    if kind != "multiturn" and wl.get("reward_timing_glob"):
        # Upstream globs and counts these; a count of 0 is reported, not an error.
        files = sorted(glob.glob(str(wp / wl["reward_timing_glob"])))
        res["reward_timings"] = {"glob": wl["reward_timing_glob"], "files": len(files)}
    res["ok"] = ok
    return res


# ----------------------------------------------------------------------------- readers (Generator.py)


def read_packed_v2(path: Path) -> tuple[list[int], list[list[int]]]:
    """Packed v2 step file -> (prompt lengths, response lengths per prompt): records with
    ``validate: true`` skipped, the rest sorted by (dp_rank, rank, local_index)."""
    recs = [r for r in read_jsonl(path) if not r.get("validate")]
    recs.sort(key=lambda r: (r["dp_rank"], r["rank"], r["local_index"]))
    inputs = [int(r["input"]) for r in recs]
    outputs = [[int(x) for x in r["output"]] for r in recs]
    return inputs, outputs


def read_v1(path: Path, step: int | str) -> tuple[list[int], list[list[int]]]:
    """v1 ``{"<step>": {"input": [...], "output": [...] | "output_groups": [[...], ...]}}`` ->
    (prompt lengths, response lengths per prompt).

    A flat ``output`` of n entries per input (consecutive, as verl repeats prompts) is cut into groups
    of n; equal lengths pair one to one. Any other ratio is an error (not stated upstream)."""
    doc = json.loads(Path(path).read_text())
    key = str(step)
    if key not in doc:
        raise KeyError(f"step {key} not in {path}")
    entry = doc[key]
    inputs = [int(x) for x in entry["input"]]
    if "output_groups" in entry:
        groups = [[int(x) for x in g] for g in entry["output_groups"]]
        if len(groups) != len(inputs):
            raise ValueError(f"step {key}: {len(inputs)} inputs but {len(groups)} output_groups")
        return inputs, groups
    flat = [int(x) for x in entry["output"]]
    if not inputs or len(flat) % len(inputs):
        raise ValueError(f"step {key}: {len(flat)} outputs do not split over {len(inputs)} inputs")
    n = len(flat) // len(inputs)
    return inputs, [flat[i * n:(i + 1) * n] for i in range(len(inputs))]


def v1_steps(path: Path) -> list[str]:
    return list(json.loads(Path(path).read_text()))


def _group_key(rec: dict[str, Any]) -> Any:
    if "prompt_group_id" in rec:
        return rec["prompt_group_id"]
    if "batch_data_id" in rec:
        return rec["batch_data_id"]
    raise KeyError("record has neither prompt_group_id nor batch_data_id")


def _sample_key(rec: dict[str, Any]) -> Any:
    if "sample_id" in rec:
        return rec["sample_id"]
    if "rollout_offset" in rec:
        return rec["rollout_offset"]
    raise KeyError("record has neither sample_id nor rollout_offset")


def group_multiturn(records: Iterable[dict[str, Any]], samples_per_prompt: int | None = None) -> list[list[dict[str, Any]]]:
    """Records (``validate: true`` skipped) grouped by prompt_group_id (else batch_data_id), groups in id
    order, each sorted by sample_id (else rollout_offset) and padded to ``samples_per_prompt`` by
    repeating its last record. ``samples_per_prompt`` None: the largest group (upstream takes it from the
    rollout's n)."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("validate"):
            continue
        groups.setdefault(_group_key(r), []).append(r)
    n = samples_per_prompt if samples_per_prompt is not None else max((len(g) for g in groups.values()), default=0)
    out: list[list[dict[str, Any]]] = []
    for gid in sorted(groups):
        g = sorted(groups[gid], key=_sample_key)
        out.append(g + [g[-1]] * max(0, n - len(g)))
    return out


def read_multiturn(path: Path, samples_per_prompt: int | None = None) -> list[list[dict[str, Any]]]:
    return group_multiturn(read_jsonl(path), samples_per_prompt)


# ----------------------------------------------------------------------------- replay bookkeeping


def _resize(segments: list[list[int]], length: int, pad_value: int = 0) -> None:
    """Pad (with ``pad_value``) or truncate a run-length list [[value, run], ...] to ``length`` tokens."""
    total = sum(n for _, n in segments)
    if total < length:
        segments.append([pad_value, length - total])
        return
    while total > length and segments:
        cut = min(segments[-1][1], total - length)
        segments[-1][1] -= cut
        total -= cut
        if segments[-1][1] == 0:
            segments.pop()


@dataclass
class ReplayedRecord:
    """What replaying one record costs and leaves behind."""

    turn_prompt_lens: list[int] = field(default_factory=list)  # context handed to the engine per turn
    generated_tokens: int = 0
    tool_calls: int = 0
    tool_wait_s: float = 0.0
    tool_names: list[str] = field(default_factory=list)
    context_len: int = 0  # after the last append, before the final resize
    response_len: int = 0  # after the final resize
    loss_tokens: int = 0

    @property
    def prefill_tokens(self) -> int:
        return sum(self.turn_prompt_lens)


def recorded_prompt_tokens(rec: dict[str, Any]) -> int:
    """The prefill a record claims: the sum of its turns' ``prompt_tokens``."""
    try:
        return sum(int(t["prompt_tokens"]) for t in rec.get("turns") or [])
    except KeyError as exc:
        raise KeyError("a turn has no prompt_tokens") from exc


def replay_record(rec: dict[str, Any], max_response_len: int | None = None) -> ReplayedRecord:
    """Replay one multi-turn record as ``_async_replay_workload_request`` does (tool waits are counted,
    not slept). ``max_response_len``: the configured response length that caps ``final_response_len``."""
    prompt_len = int(rec["prompt_len"])
    ctx = prompt_len
    # The response (everything after the prompt) as loss-mask runs; padding counts no loss (not stated upstream).
    resp: list[list[int]] = []
    out = ReplayedRecord()
    calls = rec.get("tool_calls") or []
    for t in rec.get("turns") or []:
        gpl = t.get("generation_prompt_len")
        if gpl is not None:
            target = int(gpl)
            _resize(resp, max(0, target - prompt_len))
            ctx = target
        out.turn_prompt_lens.append(ctx)
        completion = t.get("completion_tokens")
        if completion is None:
            completion = t.get("assistant_append_len")
        out.generated_tokens += max(1, int(completion or 0))
        append = t.get("assistant_append_len")
        if append is None:
            append = t["completion_tokens"] if "completion_tokens" in t else max(1, int(completion or 0))
        append = int(append)
        # assistant_loss_len / loss_len missing: all of an assistant append, none of a tool append (not stated upstream).
        loss = min(append, int(t.get("assistant_loss_len", append)))
        resp += [[1, loss], [0, append - loss]]
        ctx += append
        for c in calls:
            if c.get("turn") != t.get("turn"):
                continue
            out.tool_calls += 1
            out.tool_wait_s += float(c.get("latency_s") or 0.0)
            out.tool_names.append(c.get("tool_name") or DEFAULT_TOOL_NAME)
            app = int(c.get("append_len") or 0)
            tl = min(app, int(c.get("loss_len") or 0))
            resp += [[1, tl], [0, app - tl]]
            ctx += app
    out.context_len = ctx
    current = max(0, ctx - prompt_len)
    final = int(rec["final_response_len"]) if rec.get("final_response_len") is not None else current
    cap = max_response_len if max_response_len is not None else rec.get("max_response_len")
    if cap is not None:
        final = min(final, int(cap))
    out.response_len = final
    rle = rec.get("response_loss_mask_rle")
    mask = [[int(v), int(n)] for v, n in rle] if rle is not None else [list(s) for s in resp]
    _resize(mask, final)
    out.loss_tokens = sum(n for v, n in mask if v)
    return out


@dataclass
class ReplayedStep:
    records: int
    prefill_tokens: int
    recorded_prompt_tokens: int
    per_record_prefill: list[int]
    tool_calls: int
    tool_wait_s: float

    @property
    def ratio(self) -> float:
        return self.prefill_tokens / self.recorded_prompt_tokens if self.recorded_prompt_tokens else float("nan")


def replay_records(records: Sequence[dict[str, Any]], max_response_len: int | None = None) -> ReplayedStep:
    reps = [replay_record(r, max_response_len) for r in records]
    return ReplayedStep(
        records=len(reps),
        prefill_tokens=sum(r.prefill_tokens for r in reps),
        recorded_prompt_tokens=sum(recorded_prompt_tokens(r) for r in records),
        per_record_prefill=[r.prefill_tokens for r in reps],
        tool_calls=sum(r.tool_calls for r in reps),
        tool_wait_s=sum(r.tool_wait_s for r in reps),
    )


def replay_step(path: Path, samples_per_prompt: int | None = None, max_response_len: int | None = None) -> ReplayedStep:
    """Read a multi-turn step as upstream's reader does (grouped, sorted, padded) and replay every record."""
    return replay_records([r for g in read_multiturn(path, samples_per_prompt) for r in g], max_response_len)


# ----------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Model of upstream PolyTrace's suite.py --validate and multi-turn replay.")
    ap.add_argument("--validate", type=Path, metavar="CONFIG", help="upstream benchmark config (JSON)")
    ap.add_argument("--workload-path", type=Path, help="override the config's workload_path (nothing else changes)")
    ap.add_argument("--replay", type=Path, metavar="STEP_FILE", help="replay a multiturn_workload_step_<k>.jsonl")
    ap.add_argument("--samples-per-prompt", type=int, help="pad groups to this many samples (replay)")
    ap.add_argument("--read-v1", type=Path, metavar="V1_FILE", help="read every step of a v1 workload file")
    a = ap.parse_args(argv)
    if a.validate is not None:
        res = validate(load_config(a.validate), a.workload_path)
        print(json.dumps(res, indent=1))
        return 0 if res["ok"] else 1
    if a.replay is not None:
        st = replay_step(a.replay, a.samples_per_prompt)
        print(json.dumps({"records": st.records, "prefill_tokens": st.prefill_tokens,
                          "recorded_prompt_tokens": st.recorded_prompt_tokens, "ratio": st.ratio,
                          "tool_calls": st.tool_calls, "tool_wait_s": st.tool_wait_s}, indent=1))
        return 0
    if a.read_v1 is not None:
        shapes = {}
        for s in v1_steps(a.read_v1):
            inputs, groups = read_v1(a.read_v1, s)
            shapes[s] = {"prompts": len(inputs), "samples_per_prompt": sorted({len(g) for g in groups}),
                         "prompt_tokens": sum(inputs), "response_tokens": sum(map(sum, groups))}
        print(json.dumps(shapes, indent=1))
        return 0
    ap.error("give --validate CONFIG, --replay STEP_FILE or --read-v1 V1_FILE")
    return 2


if __name__ == "__main__":
    sys.exit(main())
