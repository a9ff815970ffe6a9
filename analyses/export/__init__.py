"""Exports: the versioned PolyTrace spec, the seeded sampler that regenerates workloads from it,
and one module per output format under :mod:`analyses.export.formats`, found by the registry in
:mod:`analyses.export.registry`. Adding a format is one module there plus its test."""
