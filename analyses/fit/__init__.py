"""Fitted workload models, in the order a reader meets them:

1. data -- :mod:`~analyses.fit.data` reads a run's frames from the warehouse (the only module
   here that does).
2. models -- marginals (:mod:`~analyses.fit.continuous`, :mod:`~analyses.fit.lnmix`,
   :mod:`~analyses.fit.empirical`, :mod:`~analyses.fit.tails`, :mod:`~analyses.fit.discrete`),
   dependence (:mod:`~analyses.fit.joint`), drift (:mod:`~analyses.fit.drift`), assembled into a
   workload by :mod:`~analyses.fit.workload`.
3. selection -- :mod:`~analyses.fit.select` chooses models by rolling-origin validation inside
   the fitted steps; :mod:`~analyses.fit.runs` fits a warehouse's runs into one spec.
4. sampling -- :mod:`analyses.export.sampler` regenerates workloads from a spec entry;
   :mod:`~analyses.fit.baseline` is PolyTrace's own histogram resampler for comparison.
5. scoring -- :mod:`~analyses.fit.scores` (per-step statistics, shared by selection and
   fidelity), :mod:`~analyses.fit.score_refs`, :mod:`~analyses.fit.fidelity`,
   :mod:`~analyses.fit.stepmodel`.
6. spec and exports live in :mod:`analyses.export`.

Everything here works on numpy arrays and Polars frames with the warehouse schema.
"""
