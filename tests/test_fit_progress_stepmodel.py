"""Progress of `polytrace fit` / `fidelity` on a terminal (quiet otherwise), and the step-time
model's generated-workload regressors (the "-630 %" cell)."""

from __future__ import annotations

import io

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_samples
from rich.console import Console

from analyses.cli.work_progress import WorkProgress
from analyses.fit.data import RunFrames
from analyses.fit.fidelity import fidelity
from analyses.fit.stepmodel import generated_regressor, step_time_fidelity


def test_fidelity_progress_counts_runs_and_origins():
    buf = io.StringIO()
    bar = WorkProgress(True, runs=1, label="fidelity", console=Console(file=buf, force_terminal=True, width=160))
    events: list[str] = []

    def record(kind: str, data: dict) -> None:
        events.append(kind)
        bar.event(kind, data)

    with bar:
        fidelity(RunFrames("r", synth_samples(steps=4, prompts=8, n=4, seed=0)), seeds=(0,), progress=record)
    # 4 steps: 2 origins
    assert events == ["run_start", "origin_done", "origin_done", "run_done"]
    assert "fidelity" in buf.getvalue() and "origins" in buf.getvalue() and "remaining" in buf.getvalue()


def test_progress_is_silent_when_disabled():
    buf = io.StringIO()
    with WorkProgress(False, runs=2, label="fit", console=Console(file=buf, force_terminal=True)) as bar:
        bar.event("run_start", {"run_id": "r", "origins": 3})
        bar.event("origin_done", {})
        bar.event("run_done", {})
    assert buf.getvalue() == ""


def test_cli_fit_and_fidelity_print_no_progress_when_not_a_terminal(tmp_path, capsys):
    from analyses.cli import main
    from analyses.export.registry import export
    from analyses.export.spec import build_spec
    from analyses.fit.workload import fit_workload

    w = fit_workload(synth_samples(steps=4, prompts=8, n=4, seed=2), run_id="src", task="math")
    export(build_spec({"src": w}, ["src"]), "polytrace-v2", tmp_path / "logs" / "run", steps=4, seed=1)
    wh = tmp_path / "wh"
    assert main(["ingest", str(tmp_path / "logs" / "run"), "--warehouse", str(wh), "-q"]) == 0
    capsys.readouterr()
    assert main(["fit", "--warehouse", str(wh), "--out", str(tmp_path / "s.json")]) == 0
    assert main(["fidelity", "run", "--warehouse", str(wh), "--seeds", "3"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "CRPS skill" in out  # stderr is not a terminal under pytest: no bars


def test_generated_regressors_never_go_negative():
    # an agentic verl run whose responses collapsed to 1 token after 12 long steps: a straight
    # line through the 157 training steps extrapolated the longest response to -2,057 tokens and
    # the generation time to -10.9 s (the "-630 % accuracy" cell); the level model's forecast
    # stays positive and near the recent regime
    steps = np.arange(1, 158)
    longest = np.where(steps <= 12, 8096.0, 1.0)
    at = np.arange(158, 236)
    line = np.polyval(np.polyfit(steps, longest, 1), at)
    assert line.min() < -1000  # what the old extrapolation did
    got = generated_regressor(steps, longest, at)
    assert got.min() > 0 and got.max() < 100


def test_step_time_model_from_a_generated_workload_is_finite_and_positive():
    k = np.arange(1, 41)
    tokens = np.where(k <= 8, 1e6, 1.6e5) * (1 + 0.01 * np.sin(k))
    longest = np.where(k <= 8, 8096.0, 1.0)
    gen = 1e-4 * tokens + 0.01 * longest + 2.0
    steps = pl.DataFrame({"step": k, "gen_time_s": gen, "step_time_s": gen + 30, "total_tokens": tokens,
                          "prompt_len_mean": np.full(40, 300.0), "response_len_mean": longest / 2, "response_len_max": longest})
    m = step_time_fidelity(steps)
    g = m["gen_time_s"]
    assert g["accuracy_from_real_workload_pct"] == pytest.approx(100, abs=0.5)  # the model is the truth
    # held-out steps 28-40 are in the collapsed regime: the generated workload forecasts it from the
    # training level, never a negative time
    assert g["accuracy_from_generated_workload_pct"] > 0
