"""Shared helpers of the telemetry reader tests."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from analyses.manifest import RunManifest
from analyses.readers import detect
from analyses.readers.base import FileContext

FIX = Path(__file__).parent / "fixtures" / "telemetry"


def run(path: Path, manifest: RunManifest | None = None, rel: str | None = None, table: str = "gpu_samples",
        run_files: frozenset[Path] = frozenset()):
    """Read ``path`` with the reader sniffing picks; totals, samples (table ``table``), rejects.
    ``run_files``: the other files of the same run (default: none, as for a file ingested alone)."""
    reader = detect(path)
    assert reader is not None, f"no reader for {path.name}"
    chunks = list(reader.read(FileContext("r", path, rel or path.name, manifest or RunManifest(), run_files)))
    totals = {
        k: sum(getattr(c, k) for c in chunks) for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")
    }
    assert totals["lines"] == totals["rows_ok"] + totals["rows_rejected"] + totals["rows_skipped"]
    frames = [c.tables[table] for c in chunks if table in c.tables]
    samples = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    rej = [c.rejects for c in chunks if c.rejects is not None]
    rejects = (
        pl.concat(rej)
        if rej
        else pl.DataFrame(schema={"line_no": pl.Int64, "reason": pl.String, "raw": pl.String})
    )
    assert rejects.height == totals["rows_rejected"]
    return reader.name, totals, samples, rejects


def value(samples: pl.DataFrame, gpu: str, metric: str, ts: str) -> float:
    t = datetime.fromisoformat(ts).replace(tzinfo=UTC)
    hit = samples.filter((pl.col("gpu") == gpu) & (pl.col("metric") == metric) & (pl.col("ts") == t))
    assert hit.height == 1, hit
    return hit["value"][0]
