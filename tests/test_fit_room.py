"""The fit room's layout (issue 23, item 5): arrows point down -- the fits import the sampler from
``analyses.fit`` (nothing from ``analyses.export`` but the spec document), the exports import it from
below -- and a reader following a run through the fidelity check returns to each module few times.

The walk: every function of ``analyses/fit`` the first time it is called, in call order, as the
sequence of modules they live in with consecutive repeats merged (a reader reads a function once; a
module counts again when the reader comes back to it from another one). Measured on the DAPO run
20260610 (PolyTrace.fidelity, 2 seeds): before this layout ``workload.py`` 7 and ``rolling.py`` 7 visits;
after it 5 and 4."""

from __future__ import annotations

import ast
import collections
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _fit_synth import synth_samples

from analyses.fit.data import RunFrames
from analyses.fit.fidelity import fidelity

REPO = Path(__file__).resolve().parents[1]
FIT = REPO / "analyses" / "fit"


def walk(call: Callable[[], Any]) -> list[str]:
    """The modules of ``analyses/fit`` in the order a reader meets their functions (see the module text)."""
    seen: set[tuple[str, int]] = set()
    seq: list[str] = []
    root = str(FIT) + "/"

    def prof(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event != "call" or code.co_name.startswith("<") or not code.co_filename.startswith(root):
            return
        key = (code.co_filename, code.co_firstlineno)
        if key in seen:
            return
        seen.add(key)
        mod = Path(code.co_filename).stem
        if not seq or seq[-1] != mod:
            seq.append(mod)

    sys.setprofile(prof)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seq


def test_fit_imports_nothing_from_export_but_the_spec_document():
    for p in sorted(FIT.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("analyses.export"):
                assert node.module == "analyses.export.spec", f"{p.name} imports {node.module}"
    assert not (REPO / "analyses" / "export" / "sampler.py").exists()


def test_a_reader_returns_to_workload_and_rolling_few_times():
    s = synth_samples(steps=5, prompts=8, n=4, cap=2000, seed=2)
    seq = walk(lambda: fidelity(RunFrames("r", s), seeds=(0, 1)))
    visits = collections.Counter(seq)
    assert seq[:2] == ["fidelity", "data"] and seq[-1] in ("fidelity", "scores")  # the data first, once prepared
    assert visits["workload"] <= 5 and visits["rolling"] <= 4, (visits, " -> ".join(seq))
