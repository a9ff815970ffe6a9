"""Per-worker iteration times (Alibaba PAI ``mini-batch-time``: ``,worker,gpu,time,batch_time_norm``)
into ``rank_times``: one row per worker x iteration, ``phase = 'iteration'``.

Mapping: ``step`` = the iteration index (column ``time``, ``iteration``, ``iter`` or ``step``),
``rank`` = ``worker`` (or ``rank``), ``seconds`` = ``batch_time_norm`` / ``batch_time``.

Units: the PAI trace *normalises* batch times to 0..1000 per job, so for a ``*_norm`` column
``seconds`` holds those normalised units, not seconds: ratios between ranks and steps (max/mean,
straggler share) are exact, absolute times are not. A ``batch_time`` column (not normalised)
is taken as seconds. The ``source`` column says which: ``worker_times:normalised_0_1000`` or
``worker_times``. The ``gpu`` column (the share of a GPU the worker held, 25 = a quarter) and the
unnamed pandas index column are not stored.

Rules: the header line is skipped; a line with the wrong field count, a non-integer iteration
or worker, or a non-numeric time is rejected; a second line for the same (worker, iteration) is
rejected as a duplicate (the first wins).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

from analyses.readers.base import Chunk, FileContext, ReaderBase, UnreadableFile, accounted_chunk
from analyses.readers.lines import line_frames

SOURCE = "worker_times"
_STEP = ("time", "iteration", "iter", "step")
_RANK = ("worker", "rank")
_VALUE = ("batch_time_norm", "batch_time", "iteration_time", "iter_time")


def layout(header: str) -> dict[str, int] | None:
    cols = [c.strip().strip('"').lower() for c in header.lstrip("\ufeff").split(",")]
    found: dict[str, int] = {}
    for role, names in (("step", _STEP), ("rank", _RANK), ("value", _VALUE)):
        idx = next((cols.index(n) for n in names if n in cols), None)
        if idx is None:
            return None
        found[role] = idx
    found["n"] = len(cols)
    found["norm"] = int(cols[found["value"]].endswith("_norm"))
    return found


class WorkerTimesReader(ReaderBase):
    name = SOURCE

    def sniff(self, head: str, path: Path) -> bool:
        first = head.split("\n", 1)[0].rstrip("\r")
        return layout(first) is not None and "," in first

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        lay: dict[str, int] | None = None
        seen = pl.DataFrame(schema={"step": pl.Int64, "rank": pl.Int64})
        for batch in line_frames(ctx.path):
            body, skipped = batch, 0
            if lay is None:
                lay = layout(batch["line"][0])
                if lay is None:
                    raise UnreadableFile("header names no worker / iteration / batch time columns")
                body, skipped = batch.slice(1), 1
            chunk, seen = self._chunk(batch, body, skipped, lay, seen)
            yield chunk

    def _chunk(
        self, batch: pl.DataFrame, body: pl.DataFrame, skipped: int, lay: dict[str, int], seen: pl.DataFrame
    ):
        blank = body.filter(pl.col("line").str.strip_chars() == "").height
        body = body.filter(pl.col("line").str.strip_chars() != "")
        p = pl.col("line").str.split(",")
        cell = lambda i: p.list.get(i, null_on_oob=True).str.strip_chars()  # noqa: E731
        d = body.with_columns(
            _n=p.list.len(),
            step=cell(lay["step"]).cast(pl.Int64, strict=False),
            rank=cell(lay["rank"]).cast(pl.Int64, strict=False),
            seconds=cell(lay["value"]).cast(pl.Float64, strict=False),
        )
        d = d.with_columns(
            _reason=pl.when(pl.col("_n") != lay["n"])
            .then(pl.format("expected {} fields, got {}", pl.lit(lay["n"]), pl.col("_n")))
            .when(pl.col("step").is_null())
            .then(pl.lit("iteration is not an integer"))
            .when(pl.col("rank").is_null())
            .then(pl.lit("worker is not an integer"))
            .when(pl.col("seconds").is_null() | pl.col("seconds").is_nan())
            .then(pl.lit("batch time is not a number"))
        )
        good = d.filter(pl.col("_reason").is_null())
        prior = good.join(seen, on=["step", "rank"], how="semi")["line_no"]
        good = good.with_columns(
            _reason=pl.when(
                ~pl.struct("step", "rank").is_first_distinct() | pl.col("line_no").is_in(prior.implode())
            ).then(pl.lit("duplicate (worker, iteration)"))
        )
        bad = pl.concat(
            [d.filter(pl.col("_reason").is_not_null()), good.filter(pl.col("_reason").is_not_null())]
        )
        good = good.filter(pl.col("_reason").is_null())
        seen = pl.concat([seen, good.select("step", "rank")])
        out = good.select(
            "step",
            "rank",
            "seconds",
            phase=pl.lit("iteration"),
            source=pl.lit(f"{SOURCE}:normalised_0_1000" if lay["norm"] else SOURCE),
        )
        n_skip = skipped + blank
        return accounted_chunk(batch.height, "rank_times", out, bad, n_skip, reason_col="_reason"), seen
