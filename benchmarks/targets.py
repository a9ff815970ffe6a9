"""Every issue-14 performance target ``make bench`` measures, declared once.

A target compares one measured number (a ratio, seconds, MB, fit units) with a limit, in one
direction; ``bench_all.py`` fills in the numbers and prints the table. A target the run did not
measure is listed as ``not measured`` rather than left out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    key: str
    what: str
    limit: float
    higher_is_better: bool
    unit: str  # how the value reads: "x" (ratio), "s", "ms", "MB", "units"

    def verdict(self, value: float | None) -> str:
        if value is None:
            return "not measured"
        ok = value >= self.limit if self.higher_is_better else value <= self.limit
        return "PASS" if ok else "MISS"

    def limit_text(self) -> str:
        return f"{'>=' if self.higher_is_better else '<='} {self.limit:g} {self.unit}".strip()


TARGETS: tuple[Target, ...] = (
    Target("ingest_vs_floor", "verl console log: whole ingest speed / DuckDB line-read floor", 0.15, True, "x"),
    Target("reader_vs_floor", "verl console log: reader alone speed / DuckDB line-read floor", 0.5, True, "x"),
    Target("ingest_rss_mb", "verl console log: peak RSS of the whole ingest (largest input)", 1024, False, "MB"),
    Target("ingest_scaling_4x", "verl console log: ingest time(4x input) / time(1x)", 4.4, False, "x"),
    Target("v2_vs_read_json", "PolyTrace v2 multi-turn JSONL: reader speed / DuckDB typed read_json", 0.5, True, "x"),
    Target("v2_small_file_ms", "PolyTrace v2 multi-turn JSONL: one real-size (~10 KB) step file", 5, False, "ms"),
    Target("catalog_open_s", "catalog connect() + one count with many part files", 0.5, False, "s"),
    Target("views_vs_sql", "views at scale / the same aggregate by hand on read_parquet", 2, False, "x"),
    Target("report_at_scale_s", "polytrace report over the views' warehouse", 60, False, "s"),
    Target("fit_10m_s", "fit 10 M samples per variable, every candidate (slowest variable)", 30, False, "s"),
    Target("fidelity_units", "polytrace fidelity --all over the real runs", 300, False, "units"),
    Target("incremental_vs_one_run", "refresh after adding one run to N fitted runs / one run's fit and score", 2, False,
           "x"),
    Target("demo_cross_run_units", "the demo's cross-run Dagster job (sample logs, 5 runs)", 40, False, "units"),
    Target("demo_s", "python -m pipelines.demo (make demo once installed), fresh warehouse and instance", 60, False,
           "s"),
)
BY_KEY = {t.key: t for t in TARGETS}
