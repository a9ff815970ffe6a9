"""Shared by the query sandbox and limits tests: a one-run warehouse of three steps."""

from __future__ import annotations

from pathlib import Path

from analyses.api import PolyTrace


def demo_warehouse(tmp_path: Path) -> Path:
    """``<tmp_path>/wh`` with run ``demo``: steps 0, 1, 2 (step time s + 0.5 s)."""
    run = tmp_path / "logs" / "demo"
    run.mkdir(parents=True)
    (run / "train.log").write_text("".join(f"step:{s} - timing_s/step:{s}.5 - timing_s/gen:1.0\n" for s in range(3)))
    root = tmp_path / "wh"
    PolyTrace(root).ingest(run, run_id="demo")
    return root
