"""The report's workload section: per run, the fitted workload (from per-sample records or from
per-step summaries) and, for a run fitted from its summaries, the fitted per-step length quantiles
beside the min, mean and max the run logged -- what ``fits/<run>.spec.json`` says, read back from
the warehouse (the spec files are written by ``polytrace fit`` / the ``run_workload`` asset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analyses.figures import FigureSpec, house_template, safe_key, summary_check_figure
from analyses.fit.data import load_summaries
from analyses.fit.summary_fit import summary_check
from analyses.report import Section

GROUP = "workload"
TITLE = "Workload"
QUESTION = ("What workload does each run's fit generate, what was it fitted from, and (a run fitted from its per-step "
            "summaries) do its fitted per-step lengths agree with the min, mean and max the run logged?")
NEEDS = "a fitted spec (`polytrace fit`, the Dagster run_workload asset)"


def workload_row(run_id: str, key: str, w: dict[str, Any]) -> dict[str, Any]:
    """One workload as the section's table shows it."""
    src = w.get("source") or {}
    r = w["variables"]["response_tokens"]
    b = w["batch"]
    body = r.get("body") or {}
    return {
        "run_id": run_id,
        "workload": key,
        "fitted_from": "summaries" if src.get("kind") == "summaries" else "samples",
        "samples_per_step": int(b["prompts_per_step"]) * int(b["samples_per_prompt"]),
        "batch": f"{b['prompts_per_step']}x{b['samples_per_prompt']}",
        "steps_fitted": len(w.get("steps_fitted") or []),
        "response_shape": body.get("family") or r.get("kind"),
        "cap": r.get("censor_at"),
        "step_sd": float(w["drift"].get("step_sd") or 0.0),
        "options": (w.get("selection") or {}).get("selected"),
        "n_source": src.get("n_source"),
        "assumed": ", ".join(src.get("assumed") or []) or None,
    }


@house_template()
def workload_section(root: Path, spec_path: Any, runs: list[str]) -> Section:
    """The section for ``runs`` (``spec_path(run)``: where a run's spec is)."""
    from analyses.export.spec import SpecError, read_spec

    rows: list[dict[str, Any]] = []
    figures: list[FigureSpec] = []
    for run in runs:
        p = spec_path(run)
        if not p.exists():
            continue
        try:
            spec = read_spec(p)
        except SpecError:
            continue
        summ = None
        for key, w in spec["workloads"].items():
            rows.append(workload_row(run, key, w))
            if (w.get("source") or {}).get("kind") != "summaries":
                continue
            if summ is None:
                summ = load_summaries(root, run).summaries
            check = summary_check(w, summ)
            if check.height:
                figures.append(FigureSpec(f"{GROUP}__summary_check__{safe_key(key)}", summary_check_figure(check, key)))
    return Section(GROUP, TITLE, QUESTION, NEEDS, pl.DataFrame(rows) if rows else pl.DataFrame(), figures)
