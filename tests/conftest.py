"""Shared fixtures. Real-log tests read ``../shared/real_logs``; under ``CI=true`` a missing
directory fails the test instead of skipping it, so CI never passes on nothing."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ci import skip_or_fail
from _notify_util import Receiver

REPO = Path(__file__).resolve().parents[1]
REAL_LOGS = Path(os.environ.get("POLYTRACE_REAL_LOGS", REPO.parent / "shared" / "real_logs"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _require(path: Path) -> Path:
    if not path.exists():  # fails under CI=true, skips elsewhere
        skip_or_fail(f"real logs not found at {path} (set POLYTRACE_REAL_LOGS or place the real logs beside the repo)")
    return path


@pytest.fixture(scope="session")
def real_logs() -> Path:
    """Root of ../shared/real_logs (fails under CI=true when missing, skips elsewhere)."""
    return _require(REAL_LOGS)


@pytest.fixture
def real_file(real_logs: Path):
    """``real_file("verl/x.log")`` -> the path, failing/skipping as :func:`real_logs` does."""

    def get(rel: str) -> Path:
        return _require(real_logs / rel)

    return get


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local HTTP endpoint on 127.0.0.1 taking Apprise ``json://`` notifications (tests/_notify_util.py)."""
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the consumer drivers this process started (conformance/consumers.py serves each from one
    process per test run); an xdist worker may leave without running ``atexit``."""
    consumers = sys.modules.get("conformance.consumers")
    if consumers is not None:
        consumers.stop_drivers()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep each ``xdist_group`` on one worker under ``--dist loadgroup`` (``make test``).

    xdist 3.8 groups the tests whose node id ends in ``@group``, and renames them by setting
    ``item._nodeid``; pytest 9.2 derives ``nodeid`` from ``item._id``, so the rename was lost and
    every group spread over both workers: the second worker blocked on the conformance build's
    lock, and the two Ray tests started their clusters at once on 2 cores.

    Also the modules holding a ``slow`` test go first, each kept whole (its module fixtures are
    built once): after the groups, xdist hands the tests out in collection order, so a long test
    collected last (test_watch.py's) ran alone at the end while the other worker had finished."""
    if not getattr(config.option, "loadgroup", False):  # set on the workers under --dist loadgroup
        return
    slow_modules = {it.nodeid.split("::")[0] for it in items if it.get_closest_marker("slow")}
    items.sort(key=lambda it: it.nodeid.split("::")[0] not in slow_modules)  # stable: each module stays in order
    from _pytest.nodeid import coerce_node_id

    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and not item.nodeid.endswith("@" + "_".join(groups)):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")  # noqa: SLF001

