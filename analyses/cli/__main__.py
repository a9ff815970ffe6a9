"""``python -m analyses.cli``: the same as the ``polytrace`` script."""

from __future__ import annotations

import os

os.environ.setdefault("POLARS_MAX_THREADS", "2")  # before polars is imported: it reads this once

from analyses.cli import console  # noqa: E402

console()
