"""Execute notebooks/characterization.ipynb against a small synthetic warehouse so it cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _chromium import require_chromium
from _views_util import build_demo_warehouse

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "characterization.ipynb"


@pytest.mark.slow
def test_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import os

    missing = [m for m in ("nbformat", "nbclient", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:  # never let the notebook rot silently in CI
        msg = f"notebook execution needs {', '.join(missing)} (dev dependencies)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    import nbclient
    import nbformat

    root = tmp_path / "wh"
    build_demo_warehouse(root)
    # the kernel inherits the environment: point it at the test warehouse; the notebook's own renderer
    # (plotly JSON + a static PNG drawn by analyses.png_render, which needs Chromium)
    require_chromium()
    monkeypatch.setenv("POLYTRACE_WAREHOUSE", str(root))
    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    monkeypatch.setenv("POLARS_MAX_THREADS", "2")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for o in outputs)
    # the runs of the demo warehouse, and one number per question we can check by construction
    assert "math-a" in text and "agent-b" in text and "dapo-c" in text
    assert "quantile_disc" in text  # the printed quantile definition
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    # cdf 1 + drift 2 (math-a, dapo-c) + stages 1 + throughput 1 + imbalance 2 + gpu 1 + tools 1 + multiturn 2 + filter 1
    assert len(figures) == 12
    # each also as a PNG, so GitHub and nbconvert --to html show it
    assert all("image/png" in o["data"] for o in figures)
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(nb)
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', html)) == 12
