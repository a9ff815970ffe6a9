"""Parallel ingest (``--workers N``, ``--ray ADDRESS``) publishes exactly the tables the serial
ingest does; a Ray address that does not answer is a one-line usage error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _ray_util import ray_head
from _warehouse_util import assert_same_tables

from analyses.cli import main
from analyses.warehouse import STAGING, published_runs

REPO = Path(__file__).resolve().parents[1]


def _runs(tmp: Path, n: int) -> Path:
    """``n`` small verl console runs, each with its own numbers, under one root."""
    root = tmp / "logs"
    for i in range(n):
        d = root / f"run-{i}"
        d.mkdir(parents=True)
        (d / "train.log").write_text("".join(
            f"step:{s} - timing_s/gen:{i + s / 10} - timing_s/step:{2 * i + s} - response_length/mean:{100 + i * s}\n"
            for s in range(1, 6)))
    return root


def test_workers_publish_the_same_tables_as_serial(tmp_path: Path) -> None:
    logs = _runs(tmp_path, 4)
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "serial"), "-q"]) == 0
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "par"), "-q", "--workers", "2"]) == 0
    assert sorted(published_runs(tmp_path / "par")) == [f"run-{i}" for i in range(4)]
    assert_same_tables(tmp_path / "serial", tmp_path / "par")
    assert not any((tmp_path / "par" / STAGING).iterdir())  # every worker cleaned up after itself


def test_workers_on_the_sample_logs_match_serial(tmp_path: Path) -> None:
    logs = REPO / "sample_logs"
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "serial"), "-q"]) == 0
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "par"), "-q", "--workers", "2"]) == 0
    assert_same_tables(tmp_path / "serial", tmp_path / "par")


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers must be >= 1"),
    (["--ray", "127.0.0.1:1"], "no Ray cluster answers at '127.0.0.1:1'"),
    (["--ray", "nonsense"], "expected HOST:PORT or 'auto'"),
])
def test_bad_fanout_options_exit_2_with_one_line(tmp_path: Path, argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    logs = _runs(tmp_path, 1)
    wh = tmp_path / "wh"
    assert main(["ingest", "--root", str(logs), "--warehouse", str(wh), "-q", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not published_runs(wh)


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    with ray_head() as head:
        yield head.address


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ray_ingest_of_two_runs_matches_serial(tmp_path: Path, ray_cluster: str) -> None:
    logs = _runs(tmp_path, 2)
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "serial"), "-q"]) == 0
    assert main(["ingest", "--root", str(logs), "--warehouse", str(tmp_path / "ray"), "-q", "--ray", ray_cluster]) == 0
    assert sorted(published_runs(tmp_path / "ray")) == ["run-0", "run-1"]
    assert_same_tables(tmp_path / "serial", tmp_path / "ray")
