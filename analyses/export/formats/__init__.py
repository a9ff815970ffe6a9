"""One module per export format; each defines ``FORMAT`` (see :mod:`analyses.export.registry`)."""
