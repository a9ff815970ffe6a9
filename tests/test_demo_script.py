"""``python -m pipelines.demo`` as a script: what it does around :func:`pipelines.demo.main` to take
less of the user's time (the collector, the PNG browser), without changing what the demo writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipelines import demo

REPO = Path(__file__).resolve().parents[1]


class _Stop(Exception):
    """Raised by the stand-in for the per-run jobs: main() has done everything before them."""


def _before_the_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, logs: Path, *argv: str) -> list[str]:
    calls: list[str] = []
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setattr(demo, "start_png_browser", lambda: calls.append("browser"), raising=False)

    def runs(*_a: object, **_k: object) -> None:
        calls.append("runs")
        raise _Stop

    monkeypatch.setattr(demo, "materialize_all", runs)
    with pytest.raises(_Stop):
        demo.main(["--logs-root", str(logs), "--warehouse", str(tmp_path / "wh"), *argv])
    return calls


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    (tmp_path / "logs" / "a-run").mkdir(parents=True)
    return tmp_path / "logs"


def test_the_png_browser_starts_before_the_per_run_jobs(
    tmp_path: Path, logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chromium's start-up runs beside the per-run jobs, not inside the cross-run job's characterize step."""
    monkeypatch.delenv("POLYTRACE_PNG", raising=False)
    assert _before_the_runs(monkeypatch, tmp_path, logs) == ["browser", "runs"]


@pytest.mark.parametrize(("argv", "png"), [(("--ingest-only",), None), ((), "0")])
def test_no_browser_when_no_png_is_drawn(
    tmp_path: Path, logs: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...], png: str | None
) -> None:
    if png is None:
        monkeypatch.delenv("POLYTRACE_PNG", raising=False)
    else:
        monkeypatch.setenv("POLYTRACE_PNG", png)
    assert _before_the_runs(monkeypatch, tmp_path, logs, *argv) == ["runs"]


def test_the_script_collects_nothing_during_its_imports_and_freezes_them(tmp_path: Path) -> None:
    """As a script (not on import), no cyclic collection runs while dagster, the definitions and
    analyses are imported; they are frozen before main() and what is left is frozen before exit."""
    probe = textwrap.dedent(
        """
        import gc, runpy, sys
        seen = []
        gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(gc.get_freeze_count()))
        sys.argv = ["pipelines.demo", "--logs-root", sys.argv[1]]
        try:
            runpy.run_module("pipelines.demo", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
        print(code, sum(1 for n in seen if n == 0), gc.get_freeze_count(), gc.isenabled())
        """
    )
    # a logs root that is not a directory: main() returns 2 at once, after every import
    r = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "missing")], cwd=REPO, capture_output=True,
                       text=True, env={"DAGSTER_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    code, before_freeze, frozen, enabled = r.stdout.split()
    assert code == "2"
    assert before_freeze == "0"  # no collection before the imports were frozen
    assert int(frozen) > 100_000 and enabled == "True"


def test_importing_the_module_leaves_the_collector_alone() -> None:
    import gc

    assert gc.isenabled()
