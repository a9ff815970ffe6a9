"""``run_comparison`` and the report links of the Dagster assets (issue 27, items 1 and 3): the asset's
metadata, and the reports directory served over HTTP so the links open from the UI."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _views_util import build_demo_warehouse
from dagster import AssetKey, materialize

from pipelines import report_server
from pipelines.assets import compare as C
from pipelines.resources import WarehouseResource


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dcmp") / "wh"
    build_demo_warehouse(root)  # published in order: math-a, agent-b, dapo-c
    return root


def _materialize(wh: Path, config: dict | None = None) -> dict:
    res = materialize([C.run_comparison], resources={"warehouse": WarehouseResource(root=str(wh), logs_root=str(wh))},
                      run_config={"ops": {"run_comparison": {"config": config}}} if config else None)
    assert res.success
    (ev,) = res.get_asset_materialization_events()
    assert ev.asset_key == AssetKey("run_comparison")
    return ev.materialization.metadata


def test_run_comparison_defaults_to_the_latest_run_against_the_one_before(wh: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTRACE_PNG", "0")
    monkeypatch.setenv(report_server.ENV_SERVE, "0")
    meta = _materialize(wh)
    assert (meta["a"].value, meta["b"].value) == ("agent-b", "dapo-c")
    assert meta["differences"].value.startswith("A: agent-b (no steps)  \nB: dapo-c (steps 1-3, 3)")
    assert "| rank | quantity | a | b | credible | text |" in meta["differences"].value
    page = Path(meta["path"].value)
    assert page == wh / "reports" / "comparisons" / "dapo-c__vs__agent-b.html" and page.exists()
    assert meta["comparison"].value == page.resolve().as_uri()  # not served: the file itself


def test_run_comparison_config_compares_two_step_ranges_and_links_over_http(wh: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTRACE_PNG", "0")
    monkeypatch.setenv(report_server.ENV_SERVE, "1")
    monkeypatch.setenv(report_server.ENV_PORT, "3999")
    meta = _materialize(wh, {"a": "math-a:1-3", "b": "math-a:4-6"})
    assert (meta["a"].value, meta["b"].value) == ("math-a:1-3", "math-a:4-6")
    assert meta["comparison"].value == "http://127.0.0.1:3999/comparisons/math-a_4-6__vs__math-a_1-3.html"
    assert meta["json"].value.endswith("/comparisons/math-a_4-6__vs__math-a_1-3.json")


def test_a_bad_side_fails_the_materialization_with_its_reason(wh: Path) -> None:
    res = materialize([C.run_comparison], resources={"warehouse": WarehouseResource(root=str(wh), logs_root=str(wh))},
                      run_config={"ops": {"run_comparison": {"config": {"a": "math-a", "b": "nope"}}}},
                      raise_on_error=False)
    assert not res.success
    assert "run(s) not in the warehouse: nope" in str(res.all_events)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_report_server_serves_the_reports_directory_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reports = tmp_path / "reports"
    (reports / "comparisons").mkdir(parents=True)
    (reports / "comparisons" / "b__vs__a.html").write_text("<html>cmp</html>")
    (tmp_path / "secret.txt").write_text("outside")
    port = _free_port()
    monkeypatch.setenv(report_server.ENV_SERVE, "1")
    monkeypatch.setenv(report_server.ENV_PORT, str(port))
    assert report_server.start(reports) is not None
    url = report_server.url_for(reports / "comparisons" / "b__vs__a.html", reports, "compare")
    assert url == f"http://127.0.0.1:{port}/comparisons/b__vs__a.html#compare"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - a local test server
                body, cache = r.read(), r.headers["Cache-Control"]
            break
        except OSError:
            assert time.monotonic() < deadline, "the report server never answered"
            time.sleep(0.2)
    assert body == b"<html>cmp</html>" and cache == "no-store"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/../secret.txt", timeout=5)  # noqa: S310
    assert e.value.code == 404
    # a file outside the reports directory keeps its file:// link
    assert report_server.url_for(tmp_path / "secret.txt", reports) == (tmp_path / "secret.txt").resolve().as_uri()


def test_not_served_without_dagster_dev_or_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(report_server.ENV_SERVE, raising=False)
    monkeypatch.delenv("DAGSTER_IS_DEV_CLI", raising=False)
    assert not report_server.wanted()
    monkeypatch.setenv("DAGSTER_IS_DEV_CLI", "1")  # what `dagster dev` (make ui) sets for its processes
    assert report_server.wanted()
    monkeypatch.setenv(report_server.ENV_SERVE, "0")
    assert not report_server.wanted()
