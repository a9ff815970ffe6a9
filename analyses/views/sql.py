"""Shared SQL fragments and conventions of the characterization views.

Quantiles: every ``pNN`` column is DuckDB ``quantile_disc``, the inverse empirical CDF
(Hyndman–Fan type 1): the smallest observed value x with F̂(x) >= q, i.e. the
ceil(n·q)-th smallest observation. It is always an observed value (a token count stays an
integer), exact, never binned or interpolated. Fences for outliers use ``quantile_cont``
(linear interpolation, type 7), said where used.
"""

from __future__ import annotations

QUANTILE_DEFINITION = (
    "DuckDB quantile_disc: the ceil(n*q)-th smallest observation (inverse empirical CDF, "
    "Hyndman-Fan type 1); exact, an observed value, never interpolated"
)

TAIL_QS = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))


def disc_quantiles(col: str, qs: tuple[tuple[str, float], ...] = TAIL_QS) -> str:
    """``quantile_disc(col, q) AS name`` for each (name, q)."""
    return ", ".join(f"quantile_disc({col}, {q}) AS {name}" for name, q in qs)


def counted_quantiles(value: str, cum: str, total: str, qs: tuple[tuple[str, float], ...] = TAIL_QS) -> str:
    """The same quantiles as :func:`disc_quantiles`, from a histogram: rows of distinct ``value``
    with ``cum`` the running count in value order and ``total`` the group's count; as aggregates
    over those rows. quantile_disc holds every value of a group in memory
    and cannot spill (four of them per step over 51 M samples ran out of a 4 GB limit); a
    histogram is a hash aggregate, which spills, and small (a length takes a few thousand
    values). Exact: DuckDB's quantile_disc takes the ceil(double(n) * q)-th smallest, computed
    here the same way."""
    return ", ".join(f"min({value}) FILTER (WHERE {cum} >= ceil({total} * {q})) AS {name}" for name, q in qs)


def ratio(num: str, den: str) -> str:
    """num/den as DOUBLE, NULL when den is 0 or NULL (never inf)."""
    return f"CAST({num} AS DOUBLE) / NULLIF(CAST({den} AS DOUBLE), 0)"


def training_rows(table: str) -> str:
    """``table`` (turns or tool_calls) without the rows of validation samples, as a subquery.

    Those tables carry no ``validate`` flag of their own: a row belongs to validation when the
    sample it is keyed to (run_id, step, sample_id) is a ``validate`` sample.
    """
    return (
        f"(SELECT x.* FROM {table} x ANTI JOIN (SELECT run_id, step, sample_id FROM samples WHERE validate) v "
        "USING (run_id, step, sample_id))"
    )


def in_partial_step(alias: str) -> str:
    """True when the row ``alias`` (with run_id and step) belongs to a partial step
    (``training_health.partial``), false otherwise (also without a training_health row).

    An ``EXISTS``, not a join: DuckDB then always builds its hash table on training_health's few
    rows. As a join the optimizer picks the build side from its estimates, and its estimate of
    that view can exceed the rows it is joined to (at 51 M samples it put training_health's
    151,696 rows at 64 M): it then built on the samples, twice the time and a spill to disk.
    """
    return (f"EXISTS (SELECT 1 FROM training_health ph WHERE ph.partial AND ph.run_id = {alias}.run_id "
            f"AND ph.step = {alias}.step)")
