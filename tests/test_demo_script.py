"""``python -m pipelines.demo`` as a script: what it does around :func:`pipelines.demo.main` to take
less of the user's time (the collector), without changing what the demo writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_script_collects_nothing_during_its_imports_and_freezes_them(tmp_path: Path) -> None:
    """As a script (not on import), no cyclic collection runs while dagster, the definitions and
    analyses are imported; they are frozen before main() and what is left is frozen before exit."""
    probe = textwrap.dedent(
        """
        import gc, os, runpy, sys
        seen = []
        # collections once the imports began (the module's own source may be compiled first: stale bytecode)
        gc.callbacks.append(lambda phase, info: phase == "start" and "dagster" in sys.modules
                            and seen.append(gc.get_freeze_count()))
        sys.argv = ["pipelines.demo", "--logs-root", sys.argv[1]]
        try:
            runpy.run_module("pipelines.demo", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
        print(code, sum(1 for n in seen if n == 0), gc.get_freeze_count(), gc.isenabled(),
              os.environ.get("OPENBLAS_NUM_THREADS"))
        """
    )
    # a logs root that is not a directory: main() returns 2 at once, after every import
    r = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "missing")], cwd=REPO, capture_output=True,
                       text=True, env={"DAGSTER_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    code, before_freeze, frozen, enabled, blas_threads = r.stdout.split()
    assert code == "2"
    assert blas_threads == "1"  # set before numpy loads: its OpenBLAS thread does not spin (quiet_blas_threads)
    assert before_freeze == "0"  # no collection before the imports were frozen
    assert int(frozen) > 100_000 and enabled == "True"


def test_importing_the_module_leaves_the_collector_alone() -> None:
    import gc
    import importlib

    import pipelines.demo

    importlib.reload(pipelines.demo)  # its module code runs again here, as on import
    assert gc.isenabled()
