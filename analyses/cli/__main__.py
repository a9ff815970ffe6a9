"""``python -m analyses.cli``: the same as the ``polytrace`` script."""

from __future__ import annotations

import os

os.environ.setdefault("POLARS_MAX_THREADS", "2")  # before polars is imported: it reads this once
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see analyses.cli.quiet_blas_threads

from analyses.cli import console  # noqa: E402

console()
