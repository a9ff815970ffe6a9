"""PolyTrace analyses: the pure library (readers, warehouse, views, fits, exports). Never imports dagster."""

from __future__ import annotations

__version__ = "0.1.0"
