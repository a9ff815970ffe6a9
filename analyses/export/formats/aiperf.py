"""AIPerf sequence distributions: ``aiperf_sequence_distribution.txt`` (``ISL|SD,OSL|SD:PROB;...`` for
``aiperf profile --sequence-distribution``) and the same buckets as ``.json`` (``{"pairs": ...}``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from analyses.export.consumer_versions import AIPERF
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.structure import check_aiperf
from analyses.fit.sampler import generate, steps_for


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
    buckets = np.unique(idx)
    shares = np.array([(idx == b).mean() for b in buckets])
    out = []
    for b, prob in zip(buckets, percent_thousandths(shares), strict=True):
        m = idx == b
        out.append({
            "isl": int(round(isl[m].mean())), "isl_stddev": int(round(isl[m].std())),
            "osl": int(round(osl[m].mean())), "osl_stddev": int(round(osl[m].std())),
            "prob": prob,
        })
    return out


def percent_thousandths(shares: np.ndarray) -> list[float]:
    """Shares as percentages with 3 decimals summing to exactly 100: aiperf's
    ``DistributionParser`` refuses a sum off by 1e-6, so plain rounding (99.999, 100.001) fails.
    Largest remainder: floor every share in thousandths of a percent, then give the missing
    thousandths to the largest remainders."""
    exact = np.asarray(shares, dtype=float) / float(np.sum(shares)) * 100_000
    units = np.floor(exact).astype(np.int64)
    short = 100_000 - int(units.sum())
    units[np.argsort(-(exact - units), kind="stable")[:short]] += 1
    return [int(u) / 1000 for u in units]


def write_aiperf(w: dict[str, Any], d: Path, seed: int = 0) -> list[Path]:
    pairs = aiperf_buckets(w, seed)
    txt = ";".join(f"{p['isl']}|{p['isl_stddev']},{p['osl']}|{p['osl_stddev']}:{p['prob']}" for p in pairs)
    t = d / "aiperf_sequence_distribution.txt"
    t.write_text(txt + "\n")
    j = d / "aiperf_sequence_distribution.json"
    j.write_text(json.dumps({"pairs": pairs}, indent=1) + "\n")
    return [t, j]


def _write(job: ExportJob) -> list[Path]:
    return write_aiperf(job.workload, job.out, job.seed)


FORMAT = ExportFormat(
    name="aiperf",
    order=60,
    description="AIPerf ISL/OSL sequence distribution (text and JSON)",
    files="aiperf_sequence_distribution.txt, aiperf_sequence_distribution.json",
    consumer="aiperf",
    loader="aiperf.common.models.sequence_distribution.DistributionParser.parse",
    try_it="aiperf profile --sequence-distribution \"$(cat aiperf_sequence_distribution.txt)\" ...",
    write=_write,
    check=check_aiperf,
    checked_against=AIPERF,
)
