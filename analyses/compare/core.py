"""Compare two runs (or two step ranges): every quantity both sides have, tested against each
side's own step-to-step variation (:mod:`analyses.compare.stats`), ranked biggest credible first.

What is compared, on the steps both runs have (:mod:`analyses.compare.sides`):

- per-step series from the views (:data:`analyses.compare.quantities.SERIES`: stage times, the
  stages' shares, throughput, training health, GPU utilization per step, filter waste, and the
  max/mean of every ``rank_imbalance`` phase): each side's median (or mean) over its steps;
- per-sample distributions (response and prompt length, turns, tool latency): mean, p50, p90,
  p99 and the KS and CRPS distances between the two sides' pooled samples;
- the health alerts each side raises on those steps, the run facts (``runs``) and the config
  (``run_config``): facts, stated as they are (``credible`` true), never tested.

The ranking: credible differences first (measured ones and workload facts by size, see
:func:`analyses.compare.text.size`; then config keys that do not shape the workload: names, paths),
then the rest by size. ``not_compared`` says what one side lacks, or why a quantity was left out.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyses.compare import stats as S
from analyses.compare import text as T
from analyses.compare.collect import RunData, load_run, over_steps, restrict
from analyses.compare.quantities import (
    DIST_STATS,
    GPU_TIME,
    RUN_FACTS,
    SERIES,
    VARIABLES,
    WORKLOAD_KEY_PATTERNS,
    Quantity,
    Variable,
    imbalance_quantity,
)
from analyses.compare.sides import Alignment, Side, align

TEST_STATEMENT = (
    "A difference is credible when it exceeds the step-to-step variation within each side. Units are "
    "training steps (samples within a step are not independent; with fewer than {min_units} steps per-sample "
    "variables fall back to prompt groups). Each side's statistic is resampled by a moving-block bootstrap over "
    "its steps in order ({n_boot} replicates, blocks of round(n^(1/3)) steps); a quantity's p-value is twice the "
    "smaller share of bootstrap replicates of b - a on either side of 0; a distribution's (KS, CRPS) is the share of "
    "distances between two resamples of the same side that reach the observed one, the larger of the two sides'. "
    "p-values are Holm-adjusted over the comparison; credible when the adjusted p < {alpha}. Assumption: within "
    "a side, steps are stationary apart from dependence shorter than a block (a trend widens the side's own "
    "spread, which makes the test more cautious). Alerts, run facts and config differences are facts, not tested."
)


@dataclass
class Difference:
    """One compared quantity. ``a``/``b`` are the sides' values; ``credible`` says whether the
    difference is beyond both sides' step-to-step spread (facts: true when they differ)."""

    quantity: str
    a: Any
    b: Any
    credible: bool
    text: str = ""
    kind: str = "measured"  # measured | distribution | alert | run_fact | config
    label: str = ""
    unit: str = ""
    scale: str = "ratio"
    size: float = 0.0
    change: str | None = None
    ratio: float | None = None
    a_interval: list[float] | None = None
    b_interval: list[float] | None = None
    diff_interval: list[float] | None = None
    p: float | None = None
    p_adjusted: float | None = None
    n_a: int | None = None  # units (steps, prompt groups, time buckets) behind each side's value
    n_b: int | None = None
    units: str | None = None
    verdict: str = ""  # credible | within the spread | not judged: ... | fact
    steps: list[dict[str, Any]] | None = None  # the steps that drive it
    extra: dict[str, Any] = field(default_factory=dict)
    tier: int = 0  # 0: ranks by size among the credible; 1: after them (config names, paths)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("tier")
        extra = d.pop("extra")
        d.update(extra)
        always = ("quantity", "a", "b", "credible", "text")  # the fields, null when a side has none
        return {k: _clean(v) for k, v in d.items() if k in always or (v is not None and v != {} and v != "")}


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if not math.isfinite(v) else float(f"{v:.6g}")
    if isinstance(v, list):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return v


@dataclass
class Comparison:
    a: Side
    b: Side
    alignment: Alignment
    differences: list[Difference]
    not_compared: list[dict[str, str]]
    notes: list[str]
    test: str

    @property
    def credible(self) -> list[Difference]:
        return [d for d in self.differences if d.credible]

    def to_dict(self) -> dict[str, Any]:
        def side(s: Side, steps: tuple[int, ...]) -> dict[str, Any]:
            out: dict[str, Any] = {"run_id": s.run_id, "label": s.label, "steps": len(steps)}
            if steps:
                out["first_step"], out["last_step"] = min(steps), max(steps)
            return out

        return {
            "a": side(self.a, self.alignment.steps_a),
            "b": side(self.b, self.alignment.steps_b),
            "aligned": self.alignment.note,
            "paired": self.alignment.paired,
            "test": self.test,
            "credible": len(self.credible),
            "differences": [d.to_dict() for d in self.differences],
            "not_compared": self.not_compared,
            "notes": self.notes,
        }


# ----------------------------------------------------------------------------- measured series


def _drivers(q: Quantity, va: pl.DataFrame, vb: pl.DataFrame, paired: bool, sign: float) -> list[dict[str, Any]]:
    """The steps that drive a difference: paired, those with the largest per-step difference in its
    direction; unpaired, the larger side's largest values."""
    if paired:
        j = va.join(vb, on="step", suffix="_b").with_columns(d=(pl.col("value_b") - pl.col("value")) * sign)
        top = j.filter(pl.col("d") > 0).sort("d", descending=True).head(3)
        return [{"step": s, "a": a, "b": b} for s, a, b in top.select("step", "value", "value_b").iter_rows()]
    side, key = (vb, "b") if sign > 0 else (va, "a")
    top = side.sort("value", descending=True).head(3)
    return [{"step": s, key: v} for s, v in top.iter_rows()]


def _series_difference(q: Quantity, va: pl.DataFrame, vb: pl.DataFrame, gen: np.random.Generator, n_boot: int,
                       paired: bool, units: str = "steps") -> Difference:
    stat = S.STATISTICS[q.stat]
    xa, xb = va["value"].to_numpy().astype(float), vb["value"].to_numpy().astype(float)
    a, b = float(stat(xa)), float(stat(xb))
    d = Difference(q.name, a, b, False, kind="measured", label=f"{q.label} ({q.stat})", unit=q.unit, scale=q.scale,
                   n_a=xa.size, n_b=xb.size, units=units)
    if min(xa.size, xb.size) < S.MIN_UNITS:
        d.verdict = f"not judged: {_few(xa.size, xb.size, units)}"
        return d
    ra, rb = S.series_replicates(xa, stat, gen, n_boot), S.series_replicates(xb, stat, gen, n_boot)
    _fill_boot(d, S.boot_test(a, b, ra, rb), ra, rb)
    if q.stat == "median" and units == "steps" and a != b:
        d.steps = _drivers(q, va, vb, paired, 1.0 if b > a else -1.0)
    return d


def _fill_boot(d: Difference, bt: S.Boot, ra: np.ndarray, rb: np.ndarray) -> None:
    d.a_interval, d.b_interval, d.diff_interval = [bt.a_lo, bt.a_hi], [bt.b_lo, bt.b_hi], [bt.diff_lo, bt.diff_hi]
    d.p = bt.p
    if d.scale in ("ratio",) and bt.a > 0 and bt.b > 0:
        d.ratio = bt.b / bt.a
        with np.errstate(divide="ignore", invalid="ignore"):
            r = rb / ra
        lo, hi = S.interval(r[np.isfinite(r)]) if np.isfinite(r).any() else (float("nan"), float("nan"))
        d.extra["ratio_interval"] = [lo, hi]


def _few(na: int, nb: int, units: str) -> str:
    short = [f"{s} has {n} {units}" for s, n in (("A", na), ("B", nb)) if n < S.MIN_UNITS]
    return "; ".join(short) + f" (at least {S.MIN_UNITS} needed to judge the variation)"


# ----------------------------------------------------------------------------- distributions


def _units(fa: pl.DataFrame, fb: pl.DataFrame) -> tuple[str, str]:
    """The resampling unit of a per-sample variable: steps, else prompt groups (when both sides
    have fewer than MIN_UNITS steps but group ids), else steps anyway (then not judged)."""
    if min(fa["step"].n_unique(), fb["step"].n_unique()) >= S.MIN_UNITS:
        return "step", "steps"
    if fa["grouped"].all() and fb["grouped"].all():
        return "group", "prompt groups"
    return "step", "steps"


def _unit_index(f: pl.DataFrame, by: str) -> np.ndarray:
    """Each sample's unit position 0..n-1, units in step order (then first appearance)."""
    key = ["step"] if by == "step" else ["step", "unit"]
    order = f.select(key).unique(maintain_order=True).sort("step", maintain_order=True).with_row_index("_u")
    return f.join(order, on=key, how="left")["_u"].to_numpy().astype(np.int64)


def _distribution(v: Variable, fa: pl.DataFrame, fb: pl.DataFrame, gen: np.random.Generator,
                  n_boot: int) -> list[Difference]:
    by, units = _units(fa, fb)
    ua, ub = _unit_index(fa, by), _unit_index(fb, by)
    xa, xb = fa["value"].to_numpy().astype(float), fb["value"].to_numpy().astype(float)
    ha, hb = S.unit_histograms(ua, xa, ub, xb)
    judged = min(ha.n_units, hb.n_units) >= S.MIN_UNITS
    obs_a, obs_b = S.hist_stats(ha.values, ha.pooled(), DIST_STATS), S.hist_stats(hb.values, hb.pooled(), DIST_STATS)
    if judged:
        wa = S.index_weights(S.block_indices(ha.n_units, n_boot, gen), ha.n_units)
        wb = S.index_weights(S.block_indices(hb.n_units, n_boot, gen), hb.n_units)
        rep_a, rep_b = _pooled_stats(ha, wa), _pooled_stats(hb, wb)
    out = []
    for name, _q in DIST_STATS:
        a, b = float(obs_a[name][0]), float(obs_b[name][0])
        d = Difference(f"{v.key}.{name}", a, b, False, kind="measured", label=f"{v.label} {name}", unit=v.unit,
                       n_a=ha.n_units, n_b=hb.n_units, units=units, extra={"samples_a": xa.size, "samples_b": xb.size})
        if judged:
            _fill_boot(d, S.boot_test(a, b, rep_a[name], rep_b[name]), rep_a[name], rep_b[name])
        else:
            d.verdict = f"not judged: {_few(ha.n_units, hb.n_units, units)}"
        out.append(d)
    from analyses.fit.scores import crps_distance, ks_2samp

    ks, crps = ks_2samp(xa, xb), crps_distance(xa, xb)
    d = Difference(f"{v.key}.distribution", xa.size, xb.size, False, kind="distribution",
                   label=f"{v.label} distribution", unit="samples", scale="share", size=ks, n_a=ha.n_units,
                   n_b=hb.n_units, units=units, extra={"ks": ks, "crps": crps, "crps_unit": v.unit})
    if judged:
        n_null = max(200, n_boot // 2)
        ka, ca = S.within_side_distances(ha, gen, n_null)
        kb, cb = S.within_side_distances(hb, gen, n_null)
        d.p = max(S.exceed_share(ka, ks), S.exceed_share(kb, ks))
        d.extra["crps_p"] = max(S.exceed_share(ca, crps), S.exceed_share(cb, crps))
        d.extra["ks_within_p95"] = [float(np.quantile(ka, 0.95)), float(np.quantile(kb, 0.95))]
    else:
        d.verdict = f"not judged: {_few(ha.n_units, hb.n_units, units)}"
    out.append(d)
    return out


def _pooled_stats(h: S.UnitHistogram, w: np.ndarray) -> dict[str, np.ndarray]:
    """:data:`DIST_STATS` of every resample (``w``: unit weights), pooled a chunk of rows at a time."""
    step = S.chunk_rows(h.values.size)
    parts = [S.hist_stats(h.values, h.pooled(w[i:i + step]), DIST_STATS) for i in range(0, w.shape[0], step)]
    return {name: np.concatenate([p[name] for p in parts]) for name, _q in DIST_STATS}


# ----------------------------------------------------------------------------- facts


def _alerts(alerts_a: pl.DataFrame, alerts_b: pl.DataFrame, a: RunData, b: RunData,
            not_compared: list[dict[str, str]]) -> list[Difference]:
    out = []
    kinds = sorted(set(alerts_a["kind"].to_list()) | set(alerts_b["kind"].to_list()))
    for kind in kinds:
        ra, rb = alerts_a.filter(pl.col("kind") == kind), alerts_b.filter(pl.col("kind") == kind)
        if ra.height and rb.height:
            continue
        raised, other, who, whom = (ra, b, "A", "B") if ra.height else (rb, a, "B", "A")
        metric = raised["metric"][0]
        col = _health_key(metric)
        if col is not None and other.values(col).height == 0 and metric not in (
                "throughput_tokens_per_s", "step_time_s"):
            not_compared.append({"quantity": f"alert.{kind}", "reason": f"{whom} has no {metric} to raise it on"})
            continue
        span = f"steps {raised['first_step'][0]}-{raised['last_step'][0]}"
        d = Difference(f"alert.{kind}", span if who == "A" else "none", span if who == "B" else "none", True,
                       kind="alert", label=f"health alert {kind}", scale="fact", size=1.0, verdict="fact",
                       extra={"detail": raised["detail"][0]})
        d.text = f"{who} raises the health alert {kind} ({span}: {raised['detail'][0]}); {whom} does not"
        out.append(d)
    return out


def _health_key(metric: str) -> str | None:
    for q in SERIES:
        if q.source == "training_health" and q.column == metric:
            return q.key
    return None


def _fact_value(v: Any) -> Any:
    return v if not isinstance(v, float) or not v.is_integer() else int(v)


def _numeric(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _run_facts(a: RunData, b: RunData, config: list[Difference], not_compared: list[dict[str, str]]) -> list[Difference]:
    out = []
    for col, label, unit, source_col in RUN_FACTS:
        va, vb = _fact_value(a.facts.get(col)), _fact_value(b.facts.get(col))
        if va is None and vb is None:
            continue
        if va is None or vb is None:
            not_compared.append({"quantity": f"run.{col}", "reason": f"unknown for {'A' if va is None else 'B'}"})
            continue
        if va == vb:
            continue
        sa, sb = (a.facts.get(source_col), b.facts.get(source_col)) if source_col else (None, None)
        # read from the config dumps: a config difference of the same values says it, with its key
        if any((c.a, c.b) == (va, vb) for c in config):
            continue
        na, nb = _numeric(va), _numeric(vb)
        d = Difference(f"run.{col}", va, vb, True, kind="run_fact", label=label, unit=unit, scale="fact",
                       size=T.size(na, nb, "ratio") if na is not None and nb is not None else 1.0, verdict="fact")
        src = f" (A: {sa}, B: {sb})" if source_col else ""
        if na is not None and nb is not None:
            d.change = T.change(na, nb, "ratio")
            d.text = f"{label} {d.change} ({T.number(na, unit)} → {T.number(nb, unit)}){src}"
        else:
            d.text = f"{label}: {va} → {vb}{src}"
        out.append(d)
    return out


_WORKLOAD = re.compile("|".join(WORKLOAD_KEY_PATTERNS))


def _parse(v: str) -> Any:
    import json

    try:
        return json.loads(v)
    except ValueError:
        return v


def _config(a: RunData, b: RunData, notes: list[str], not_compared: list[dict[str, str]]) -> list[Difference]:
    if not a.config and not b.config:
        return []
    if not a.config or not b.config:
        who = "A" if not a.config else "B"
        not_compared.append({"quantity": "config", "reason": f"{who}'s logs state no config (no verl config dump "
                                                             "or launch command)"})
        return []
    out = []
    only = {"A": sorted(set(a.config) - set(b.config)), "B": sorted(set(b.config) - set(a.config))}
    for key in sorted(set(a.config) | set(b.config)):
        va, vb = a.config.get(key), b.config.get(key)
        workload = bool(_WORKLOAD.search(key))
        if va is not None and vb is not None and va[0] == vb[0]:
            continue
        if (va is None or vb is None) and not workload:
            continue
        pa, pb = (_parse(va[0]) if va else None), (_parse(vb[0]) if vb else None)
        na, nb = _numeric(pa), _numeric(pb)
        size = T.size(na, nb, "ratio") if na is not None and nb is not None else (1.0 if workload else 0.0)
        d = Difference(f"config.{key}", pa, pb, True, kind="config", label=key, scale="fact", size=size,
                       verdict="fact", tier=0 if workload else 1,
                       extra={"source_a": va[1] if va else None, "source_b": vb[1] if vb else None})
        if va is None or vb is None:
            d.text = f"config {key} only in {'B' if va is None else 'A'} ({pb if va is None else pa})"
        elif na is not None and nb is not None:
            d.change = T.change(na, nb, "ratio")
            d.text = f"config {key}: {T.number(na)} → {T.number(nb)} ({d.change})"
        else:
            d.text = f"config {key}: {pa} → {pb}"
        out.append(d)
    for who, keys in only.items():
        rest = [k for k in keys if not _WORKLOAD.search(k)]
        if rest:
            notes.append(f"config: {len(rest)} key(s) only in {who} (e.g. {', '.join(rest[:5])})")
    return out


# ----------------------------------------------------------------------------- text and ranking


def _describe(d: Difference, same_run: bool) -> None:
    if d.kind in ("alert", "run_fact", "config"):
        return
    if d.kind == "distribution":
        ks, crps = d.extra["ks"], d.extra["crps"]
        head = (f"{d.label}: KS {ks:.3g}, CRPS distance {T.number(crps, d.extra['crps_unit'])} "
                f"({d.extra['samples_a']:,} vs {d.extra['samples_b']:,} samples)") if "samples_a" in d.extra else (
                f"{d.label}: KS {ks:.3g}, CRPS distance {T.number(crps, d.extra['crps_unit'])}")
    else:
        d.change = T.change(d.a, d.b, d.scale) if math.isfinite(d.a) and math.isfinite(d.b) else None
        d.size = T.size(d.a, d.b, d.scale)
        head = f"{d.label} {d.change} ({T.number(d.a, d.unit, d.scale)} → {T.number(d.b, d.unit, d.scale)})"
    if d.verdict.startswith("not judged"):
        d.text = f"{head}; {d.verdict}"
        return
    spread = "both ranges'" if same_run else "both runs'"
    if d.credible:
        d.verdict = "credible"
        d.text = f"{head}, beyond {spread} step-to-step spread ({T.p_text(d.p_adjusted)})"
        if d.steps:
            d.text += f"; most in step(s) {T.steps_text([s['step'] for s in d.steps])}"
    else:
        d.verdict = "within the spread"
        d.text = f"{head}, within the step-to-step spread ({T.p_text(d.p_adjusted)})"
    if d.units and d.units != "steps":
        d.text += f" [units: {d.units}]"


def rank(diffs: list[Difference]) -> list[Difference]:
    """Credible first (by tier, then size), then the rest by size; ties by name."""
    return sorted(diffs, key=lambda d: (not d.credible, d.tier, -d.size, d.quantity))


# ----------------------------------------------------------------------------- the comparison


def _pair(va: pl.DataFrame, vb: pl.DataFrame, same_run: bool) -> tuple[pl.DataFrame, pl.DataFrame, bool]:
    """One quantity's values on the steps both runs have it (paired), else on every step of each
    (two step ranges of one run, or two runs that share no step for it)."""
    if same_run:
        return va, vb, False
    common = pl.Series(sorted(set(va["step"].to_list()) & set(vb["step"].to_list())), dtype=pl.Int64)
    if common.len() == 0:
        return va, vb, False
    keep = pl.col("step").is_in(common.implode())
    return va.filter(keep), vb.filter(keep), True


def compare_data(a: Side, b: Side, ra: RunData, rb: RunData, n_boot: int = S.N_BOOT, seed: int = S.SEED) -> Comparison:
    """Compare two loaded runs (:func:`analyses.compare.collect.load_run`): each quantity on the
    steps both sides have it (two runs), or on each side's own steps (two step ranges of one run)."""
    gen = S.rng(seed)
    same_run = a.run_id == b.run_id
    alignment = align(a, b, ra.steps, rb.steps)
    # each side's steps (its range): quantities pair their own steps from these
    sa = restrict(ra, tuple(s for s in ra.steps if a.holds(s)))
    sb = restrict(rb, tuple(s for s in rb.steps if b.holds(s)))
    # the steps of the alignment: alerts and telemetry over time
    (ga, alerts_a), (gb, alerts_b) = over_steps(ra, alignment.steps_a), over_steps(rb, alignment.steps_b)
    not_compared: list[dict[str, str]] = []
    notes = [f"compared on {alignment.note}; each quantity on the steps both sides have it"
             if alignment.paired else f"compared on {alignment.note}"]
    measured: list[Difference] = []
    unpaired: list[str] = []

    both_samples = {v.key for v in VARIABLES if v.key in sa.samples and v.key in sb.samples}
    if "turns" in both_samples and max(sa.samples["turns"]["value"].max(), sb.samples["turns"]["value"].max()) <= 1:
        both_samples.discard("turns")  # single-turn on both sides: nothing to compare
    keys = {q.key: q for q in SERIES}
    for k in sorted(set(sa.series["quantity"].unique()) | set(sb.series["quantity"].unique())):
        if k not in keys and k.startswith("imbalance."):
            _, phase, qty = k.split(".", 2)
            keys[k] = imbalance_quantity(phase, qty)
    absent = []
    for key, q in keys.items():
        va, vb = sa.values(key), sb.values(key)
        if va.height == 0 and vb.height == 0:
            absent.append(q.label)
            continue
        if va.height == 0 or vb.height == 0:
            not_compared.append({"quantity": q.name, "reason": f"only {'A' if va.height else 'B'} has {q.label}"})
            continue
        if q.sample_variable in both_samples:
            continue  # the per-sample distribution says it better
        va, vb, paired = _pair(va, vb, same_run)
        if not paired and not same_run:
            unpaired.append(q.name)
        measured.append(_series_difference(q, va, vb, gen, n_boot, paired))
    if "gpu.mean_util_pct" not in {d.quantity.rsplit(".", 1)[0] for d in measured}:
        if ga.height and gb.height:
            measured.append(_series_difference(GPU_TIME, ga, gb, gen, n_boot, False, units="time buckets"))
            notes.append("GPU utilization compared over time buckets (gpu_timeline): the telemetry is not aligned "
                         "to steps on both sides")
        elif ga.height or gb.height:
            not_compared.append({"quantity": "gpu utilization", "reason": f"only {'A' if ga.height else 'B'} has "
                                                                          "GPU telemetry"})
    for v in VARIABLES:
        if v.key in both_samples:
            fa, fb, paired = _pair(sa.samples[v.key], sb.samples[v.key], same_run)
            if not paired and not same_run:
                unpaired.append(f"{v.key} distribution")
            measured.extend(_distribution(v, fa, fb, gen, n_boot))
        elif v.key in sa.samples or v.key in sb.samples:
            if v.key == "turns":
                continue
            who = "A" if v.key in sa.samples else "B"
            not_compared.append({"quantity": f"{v.key} distribution",
                                 "reason": f"only {who} has per-sample {v.label} (the other logs per-step summaries "
                                           "at most)"})
    if unpaired:
        notes.append(f"no step in common, so every step of each run: {', '.join(unpaired)}")
    if absent:
        notes.append(f"neither side has: {', '.join(absent)}")

    judged = [d for d in measured if d.p is not None and not math.isnan(d.p)]
    if judged and 2 / (n_boot + 1) > S.ALPHA / len(judged):
        notes.append(f"{n_boot} bootstrap replicates cannot show a p-value below {2 / (n_boot + 1):.2g}, above Holm's "
                     f"first threshold for {len(judged)} tests ({S.ALPHA / len(judged):.2g}): use more replicates")
    for d, adj in zip(judged, S.holm([d.p for d in judged]), strict=True):  # type: ignore[misc]
        d.p_adjusted = adj
        d.credible = adj < S.ALPHA
    for d in measured:
        _describe(d, same_run)

    facts: list[Difference] = []
    facts.extend(_alerts(alerts_a, alerts_b, sa, sb, not_compared))
    if not same_run:
        config = _config(sa, sb, notes, not_compared)
        facts.extend(_run_facts(sa, sb, config, not_compared))
        facts.extend(config)
    test = TEST_STATEMENT.format(min_units=S.MIN_UNITS, n_boot=n_boot, alpha=S.ALPHA)
    return Comparison(a, b, alignment, rank(measured + facts), not_compared, notes, test)


def compare(con: duckdb.DuckDBPyConnection, a: Side, b: Side, n_boot: int = S.N_BOOT, seed: int = S.SEED) -> Comparison:
    """Compare ``a`` and ``b`` (runs or step ranges) in the catalog ``con``; KeyError names a
    run the warehouse does not have."""
    ra = load_run(con, a.run_id)
    rb = ra if b.run_id == a.run_id else load_run(con, b.run_id)
    return compare_data(a, b, ra, rb, n_boot=n_boot, seed=seed)
