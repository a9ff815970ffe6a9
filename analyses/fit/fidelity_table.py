"""The fidelity scores as one plain-text table (the CLI prints it; the Dagster assets show it)."""

from __future__ import annotations

import statistics
from typing import Any


def fidelity_table(results: list[dict[str, Any]]) -> str:
    """A plain-text table: one line per run, ours beside the baseline, the references that say what
    the held-out steps allow, then per-statistic errors."""
    w = max([18, *(len(r["run_id"]) for r in results if "accuracy_pct" in r)])
    head = (f"{'run':<{w}} {'split':<13} {'held-out':<10} {'ours %':>11} {'base %':>11}  {'ceiling':>7} {'rec.mean':>8}  "
            f"{'1-replay ours/base':>18}  {'level ours/base':>15}  {'in-sample ours/base':>19}")
    lines = [head, "-" * len(head)]
    timed = [r for r in results if r.get("step_time_model")]
    results = [r for r in results if "accuracy_pct" in r]

    def pm(v: float, se: float | None) -> str:
        return f"{v:.1f}" if se is None or se != se else f"{v:.1f}±{se:.1f}"

    for r in results:
        ho = f"{len(r['heldout_steps'])} steps"
        lines.append(
            f"{r['run_id']:<{w}} {r['split']:<13} {ho:<10} {pm(r['accuracy_pct'], r.get('monte_carlo_se_pct')):>11} "
            f"{pm(r['baseline_accuracy_pct'], r.get('baseline_monte_carlo_se_pct')):>11}  "
            f"{r.get('ceiling_accuracy_pct', float('nan')):>7.1f} {r.get('recorded_mean_accuracy_pct', float('nan')):>8.1f}  "
            f"{r['single_replay_accuracy_pct']:>8.1f}/{r['baseline_single_replay_accuracy_pct']:<9.1f}  "
            f"{r['level_accuracy_pct']:>7.1f}/{r['baseline_level_accuracy_pct']:<7.1f}  "
            f"{r.get('in_sample_level_accuracy_pct', float('nan')):>9.1f}/{r.get('baseline_in_sample_level_accuracy_pct', float('nan')):<9.1f}"
        )
        errs = "  ".join(f"{k}={r['errors_pct'][k]:.1f}/{r['baseline_errors_pct'][k]:.1f}" for k in r["statistics"])
        lines.append(f"    per-step APE % (ours/base): {errs}")
        if r.get("ceiling_errors_pct"):
            lines.append("    ceiling APE %: " + "  ".join(f"{k}={r['ceiling_errors_pct'][k]:.1f}" for k in r["statistics"]))
    if len(results) > 1:
        lines.append(f"{'mean':<{w}} {'':<13} {'':<10} {statistics.fmean(r['accuracy_pct'] for r in results):>11.1f} "
                     f"{statistics.fmean(r['baseline_accuracy_pct'] for r in results):>11.1f}")
    if results:
        lines.append("")
        lines.append("ours/base: 100 - per-step MAPE on the held-out steps, ± the Monte Carlo standard error of the seed average.")
        lines.append("ceiling: the best one prediction for every held-out step can score, chosen knowing the held-out answers.")
        lines.append("rec.mean: the fitted steps' mean as the prediction. in-sample: level score against the fitted steps.")
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
