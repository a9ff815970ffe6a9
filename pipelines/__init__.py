"""The Dagster code location (``dagster dev -m pipelines.definitions``): the only package that
imports dagster. Assets call plain functions from ``analyses`` and attach metadata and checks.

Note on type hints: Dagster 1.13 compares the ``context`` parameter's annotation object with its
context classes, and ``from __future__ import annotations`` turns that annotation into a string
it rejects; so ``context`` parameters are left unannotated. Resource parameters are annotated.
"""
