"""Fitted workload models: marginal distributions, dependence, drift, the PolyTrace spec,
the seeded sampler, exporters to other tools' formats, and the fidelity check.

Everything here works on numpy arrays and Polars frames with the warehouse schema
(:mod:`analyses.schema`); :mod:`analyses.fit.model` is the only module that reads the warehouse.
"""
