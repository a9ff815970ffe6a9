"""The fidelity scores as one plain-text table (the CLI prints it; the Dagster asset shows it)."""

from __future__ import annotations

import math
import statistics
from typing import Any

SKILL_MIN, SKILL_MEAN_MIN = 0.0, 0.10
COVERAGE_RANGE = (0.80, 0.97)
KS_MARGIN = 0.01


def criterion(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The pooled criterion over scored runs: mean and minimum CRPS skill, pooled coverage (every
    cell of every run counts once), the worst KS margin over the baseline, and whether each
    target is met."""
    ro = [r["rolling_origin"] for r in results if "rolling_origin" in r]
    if not ro:
        return {}
    skills = [x["crps_skill"] for x in ro if x["crps_skill"] == x["crps_skill"]]
    cells = sum(x["cells"] for x in ro)
    cov = sum(x["covered"] for x in ro) / cells if cells else math.nan
    base_cov = sum(x["baseline_covered"] for x in ro) / cells if cells else math.nan
    margins = [x["ks_mean"] - x["baseline_ks_mean"] for x in ro]
    out = {
        "runs": len(ro),
        "cells": cells,
        "covered": sum(x["covered"] for x in ro),
        "mean_run_coverage90": statistics.fmean(x["coverage90"] for x in ro),
        "mean_crps_skill": statistics.fmean(skills) if skills else math.nan,
        "min_crps_skill": min(skills) if skills else math.nan,
        "pooled_coverage90": cov,
        "pooled_baseline_coverage90": base_cov,
        "max_ks_margin": max(margins) if margins else math.nan,
    }
    out["targets"] = {
        "crps_skill_every_run_ge_0": bool(skills) and out["min_crps_skill"] >= SKILL_MIN,
        "crps_skill_mean_ge_0.10": bool(skills) and out["mean_crps_skill"] >= SKILL_MEAN_MIN,
        "pooled_coverage90_in_0.80_0.97": COVERAGE_RANGE[0] <= cov <= COVERAGE_RANGE[1],
        "ks_within_0.01_of_baseline_every_run": bool(margins) and out["max_ks_margin"] <= KS_MARGIN,
    }
    return out


SUMMARY_KS_MARGIN = 0.08
SUMMARY_RATIO_MAX, SUMMARY_RATIO_MEAN_MAX = 1.5, 1.3


def summary_criterion(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets of the fit from summaries over the runs that have a ``summary_fit`` block
    (``polytrace fidelity --from-summaries``): its median KS within 0.08 of the per-sample fit's on
    every run, its CRPS at most 1.5x the per-sample fit's on every run and 1.3x on average, the
    pooled 90% coverage in [0.80, 0.97]."""
    blocks = [(r["run_id"], r["summary_fit"]) for r in results if r.get("summary_fit")]
    if not blocks:
        return {}
    ratios = [b["crps_ratio"] for _, b in blocks if b["crps_ratio"] == b["crps_ratio"]]
    margins = [b["ks_median"] - b["ks_sample_fit"] for _, b in blocks]
    cells = sum(b["cells"] for _, b in blocks)
    cov = sum(b["covered"] for _, b in blocks) / cells if cells else math.nan
    out = {
        "runs": len(blocks),
        "cells": cells,
        "covered": sum(b["covered"] for _, b in blocks),
        "pooled_coverage90": cov,
        "mean_crps_ratio": statistics.fmean(ratios) if ratios else math.nan,
        "max_crps_ratio": max(ratios) if ratios else math.nan,
        "max_ks_margin": max(margins) if margins else math.nan,
        "mean_crps_skill": statistics.fmean(b["crps_skill"] for _, b in blocks),
    }
    out["targets"] = {
        "ks_within_0.08_of_sample_fit_every_run": bool(margins) and out["max_ks_margin"] <= SUMMARY_KS_MARGIN,
        "crps_ratio_every_run_le_1.5": bool(ratios) and out["max_crps_ratio"] <= SUMMARY_RATIO_MAX,
        "crps_ratio_mean_le_1.3": bool(ratios) and out["mean_crps_ratio"] <= SUMMARY_RATIO_MEAN_MAX,
        "pooled_coverage90_in_0.80_0.97": COVERAGE_RANGE[0] <= cov <= COVERAGE_RANGE[1],
    }
    return out


def summary_fit_table(results: list[dict[str, Any]]) -> str:
    """The fit from summaries beside the per-sample fit, one line per run, then its targets."""
    rows = [r for r in results if r.get("summary_fit")]
    if not rows:
        return ""
    w = max([18, *(len(r["run_id"]) for r in rows)])
    head = (f"{'run':<{w}} {'origins':>7}  {'KS summ/sample':>15}  {'CRPS ratio':>10}  {'CRPS skill':>10}  "
            f"{'coverage90':>10}")
    lines = ["fit from per-step summaries alone (min, mean, max, clip ratio, n; verl's global_seqlen; turns, tool time),",
             "scored as the per-sample fit is, on the same origins and seeds:", head, "-" * len(head)]
    for r in rows:
        b = r["summary_fit"]
        lines.append(f"{r['run_id']:<{w}} {b['origins']:>7}  {_f(b['ks_median'], '.3f'):>6} / {_f(b['ks_sample_fit'], '<.3f'):<6}  "
                     f"{_f(b['crps_ratio'], '.3f'):>10}  {_f(b['crps_skill'], '+.3f'):>10}  {_f(b['coverage90'], '.3f'):>10}")
    c = summary_criterion(rows)
    lines.append("")
    lines.append(f"pooled coverage90 {_f(c['pooled_coverage90'], '.3f')} = {c['covered']}/{c['cells']} cells; CRPS ratio mean "
                 f"{_f(c['mean_crps_ratio'], '.3f')} (max {_f(c['max_crps_ratio'], '.3f')}); largest KS margin over the "
                 f"per-sample fit {_f(c['max_ks_margin'], '+.3f')}")
    lines.append("targets: " + "  ".join(f"{k}={'PASS' if ok else 'MISS'}" for k, ok in c["targets"].items()))
    lines.append("KS: median over predicted steps of response lengths (seeds pooled) vs the real step. CRPS ratio: the fit")
    lines.append("from summaries' mean CRPS / real over the per-step statistics, over the per-sample fit's. CRPS skill: against")
    lines.append("PolyTrace's histogram fitted on the real samples.")
    return "\n".join(lines)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None or v != v else format(v, fmt)


def fidelity_table(results: list[dict[str, Any]]) -> str:
    """One line per run, ours beside PolyTrace's histogram resampler; then the pooled criterion
    and, for runs with a step log, the step-time model."""
    scored = [r for r in results if "rolling_origin" in r]
    timed = [r for r in results if r.get("step_time_model")]
    lines: list[str] = []
    if scored:
        w = max([18, *(len(r["run_id"]) for r in scored)])
        head = (f"{'run':<{w}} {'split':<13} {'origins':>7} {'seeds':>5}  {'CRPS skill':>10}  {'coverage90 ours/hist':>20}  "
                f"{'KS ours/hist':>13}  {'MAPE acc ours/hist':>18}  {'ceiling':>7}")
        lines += [head, "-" * len(head)]
        for r in scored:
            x = r["rolling_origin"]
            lines.append(
                f"{r['run_id']:<{w}} {r['split']:<13} {x['origins']:>7} {x['seeds']:>5}  {_f(x['crps_skill'], '+.3f'):>10}  "
                f"{_f(x['coverage90'], '.2f'):>9} / {_f(x['baseline_coverage90'], '<.2f'):<8}  "
                f"{_f(x['ks_mean'], '.3f'):>5} / {_f(x['baseline_ks_mean'], '<.3f'):<5}  "
                f"{_f(x['mape_accuracy_pct'], '.1f'):>7} / {_f(x['baseline_mape_accuracy_pct'], '<.1f'):<8}  "
                f"{_f(x['ceiling_accuracy_pct'], '.1f'):>7}"
            )
            per = "  ".join(f"{k}={_f(v['crps_skill'], '+.2f')} ({_f(v['coverage90'], '.2f')}/{_f(v['baseline_coverage90'], '.2f')})"
                            for k, v in x["by_statistic"].items())
            lines.append(f"    by statistic, CRPS skill (coverage ours/hist): {per}")
        c = criterion(scored)
        lines.append("")
        lines.append(f"mean CRPS skill {_f(c['mean_crps_skill'], '+.3f')} (min {_f(c['min_crps_skill'], '+.3f')}); pooled coverage90 "
                     f"{_f(c['pooled_coverage90'], '.3f')} = {c['covered']}/{c['cells']} cells (histogram "
                     f"{_f(c['pooled_baseline_coverage90'], '.3f')}; mean of the runs' {_f(c['mean_run_coverage90'], '.3f')}); "
                     f"largest KS margin over the histogram {_f(c['max_ks_margin'], '+.3f')}")
        lines.append("targets: " + "  ".join(f"{k}={'PASS' if ok else 'MISS'}" for k, ok in c["targets"].items()))
        lines.append("")
        lines.append("Rolling origin: fit on the full steps up to each origin (>= 2), generate the next 1-2 steps with every seed.")
        lines.append("CRPS skill: 1 - mean(CRPS ours / real) / mean(CRPS histogram / real) over statistics and origins (> 0: ours closer).")
        lines.append("coverage90: share of real per-step statistics inside the ensemble's central 90% interval (calibrated: 0.90).")
        lines.append("KS: per predicted step, generated (seeds pooled) vs real per-sample values. MAPE acc and the hindsight")
        lines.append("ceiling (best constant forecast chosen knowing the answers) are context, not targets.")
    summ = summary_fit_table(results)
    if summ:
        lines += ["", summ]
    if timed:
        lines.append("")
        lines.append("step-time model (time = a + b*tokens + c*longest response; fitted on the first 2/3 of steps), accuracy %:")
        lines.append(f"{'run':<54} {'target':<12} {'real wl':>8} {'gen wl':>8} {'trainmean':>9}")
        for r in timed:
            for t in ("gen_time_s", "step_time_s"):
                m = r["step_time_model"].get(t)
                if m:
                    lines.append(f"{r['run_id'][:54]:<54} {t:<12} {m['accuracy_from_real_workload_pct']:>8.1f} "
                                 f"{m['accuracy_from_generated_workload_pct']:>8.1f} {m['baseline_mean_accuracy_pct']:>9.1f}")
    return "\n".join(lines)
