"""PolyTrace's distribution-parameter JSON: ``task_distribution_parameters.json`` in the structure of
upstream's ``enhanced_task_distribution_parameters.json`` (scipy marginals + KS, joint Gaussian
mixture, tool-call count distribution)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from analyses.export.registry import ExportFormat, ExportJob


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


def write_params(w: dict[str, Any], path: Path, spec: dict[str, Any]) -> Path:
    v = w["variables"]
    task = w.get("task") or "unknown"
    joint = (w.get("joint") or {}).get("raw_gaussian_mixture")
    entry: dict[str, Any] = {
        "task_type": task,
        "description": f"fitted by polytrace from run {w.get('run_id')}",
        "input_distribution": scipy_marginal(v["prompt_tokens"]),
        "output_distribution": scipy_marginal(v["response_tokens"]),
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


def _write(job: ExportJob) -> list[Path]:
    return [write_params(job.workload, job.out / "task_distribution_parameters.json", job.spec)]


FORMAT = ExportFormat(
    name="polytrace-params",
    order=30,
    description="PolyTrace's distribution parameters (scipy marginals with KS, joint Gaussian mixture, tool-call counts)",
    files="task_distribution_parameters.json",
    consumer="upstream PolyTrace workload generator",
    loader="dataset/workloads/enhanced_task_distribution_parameters.json readers",
    try_it="compare with ../shared/real_logs/polytrace/dataset/workloads/enhanced_task_distribution_parameters.json",
    write=_write,
)
