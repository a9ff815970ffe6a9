"""Fitted workload models, in the order a reader meets them (each module imports only from the
ones before it; nothing here imports :mod:`analyses.export` but the spec document):

1. data -- :mod:`~analyses.fit.data` reads a run's frames from the warehouse (the only module here
   that does) and says which samples and steps count (training samples, full steps, the batch's
   shape, a short run's prompt-group pseudo-steps); :mod:`~analyses.fit.summaries` the per-step
   summaries a run logged instead of samples (or computes them from samples, as verl prints them).
2. models -- marginals (:mod:`~analyses.fit.empirical`: the generator's body + censored tail;
   :mod:`~analyses.fit.continuous` and :mod:`~analyses.fit.lnmix`: parametric families;
   :mod:`~analyses.fit.tails`, :mod:`~analyses.fit.discrete`; :mod:`~analyses.fit.stepshape`: the
   shared step shape a fit from summaries estimates), dependence (:mod:`~analyses.fit.joint`), the
   step-to-step level (:mod:`~analyses.fit.drift`), and :mod:`~analyses.fit.marginals` (a spec
   variable's object by its kind).
3. sampling -- :mod:`~analyses.fit.sampler` regenerates workloads from a spec entry (one seed as
   frames, many seeds as arrays): what the scores score and every export writes.
4. sources -- two ways to a spec entry, feeding the same models: :mod:`~analyses.fit.workload` from
   per-sample records, :mod:`~analyses.fit.summary_fit` from per-step summaries (summaries -> per-step
   distributions -> the same drift model, generator marginal and copula).
5. scoring -- :mod:`~analyses.fit.scores` (per-step statistics, CRPS, coverage, KS, and their pooling
   over origins), :mod:`~analyses.fit.rolling` (the rolling-origin protocol: origins, the real steps --
   from samples, or from a run's logged summaries -- and a generator's draws scored against them),
   :mod:`~analyses.fit.baseline` (PolyTrace's own histogram resampler, for comparison).
6. choice and criterion -- :mod:`~analyses.fit.select` chooses a source's options by rolling origin
   inside the fitted steps (one protocol for both sources); :mod:`~analyses.fit.fidelity` and
   :mod:`~analyses.fit.fidelity_table` score a run (the per-sample fit, the histogram, and with
   ``from_summaries`` the fit from summaries alone, on the same origins and seeds);
   :mod:`~analyses.fit.runs` fits a warehouse's runs into one spec; :mod:`~analyses.fit.cache` keeps
   per-run results; :mod:`~analyses.fit.stepmodel` (step time from the workload).

The spec document and the output formats live in :mod:`analyses.export`, which imports the sampler
from here. ``tests/test_fit_room.py`` holds the layout and measures the walk.

Everything here works on numpy arrays and Polars frames with the warehouse schema.
"""
