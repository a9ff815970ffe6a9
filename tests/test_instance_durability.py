"""The demo's instance writes: SQLite files under the instance's directory skip the disk sync,
every other SQLite file keeps SQLite's default."""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterInstance
from sqlalchemy import create_engine, text

from pipelines.demo import INSTANCE_YAML
from pipelines.instance_durability import relax_instance_durability

FULL, OFF = 2, 0


def _synchronous(db: Path) -> int:
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as con:
            return int(con.execute(text("PRAGMA synchronous")).scalar_one())
    finally:
        engine.dispose()


def test_only_the_instance_files_skip_the_sync(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (home / "storage").mkdir(parents=True)
    elsewhere.mkdir()
    assert _synchronous(home / "storage" / "before.db") == FULL
    relax_instance_durability(home)
    assert _synchronous(home / "storage" / "after.db") == OFF
    assert _synchronous(elsewhere / "other.db") == FULL
    # Dagster's own connections to the instance's storage go through the same hook, and its
    # events land as usual
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    with DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("runs", ["a"])
        assert instance.get_dynamic_partitions("runs") == ["a"]
        with instance.event_log_storage.index_connection() as con:
            assert con.execute(text("PRAGMA synchronous")).scalar_one() == OFF
