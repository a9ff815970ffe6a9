"""The demo's instance storage (pipelines.instance_storage): Dagster's SQLite files with their
connections kept open. What it writes is what `make ui` reads with Dagster's default storage."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetKey,
    DagsterInstance,
    MaterializeResult,
    asset,
    asset_check,
    materialize,
)
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

from pipelines import instance_storage
from pipelines.demo import INSTANCE_YAML, QUIET_RUN_CONFIG
from pipelines.instance_storage import PooledSqliteEventLogStorage, open_instance


@asset
def table() -> MaterializeResult:
    return MaterializeResult(metadata={"rows": 3})


@asset_check(asset=table)
def has_rows() -> AssetCheckResult:
    return AssetCheckResult(passed=True, metadata={"rows": 3})


def _home(tmp_path: Path, yaml: str = INSTANCE_YAML) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml)
    return home


def _schema(db: Path) -> tuple[object, ...]:
    con = sqlite3.connect(db)
    try:
        return (sorted(con.execute("SELECT type, name, sql FROM sqlite_master").fetchall()),
                con.execute("SELECT version_num FROM alembic_version").fetchall(),
                con.execute("PRAGMA journal_mode").fetchall())
    finally:
        con.close()


def test_runs_written_through_the_pool_are_read_by_the_default_storage(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(instance_storage, "OPEN_SHARDS", 1)  # older runs' shards are closed as new ones open
    home = _home(tmp_path)
    with open_instance(home) as inst:
        assert isinstance(inst.event_log_storage, PooledSqliteEventLogStorage)
        for _ in range(3):
            assert materialize([table, has_rows], instance=inst, run_config=QUIET_RUN_CONFIG).success
    # what `make ui` (dagster dev on the same home, its dagster.yaml as written) sees
    with DagsterInstance.from_config(str(home)) as ui:
        assert type(ui.event_log_storage) is SqliteEventLogStorage
        runs = ui.get_runs()
        assert len(runs) == 3 and all(r.is_success for r in runs)
        mats = ui.fetch_materializations(AssetKey("table"), limit=10).records
        assert [m.asset_materialization.metadata["rows"].value for m in mats] == [3, 3, 3]
        assert {m.run_id for m in mats} == {r.run_id for r in runs}
        checks = ui.event_log_storage.get_asset_check_execution_history(has_rows.check_key, limit=10)
        assert len(checks) == 3 and all(c.evaluation.passed for c in checks)  # type: ignore[union-attr]
        # every run's shard is the one Dagster itself creates (schema, alembic revision, WAL)
        with ui.event_log_storage.run_connection("reference"):
            pass
    shards = home / "history" / "runs"
    reference = _schema(shards / "reference.db")
    assert all(_schema(shards / f"{r.run_id}.db") == reference for r in runs)
    assert sorted(p.name for p in shards.iterdir() if p.name.startswith(".")) == []  # no copy left half-made


def test_another_configured_storage_is_used_as_it_is(tmp_path: Path) -> None:
    home = _home(tmp_path, INSTANCE_YAML + (
        "event_log_storage:\n  module: dagster._core.storage.event_log\n"
        "  class: ConsolidatedSqliteEventLogStorage\n  config:\n    base_dir: {}\n").format(tmp_path / "events"))
    with open_instance(home) as inst:
        assert type(inst.event_log_storage).__name__ == "ConsolidatedSqliteEventLogStorage"
