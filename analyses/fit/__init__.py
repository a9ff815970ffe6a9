"""Fitted workload models, in the order a reader meets them:

1. data -- :mod:`~analyses.fit.data` reads a run's frames from the warehouse (the only module
   here that does).
2. models -- marginals (:mod:`~analyses.fit.empirical`: the generator's body + censored tail;
   :mod:`~analyses.fit.continuous` and :mod:`~analyses.fit.lnmix`: parametric families;
   :mod:`~analyses.fit.tails`, :mod:`~analyses.fit.discrete`), dependence
   (:mod:`~analyses.fit.joint`), the step-to-step level (:mod:`~analyses.fit.drift`), assembled
   into a workload by :mod:`~analyses.fit.workload`.
3. selection -- :mod:`~analyses.fit.select` chooses the generator's options by rolling origin
   inside the fitted steps; :mod:`~analyses.fit.runs` fits a warehouse's runs into one spec.
4. sampling -- :mod:`analyses.fit.sampler` regenerates workloads from a spec entry (one seed
   as frames, many seeds as arrays); :mod:`~analyses.fit.baseline` is PolyTrace's own histogram
   resampler for comparison.
5. scoring -- :mod:`~analyses.fit.scores` (per-step statistics, CRPS, coverage, KS; imported by
   selection and fidelity alike), :mod:`~analyses.fit.rolling` (the rolling-origin protocol both
   use), :mod:`~analyses.fit.fidelity` and :mod:`~analyses.fit.fidelity_table` (the criterion over
   a run and its table), :mod:`~analyses.fit.stepmodel` (step time from the workload).
6. spec and exports live in :mod:`analyses.export`.

Everything here works on numpy arrays and Polars frames with the warehouse schema.
"""
