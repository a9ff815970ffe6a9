"""views_reading: a connection that needs a few views creates those and the views they read,
in creation order, and nothing else."""

from __future__ import annotations

from pathlib import Path

from analyses import catalog
from analyses.views import all_views, views_reading


def test_the_alerts_need_training_health_only() -> None:
    assert [v.name for v in views_reading(["health_alerts"])] == ["training_health", "health_alerts"]
    assert views_reading([]) == ()


def test_every_view_opens_with_only_the_views_it_reads(tmp_path: Path) -> None:
    # DuckDB binds a view when it is created: one that reads a view left out fails here
    for v in all_views():
        needed = views_reading([v.name])
        assert needed[-1] == v
        con = catalog.connect(tmp_path, needed)
        try:
            con.execute(f'SELECT * FROM "{v.name}" LIMIT 0')
        finally:
            con.close()
