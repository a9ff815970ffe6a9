"""A spec variable's fitted-distribution object, by its ``kind`` -- what the sampler and the
exports turn a spec entry's ``variables`` into (anything with ``ppf(u)``)."""

from __future__ import annotations

from typing import Any

from analyses.fit.continuous import ContinuousFit
from analyses.fit.discrete import CategoricalFit, DiscreteFit
from analyses.fit.empirical import EmpiricalTailFit
from analyses.fit.tails import BodyTailFit

Marginal = ContinuousFit | DiscreteFit | CategoricalFit | BodyTailFit | EmpiricalTailFit
DEFAULT_FAILURE_STATUS = "error"  # a failed tool call's status when the fit recorded none


def marginal(d: dict[str, Any]) -> Marginal:
    """The fitted-distribution object for a spec variable (anything with ``ppf(u)``)."""
    kind = d["kind"]
    if kind == "continuous":
        return ContinuousFit.from_dict(d)
    if kind == "discrete":
        return DiscreteFit.from_dict(d)
    if kind == "categorical":
        return CategoricalFit.from_dict(d)
    if kind == "body_tail":
        return BodyTailFit.from_dict(d)
    if kind == "empirical_tail":
        return EmpiricalTailFit.from_dict(d)
    raise ValueError(f"unknown variable kind {kind!r}")
