"""Compare two runs, or two step ranges of one run: what changed, by how much, and whether it is
beyond each side's own step-to-step variation.

>>> from analyses.api import PolyTrace                               # doctest: +SKIP
>>> cmp = PolyTrace("warehouse").compare("run-a", "run-b:1-100")     # doctest: +SKIP
>>> [d.text for d in cmp.credible][:3]                               # doctest: +SKIP

Modules: :mod:`~analyses.compare.sides` (what is compared, on which steps),
:mod:`~analyses.compare.quantities` (every quantity, declared once), :mod:`~analyses.compare.collect`
(what is read from the catalog), :mod:`~analyses.compare.stats` (the test and its assumption),
:mod:`~analyses.compare.core` (the comparison and its ranking), :mod:`~analyses.compare.render`
(table, JSON, markdown, HTML).
"""

from __future__ import annotations

from analyses.compare.core import Comparison, Difference, compare, compare_data
from analyses.compare.sides import Side, parse_side

__all__ = ["Comparison", "Difference", "Side", "compare", "compare_data", "parse_side"]
