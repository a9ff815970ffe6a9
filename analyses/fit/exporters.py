"""Write a spec's workloads in the formats other tools read.

Sample-based formats generate steps with the seeded sampler first (same seed, same bytes):

* ``polytrace-v2`` -- ``packed_lengths_step_<k>.jsonl`` (one record per prompt: step, rank,
  dp_rank, tp_rank, local_index, input, output[n], n_sampling, validate) for single-turn tasks,
  ``multiturn_workload_step_<k>.jsonl`` (one record per trajectory) *instead* for multi-turn
  tasks (both would describe the same samples twice), and ``reward_timings_step_<k>.jsonl``
  where reward time was fitted -- what PolyTrace's replay reader loads.
* ``polytrace-v1`` -- ``workload_v1.json``: ``{"<step>": {"input": [per prompt], "output": [n per
  prompt, consecutive]}}``.
* ``vidur`` -- ``vidur_trace.csv`` (arrived_at, num_prefill_tokens, num_decode_tokens): one
  request per sample (per turn for multi-turn tasks; a later turn arrives when the previous
  turn and its tool calls are done).
* ``mooncake`` -- ``mooncake_trace.jsonl`` (timestamp ms, input_length, output_length, hash_ids
  of 512-token prefix blocks shared within a prompt group / trajectory); agentic turns add
  session_id, turn and the tool calls the turn triggered.

Spec-based formats need no sampling:

* ``polytrace-params`` -- ``task_distribution_parameters.json`` in the structure of PolyTrace's
  ``enhanced_task_distribution_parameters.json`` (scipy marginals + KS, joint Gaussian mixture,
  tool-call count distribution).
* ``aiperf`` -- ``aiperf_sequence_distribution.txt`` (``ISL|SD,OSL|SD:PROB;...`` for
  ``aiperf profile --sequence-distribution``) and the same buckets as ``.json`` (``{"pairs": ...}``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyses.fit.sampler import Generated, generate, steps_for

FORMATS: tuple[str, ...] = ("polytrace-v2", "polytrace-v1", "polytrace-params", "vidur", "mooncake", "aiperf")
DEFAULT_STEP_INTERVAL_S = 60.0  # arrival spacing of steps in request traces, when no step time is known
BLOCK = 512  # Mooncake hash block size (tokens)


def workload_dirs(spec: dict[str, Any], out: Path, only: str | None = None) -> list[tuple[str, dict[str, Any], Path]]:
    """(key, workload, directory) per workload: ``out`` itself when there is one."""
    items = [(k, w) for k, w in spec["workloads"].items() if only is None or k == only or w.get("run_id") == only]
    if not items:
        raise KeyError(f"no workload {only!r} in the spec" if only else "the spec has no workloads")
    if len(items) == 1:
        return [(items[0][0], items[0][1], out)]
    return [(k, w, out / re.sub(r"[^A-Za-z0-9_.-]+", "_", k)) for k, w in items]


def export(spec: dict[str, Any], fmt: str, out: Path, *, steps: int | None = None, seed: int = 0, workload: str | None = None,
           step_interval_s: float | None = None) -> list[Path]:
    """Write ``fmt`` for every workload of ``spec`` under ``out``; returns the files written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    written: list[Path] = []
    for key, w, d in workload_dirs(spec, out, workload):
        d.mkdir(parents=True, exist_ok=True)
        if fmt == "polytrace-params":
            written.append(write_params(w, d / "task_distribution_parameters.json", spec))
            continue
        if fmt == "aiperf":
            written.extend(write_aiperf(w, d, seed))
            continue
        ks = steps_for(w, steps if steps is not None else int(w["batch"].get("n_steps", 1)))
        g = generate(w, ks, seed, key=key)
        written.extend(write_generated(g, w, fmt, d, step_interval_s))
    return written


def write_generated(g: Generated, w: dict[str, Any], fmt: str, d: Path, step_interval_s: float | None = None) -> list[Path]:
    if fmt == "polytrace-v2":
        return write_v2(g, w, d)
    if fmt == "polytrace-v1":
        return [write_v1(g, d / "workload_v1.json")]
    if fmt == "vidur":
        return [write_vidur(g, w, d / "vidur_trace.csv", step_interval_s)]
    if fmt == "mooncake":
        return [write_mooncake(g, w, d / "mooncake_trace.jsonl", step_interval_s)]
    raise ValueError(fmt)


# ----------------------------------------------------------------------------- PolyTrace v2 / v1


def packed_records(samples: pl.DataFrame) -> pl.DataFrame:
    """One row per prompt, columns in PolyTrace's packed_lengths order."""
    return (
        samples.sort("step", "group", "sample_index")
        .group_by("step", "group", maintain_order=True)
        .agg(
            rank=pl.col("rank").first(), dp_rank=pl.col("dp_rank").first(), tp_rank=pl.col("tp_rank").first(),
            local_index=pl.col("local_index").first(), input=pl.col("prompt_tokens").first(), output=pl.col("response_tokens"),
        )
        .with_columns(n_sampling=pl.col("output").list.len().cast(pl.Int64), validate=pl.lit(False))
        .sort("step", "dp_rank", "rank", "local_index")
        .select("step", "rank", "dp_rank", "tp_rank", "local_index", "input", "output", "n_sampling", "validate")
    )


def write_v2(g: Generated, w: dict[str, Any], d: Path) -> list[Path]:
    out: list[Path] = []
    recs = packed_records(g.samples)
    multi = g.turns is not None
    cap = w["variables"]["response_tokens"].get("censor_at")
    # a multi-turn task is written as multiturn_workload files only (as PolyTrace's own multi-turn
    # runs are): a packed view of the same trajectories would make a reader count every sample twice
    for (k,), part in ([] if multi else recs.group_by("step", maintain_order=True)):
        p = d / f"packed_lengths_step_{int(k)}.jsonl"
        part.write_ndjson(p)
        out.append(p)
    if multi:
        mt = multiturn_records(g, cap)
        for (k,), part in mt.group_by("step", maintain_order=True):
            p = d / f"multiturn_workload_step_{int(k)}.jsonl"
            part.write_ndjson(p)
            out.append(p)
    if g.rewards is not None:
        rw = g.rewards.select(
            "step", "rank", tp_rank=pl.lit(0, pl.Int64), dp_rank="dp_rank", batch_size=pl.col("batch_size").cast(pl.Int64),
            reward_time_s="reward_time_s", response_sum="response_sum", response_mean="response_mean",
            response_max="response_max", validate=pl.lit(False),
        )
        for (k,), part in rw.group_by("step", maintain_order=True):
            p = d / f"reward_timings_step_{int(k)}.jsonl"
            part.write_ndjson(p)
            out.append(p)
    return out


def multiturn_records(g: Generated, cap: float | None) -> pl.DataFrame:
    assert g.turns is not None and g.tool_calls is not None
    keys = ["step", "group", "sample_index"]
    turns = g.turns.sort(*keys, "turn").group_by(keys, maintain_order=True).agg(
        turns=pl.struct("turn", "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason", "tool_call_count",
                        "engine_latency_s")
    )
    calls = g.tool_calls.sort(*keys, "turn", "call_index").group_by(keys, maintain_order=True).agg(
        tool_calls=pl.struct("turn", "tool_name", "latency_s", pl.col("response_tokens").alias("response_token_len"), "status")
    )
    s = g.samples.join(turns, on=keys, how="left").join(calls, on=keys, how="left")
    return s.sort(*keys).select(
        "step",
        prompt_len="prompt_tokens",
        max_response_len=pl.lit(int(cap) if cap is not None else None, pl.Int64),
        turns="turns",
        tool_calls=pl.col("tool_calls").fill_null(pl.lit([], dtype=calls.schema["tool_calls"])),
        finish_reason=pl.when(pl.col("truncated")).then(pl.lit("length")).otherwise(pl.lit("stop")),
        final_response_len="response_tokens",
        turn_count="n_turns",
        tool_call_count="n_tool_calls",
        validate=pl.lit(False),
        prompt_group_id="group",
        sample_id="sample_index",
    )


def write_v1(g: Generated, path: Path) -> Path:
    recs = packed_records(g.samples)
    doc = {
        str(int(k)): {"input": part["input"].to_list(), "output": part["output"].explode().to_list()}
        for (k,), part in recs.group_by("step", maintain_order=True)
    }
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return path


# ----------------------------------------------------------------------------- request traces


def _requests(g: Generated, w: dict[str, Any], step_interval_s: float | None) -> pl.DataFrame:
    """One row per inference request: arrival (s), prefill and decode tokens, group/session ids."""
    interval = step_interval_s if step_interval_s is not None else DEFAULT_STEP_INTERVAL_S
    first = int(w["batch"].get("first_step", 0))
    if g.turns is None:
        r = g.samples.select(
            "step", "group", "sample_index", turn=pl.lit(0, pl.Int64), offset_s=pl.lit(0.0),
            prefill="prompt_tokens", decode="response_tokens", cached=pl.lit(0, pl.Int64),
        )
        r = r.with_columns(tool_calls=pl.lit(None, dtype=pl.List(pl.Struct({"name": pl.String, "latency_ms": pl.Float64, "response_length": pl.Int64}))))
    else:
        keys = ["step", "group", "sample_index"]
        tool_t = g.tool_calls.group_by(*keys, "turn").agg(
            tool_s=pl.col("latency_s").sum(),
            tool_calls=pl.struct(name="tool_name", latency_ms=pl.col("latency_s") * 1000, response_length="response_tokens"),
        )
        t = g.turns.join(tool_t, on=[*keys, "turn"], how="left").sort(*keys, "turn").with_columns(
            busy=pl.col("engine_latency_s").fill_null(0) + pl.col("tool_s").fill_null(0)
        )
        r = t.with_columns(offset_s=(pl.col("busy").cum_sum() - pl.col("busy")).over(keys)).select(
            *keys, "turn", "offset_s", prefill="prompt_tokens", decode="completion_tokens", cached="cached_tokens",
            tool_calls="tool_calls",
        )
    return r.with_columns(arrived_at=(pl.col("step") - first) * interval + pl.col("offset_s")).sort("arrived_at", "step", "group", "sample_index", "turn")


def write_vidur(g: Generated, w: dict[str, Any], path: Path, step_interval_s: float | None = None) -> Path:
    r = _requests(g, w, step_interval_s)
    r.select(
        pl.col("arrived_at").round(6), num_prefill_tokens=pl.col("prefill").cast(pl.Int64), num_decode_tokens=pl.col("decode").cast(pl.Int64)
    ).write_csv(path)
    return path


def write_mooncake(g: Generated, w: dict[str, Any], path: Path, step_interval_s: float | None = None) -> Path:
    r = _requests(g, w, step_interval_s)
    multi = g.turns is not None
    # prefix blocks: the prompt's blocks are shared by the group; a trajectory's later context is its own
    gk = r.select("step", "group").unique(maintain_order=True).with_row_index("gid")
    r = r.join(gk, on=["step", "group"])
    pblocks = g.samples.group_by("step", "group").agg(p=pl.col("prompt_tokens").first())
    r = r.join(pblocks, on=["step", "group"])
    prompt_nb = (pl.col("p") + BLOCK - 1) // BLOCK
    total_nb = (pl.col("prefill") + BLOCK - 1) // BLOCK
    max_nb = int(r.select((pl.col("prefill") + BLOCK - 1) // BLOCK).max().item() or 1) + 1
    # ids [0, groups * max_nb) are prompt blocks (max_nb per group); each trajectory's own blocks
    # follow, max_nb per (group, sample): disjoint whatever the number of groups or samples per prompt
    per_group = max(int(w["batch"].get("samples_per_prompt") or 1), int(r["sample_index"].max() or 0) + 1)
    traj_base = (gk.height + pl.col("gid") * per_group + pl.col("sample_index")) * max_nb
    r = r.with_columns(
        hash_ids=pl.concat_list(
            pl.int_ranges(pl.col("gid") * max_nb, pl.col("gid") * max_nb + pl.min_horizontal(prompt_nb, total_nb)),
            pl.int_ranges(traj_base, traj_base + pl.max_horizontal(total_nb - prompt_nb, 0)),
        )
    )
    cols = [
        (pl.col("arrived_at") * 1000).round(3).alias("timestamp"),
        pl.col("prefill").cast(pl.Int64).alias("input_length"),
        pl.col("decode").cast(pl.Int64).alias("output_length"),
        "hash_ids",
    ]
    if multi:
        cols += [pl.format("{}-{}-{}", "step", "group", "sample_index").alias("session_id"), "turn", "tool_calls"]
    r.select(cols).write_ndjson(path)
    return path


# ----------------------------------------------------------------------------- PolyTrace params


def _scipy_marginal(v: dict[str, Any]) -> dict[str, Any]:
    """A variable in PolyTrace's marginal form: scipy family name, parameters in scipy order."""
    if v.get("kind") == "continuous":
        best = v
        if v["family"].startswith("lognorm_mix"):  # PolyTrace reads scipy families: best plain one
            plain = [c for c in v.get("candidates", []) if not c["family"].startswith("lognorm_mix")]
            if plain:
                best = min(plain, key=lambda c: c["aic"])
        gof = best.get("gof") or best
        return {"type": best["family"], "parameters": best["params"], "ks_statistic": gof.get("ks"), "ks_p_value": gof.get("ks_p"),
                "censor_at": v.get("censor_at")}
    if v.get("kind") == "categorical":
        atoms = {"empirical_values": v["values"], "empirical_probabilities": v["probs"]}
        if "scipy_fallback" in v:  # PolyTrace samples scipy families: give it one, keep the atoms beside
            return {**_scipy_marginal(v["scipy_fallback"]), **atoms}
        return {"type": "empirical", **atoms}
    if v.get("kind") == "empirical_tail":
        # PolyTrace samples scipy families: the plain fallback, with the cap mass beside it
        extra = {"censor_at": v.get("censor_at"), "cap_probability": v.get("p_cap")}
        if "scipy_fallback" in v:
            return {**_scipy_marginal(v["scipy_fallback"]), **extra}
        return {"type": "empirical_quantiles", "quantiles": v["knots"], **extra}
    if v.get("kind") == "body_tail":
        return {"type": "body_genpareto", "body": _scipy_marginal(v["body"]), "threshold": v["threshold"],
                "tail_probability": v["tail_prob"], "tail": {"type": "genpareto", "parameters": v["tail"]["params"]}}
    return {"type": v.get("method", v.get("kind")), "support": v.get("support"), "pmf": v.get("pmf")}


def write_params(w: dict[str, Any], path: Path, spec: dict[str, Any]) -> Path:
    v = w["variables"]
    task = w.get("task") or "unknown"
    joint = (w.get("joint") or {}).get("raw_gaussian_mixture")
    entry: dict[str, Any] = {
        "task_type": task,
        "description": f"fitted by polytrace from run {w.get('run_id')}",
        "input_distribution": _scipy_marginal(v["prompt_tokens"]),
        "output_distribution": _scipy_marginal(v["response_tokens"]),
    }
    if joint:
        entry["joint_distribution"] = {
            "type": "gaussian_mixture", "n_components": joint["n_components"], "mean_vector": joint["mean_vector"],
            "covariance_matrix": joint["covariance_matrix"], "correlation": joint["correlation"], "bic_score": joint["bic"],
        }
        entry["gmm_parameters"] = {"weights": joint["weights"], "means": joint["means"], "covariances": joint["covariances"]}
    doc: dict[str, Any] = {
        "version": "1.0",
        "extraction_info": {"source": f"polytrace spec {spec.get('polytrace_spec_version')}", f"total_{task}_samples": w.get("n_samples")},
        f"{task}_task": entry,
    }
    if "n_tool_calls" in v:
        pmf = v["n_tool_calls"]
        n = int(w.get("n_samples") or 0)
        counts = {str(s): int(round(p * n)) for s, p in zip(pmf["support"], pmf["pmf"], strict=True) if round(p * n) > 0}
        doc["tool_calling_task"] = {
            "task_type": "tool_calling",
            "description": "Tool calling sequences with varying call counts",
            "call_count_distribution": counts,
            "total_sessions": n,
            "available_call_counts": sorted(int(c) for c in counts),
        }
    path.write_text(json.dumps(_finite(doc), indent=2) + "\n")
    return path


def _finite(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


# ----------------------------------------------------------------------------- AIPerf


def aiperf_buckets(w: dict[str, Any], seed: int = 0, n_buckets: int = 8, n_draws: int = 20_000) -> list[dict[str, float]]:
    """ISL/OSL buckets: draw pairs from the fitted joint, cut by OSL quantiles, summarize each."""
    per = int(w["batch"]["prompts_per_step"]) * int(w["batch"]["samples_per_prompt"])
    n_steps = max(1, math.ceil(n_draws / max(per, 1)))
    g = generate(w, steps_for(w, n_steps), seed, key="aiperf")
    if g.turns is not None:  # a request per turn for agentic tasks
        isl = g.turns["prompt_tokens"].to_numpy().astype(float)
        osl = g.turns["completion_tokens"].to_numpy().astype(float)
    else:
        isl = g.samples["prompt_tokens"].to_numpy().astype(float)
        osl = g.samples["response_tokens"].to_numpy().astype(float)
    edges = np.unique(np.quantile(osl, np.linspace(0, 1, n_buckets + 1)))
    idx = np.clip(np.searchsorted(edges, osl, side="right") - 1, 0, max(edges.size - 2, 0))
    out = []
    for b in np.unique(idx):
        m = idx == b
        out.append({
            "isl": int(round(isl[m].mean())), "isl_stddev": int(round(isl[m].std())),
            "osl": int(round(osl[m].mean())), "osl_stddev": int(round(osl[m].std())),
            "prob": round(100.0 * m.mean(), 3),
        })
    return out


def write_aiperf(w: dict[str, Any], d: Path, seed: int = 0) -> list[Path]:
    pairs = aiperf_buckets(w, seed)
    txt = ";".join(f"{p['isl']}|{p['isl_stddev']},{p['osl']}|{p['osl_stddev']}:{p['prob']}" for p in pairs)
    t = d / "aiperf_sequence_distribution.txt"
    t.write_text(txt + "\n")
    j = d / "aiperf_sequence_distribution.json"
    j.write_text(json.dumps({"pairs": pairs}, indent=1) + "\n")
    return [t, j]
