"""PolyTrace's distribution-parameter JSON: ``task_distribution_parameters.json`` in the structure of
upstream's ``enhanced_task_distribution_parameters.json`` (scipy marginals + KS, joint Gaussian
mixture, tool-call count distribution).

**Task key.** Upstream's file has ``math_task`` (the prompt/response length distributions) and
``tool_calling_task`` (tool-call counts); its generator looks tasks up by those keys. A workload
with tool calls is written under ``tool_calling_task`` (lengths and call counts in one entry),
every other under ``math_task``; ``--task NAME`` writes ``NAME_task`` instead.

**Marginals.** Upstream instantiates ``getattr(scipy.stats, type)(*parameters)``. Each length
marginal is the scipy family with the lowest KS against the data among the fitted candidates, unless
the empirical alternative is closer: ``rv_histogram`` over the fitted distribution's atoms (integer
token counts; point masses such as the cap get a one-token bin), whose KS against that distribution
is computed exactly and is typically 0.00x where a family's is 0.04-0.4 (the verl-video prompt
lengths: ``weibull_min`` at KS 0.395). The family is kept beside it as ``parametric_alternative``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from analyses.export.consumer_versions import UPSTREAM_POLYTRACE
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.structure import check_polytrace_params
from analyses.fit.marginals import marginal


def scipy_marginal(v: dict[str, Any]) -> dict[str, Any]:
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
            return {**scipy_marginal(v["scipy_fallback"]), **atoms}
        return {"type": "empirical", **atoms}
    if v.get("kind") == "empirical_tail":
        # PolyTrace samples scipy families: the plain fallback, with the cap mass beside it
        extra = {"censor_at": v.get("censor_at"), "cap_probability": v.get("p_cap")}
        if "scipy_fallback" in v:
            return {**scipy_marginal(v["scipy_fallback"]), **extra}
        return {"type": "empirical_quantiles", "quantiles": v["knots"], **extra}
    if v.get("kind") == "body_tail":
        return {"type": "body_genpareto", "body": scipy_marginal(v["body"]), "threshold": v["threshold"],
                "tail_probability": v["tail_prob"], "tail": {"type": "genpareto", "parameters": v["tail"]["params"]}}
    return {"type": v.get("method", v.get("kind")), "support": v.get("support"), "pmf": v.get("pmf")}


EMPIRICAL_LEVELS = 4096  # quantile levels of the empirical alternative (its resolution: 1/4096 in probability)
UPSTREAM_TASK_KEYS = ("math", "tool_calling")


def task_key(w: dict[str, Any], override: str | None = None) -> str:
    """The upstream task name a workload's entry goes under (see the module text)."""
    if override:
        return override.removesuffix("_task")
    return "tool_calling" if "n_tool_calls" in w["variables"] else "math"


def empirical_alternative(v: dict[str, Any]) -> dict[str, Any]:
    """``rv_histogram`` of a fitted length distribution, with its exact KS against that distribution."""
    if v.get("kind") == "categorical":
        values, probs = np.asarray(v["values"], dtype=float), np.asarray(v["probs"], dtype=float)
    else:
        u = (np.arange(EMPIRICAL_LEVELS) + 0.5) / EMPIRICAL_LEVELS
        values, counts = np.unique(np.rint(np.asarray(marginal(v).ppf(u), dtype=float)), return_counts=True)
        probs = counts / counts.sum()
    order = np.argsort(values)
    values, probs = values[order], probs[order] / probs.sum()
    mids = (values[1:] + values[:-1]) / 2
    edges = np.concatenate([[values[0] - 0.5], np.minimum(mids, values[:-1] + 0.5), [values[-1] + 0.5]])
    lo, hi = np.maximum(edges[:-1], values - 0.5), np.minimum(edges[1:], values + 0.5)  # at most a token either side
    # the histogram spreads an atom's mass over its bin: the CDFs differ most just before and after the atom
    frac = (values - lo) / (hi - lo)
    ks = float(np.max(probs * np.maximum(frac, 1 - frac)))
    points = np.column_stack([lo, hi]).ravel()
    masses = np.column_stack([probs, np.zeros_like(probs)]).ravel()[:-1]  # gaps between atoms hold no mass
    keep = np.diff(points) > 0  # adjacent atoms leave no gap bin
    bins = np.concatenate([points[:1], points[1:][keep]])
    hist = masses[keep]
    return {"type": "rv_histogram", "parameters": [[hist.tolist(), bins.tolist()]], "ks_statistic": ks,
            "ks_p_value": None, "ks_against": "the fitted distribution"}


def length_marginal(v: dict[str, Any]) -> dict[str, Any]:
    """A length variable for upstream: the best scipy family by KS, or the empirical alternative
    when its KS is lower (never a family whose KS is worse)."""
    family = scipy_marginal(v)
    fallback = v.get("scipy_fallback") or (v if v.get("kind") == "continuous" else None)
    cands = [c for c in (fallback or {}).get("candidates", []) if (c.get("gof") or {}).get("ks") is not None]
    if cands:
        best = min(cands, key=lambda c: c["gof"]["ks"])
        if best["gof"]["ks"] < (family.get("ks_statistic") or float("inf")):
            family = {**family, "type": best["family"], "parameters": best["params"], "ks_statistic": best["gof"]["ks"],
                      "ks_p_value": best["gof"].get("ks_p")}
    emp = empirical_alternative(v)
    ks = family.get("ks_statistic")
    if ks is None or not math.isfinite(float(ks)) or emp["ks_statistic"] < float(ks):
        keep = {k: family[k] for k in ("censor_at", "cap_probability") if family.get(k) is not None}
        return {**emp, **keep, "parametric_alternative": family}
    return family


def write_params(w: dict[str, Any], path: Path, spec: dict[str, Any], task_override: str | None = None) -> Path:
    v = w["variables"]
    task = task_key(w, task_override)
    joint = (w.get("joint") or {}).get("raw_gaussian_mixture")
    entry: dict[str, Any] = {
        "task_type": task,
        "description": f"fitted by polytrace from run {w.get('run_id')}",
        "input_distribution": length_marginal(v["prompt_tokens"]),
        "output_distribution": length_marginal(v["response_tokens"]),
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
        calls = doc.setdefault("tool_calling_task", {"task_type": "tool_calling",
                                                     "description": "Tool calling sequences with varying call counts"})
        calls.update({"call_count_distribution": counts, "total_sessions": n,
                      "available_call_counts": sorted(int(c) for c in counts)})
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


def _write(job: ExportJob) -> list[Path]:
    return [write_params(job.workload, job.out / "task_distribution_parameters.json", job.spec, job.options.get("task"))]


FORMAT = ExportFormat(
    name="polytrace-params",
    order=30,
    description="PolyTrace's distribution parameters (scipy marginals with KS, joint Gaussian mixture, tool-call counts)",
    files="task_distribution_parameters.json",
    consumer="upstream PolyTrace workload generator",
    loader="dataset/workloads/enhanced_task_distribution_parameters.json readers",
    try_it="python -c \"import json, scipy.stats as st; d = json.load(open('task_distribution_parameters.json')); "
    "[print(k, getattr(st, v['input_distribution']['type'])(*v['input_distribution']['parameters']).median()) "
    "for k, v in d.items() if k.endswith('_task')]\"",
    write=_write,
    check=check_polytrace_params,
    checked_against=UPSTREAM_POLYTRACE,
)
