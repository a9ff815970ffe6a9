"""``analyses.compare`` on constructed pairs with known differences (issue 27).

Each pair is two hand-made runs of 20 steps whose only difference is the one planted (a shifted
response-length distribution, a slower stage, an added alert); the comparison must rank it first
and find nothing else credible. The statistics underneath are checked against hand-computed answers
and against DuckDB / the views' own definitions.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from _views_util import open_wh, stage_run

from analyses.api import PolyTrace
from analyses.compare import Side, compare, parse_side
from analyses.compare import stats as S
from analyses.compare.sides import align
from analyses.fit.scores import crps_distance, crps_ensemble, ks_2samp

N_STEPS, PER_STEP = 20, 64
BOOT = 2000  # floor 2 / 2001 of a p-value, below Holm's first threshold for the ~30 tests here (N_BOOT: 4000)


def _samples(rng: np.random.Generator, scale: float = 1.0, mu: float = 5.5) -> pl.DataFrame:
    step = np.repeat(np.arange(1, N_STEPS + 1), PER_STEP)
    # a per-step level (steps differ from each other), then samples within the step
    level = rng.normal(0, 0.08, N_STEPS)[step - 1]
    resp = np.maximum(1, (rng.lognormal(mu + level, 0.6) * scale)).astype(int)
    group = np.arange(step.size) // 8
    return pl.DataFrame({
        "step": step, "sample_id": [f"s{i}" for i in range(step.size)], "group_id": [f"g{g}" for g in group],
        "dp_rank": (np.arange(step.size) // 32) % 2, "prompt_tokens": np.repeat(rng.integers(80, 600, step.size // 8), 8),
        "response_tokens": resp,
    })


def _steps(rng: np.random.Generator, gen_scale: float = 1.0) -> pl.DataFrame:
    s = np.arange(1, N_STEPS + 1)
    gen = rng.normal(60, 6, N_STEPS) * gen_scale
    reward = rng.normal(8, 1, N_STEPS)
    train = rng.normal(30, 3, N_STEPS)
    return pl.DataFrame({"step": s, "gen_time_s": gen, "reward_time_s": reward, "update_actor_time_s": train,
                         "step_time_s": gen + reward + train + 2.0, "step_time_source": "logged"})


def _clip(values: list[float]) -> pl.DataFrame:
    return pl.DataFrame({"step": np.arange(1, len(values) + 1), "metric": "response_length/clip_ratio",
                         "value": values, "is_validation": False})


@functools.cache
def _cmp(root: Path, a: str, b: str):  # noqa: ANN202 - one comparison per pair, shared by the tests
    con = open_wh(root)
    try:
        return compare(con, parse_side(a), parse_side(b), n_boot=BOOT)
    finally:
        con.close()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cmp") / "wh"
    base = dict(task="math", max_response_length=8192)
    clip = [0.01] * N_STEPS
    stage_run(root, "base", {"samples": _samples(np.random.default_rng(1)), "steps": _steps(np.random.default_rng(2)),
                             "step_metrics": _clip(clip)}, **base)
    # the same workload drawn again: nothing but noise differs
    stage_run(root, "again", {"samples": _samples(np.random.default_rng(11)), "steps": _steps(np.random.default_rng(12)),
                              "step_metrics": _clip(clip)}, **base)
    # responses 40 % longer, everything else as "again"
    stage_run(root, "longer", {"samples": _samples(np.random.default_rng(11), scale=1.4),
                               "steps": _steps(np.random.default_rng(12)), "step_metrics": _clip(clip)}, **base)
    # generation 50 % slower
    stage_run(root, "slow-gen", {"samples": _samples(np.random.default_rng(11)),
                                 "steps": _steps(np.random.default_rng(12), gen_scale=1.5),
                                 "step_metrics": _clip(clip)}, **base)
    # responses hit the cap from step 10 on: clip_ratio_high (>= 10 % for 3+ steps)
    stage_run(root, "clipping", {"samples": _samples(np.random.default_rng(11)), "steps": _steps(np.random.default_rng(12)),
                                 "step_metrics": _clip([0.01] * 9 + [0.3] * 11)}, **base)
    return root


def _credible(cmp) -> list[str]:  # noqa: ANN001
    return [d.quantity for d in cmp.differences if d.credible]


def test_same_workload_drawn_twice_has_no_credible_difference(pairs: Path) -> None:
    cmp = _cmp(pairs, "base", "again")
    assert _credible(cmp) == []
    assert cmp.alignment.paired and cmp.alignment.steps_a == tuple(range(1, N_STEPS + 1))
    # every quantity both have was compared and judged
    q = {d.quantity for d in cmp.differences}
    assert {"gen_time_s.median", "response_length.p99", "response_length.distribution", "prompt_length.p50",
            "truncation_share.mean", "stage.rollout_share.median"} <= q
    assert all(d.p_adjusted is not None for d in cmp.differences if d.kind in ("measured", "distribution"))


def test_shifted_length_distribution_ranks_first(pairs: Path) -> None:
    cmp = _cmp(pairs, "again", "longer")
    cred = _credible(cmp)
    lengths = {"response_length.mean", "response_length.p50", "response_length.p90", "response_length.p99",
               "response_length.distribution"}
    assert set(cred[:len(lengths)]) <= lengths and {"response_length.p50", "response_length.mean"} <= set(cred)
    assert all(q.startswith("response_length.") for q in cred), cred  # prompts, times: untouched
    p50 = next(d for d in cmp.differences if d.quantity == "response_length.p50")
    assert p50.ratio == pytest.approx(1.4, rel=0.03)
    assert "+4" in p50.text and "beyond both runs' step-to-step spread" in p50.text
    dist = next(d for d in cmp.differences if d.quantity == "response_length.distribution")
    assert dist.extra["ks"] > 0.15 and dist.extra["crps"] > 0


def test_slower_stage_ranks_first_and_names_its_steps(pairs: Path) -> None:
    cmp = _cmp(pairs, "again", "slow-gen")
    cred = _credible(cmp)
    assert cred[0] == "gen_time_s.median"
    # the step time and the rollout share follow from it; the other stages do not move
    assert set(cred) <= {"gen_time_s.median", "step_time_s.median", "stage.rollout_share.median",
                         "stage.training_share.median", "stage.inference_share.median", "stage.other_share.median"}
    assert "reward_time_s.median" not in cred and "update_actor_time_s.median" not in cred
    gen = cmp.differences[0]
    assert gen.ratio == pytest.approx(1.5, rel=1e-9)  # every step x1.5: the medians too
    assert gen.a_interval[0] <= gen.a <= gen.a_interval[1] and gen.extra["ratio_interval"][0] > 1.2
    # paired steps: the three with the largest b - a are the three slowest of "again" (x0.5 each)
    again = _steps(np.random.default_rng(12))
    slowest = again.sort("gen_time_s", descending=True)["step"].head(3).to_list()
    assert [s["step"] for s in gen.steps] == slowest
    assert f"most in step(s) {', '.join(map(str, slowest))}" in gen.text


def test_added_alert_is_a_credible_difference(pairs: Path) -> None:
    cmp = _cmp(pairs, "again", "clipping")
    alert = next(d for d in cmp.differences if d.quantity == "alert.clip_ratio_high")
    assert alert.credible and alert.kind == "alert" and (alert.a, alert.b) == ("none", "steps 10-20")
    assert alert.text.startswith("B raises the health alert clip_ratio_high (steps 10-20")
    assert cmp.differences[0].quantity == "alert.clip_ratio_high"
    # the mean truncation share moves by (9 x 0.01 + 11 x 0.3) / 20 - 0.01; within B it jumps from 1 % to
    # 30 % at step 10, a spread as large as the difference: the sustained alert is what says it
    trunc = next(d for d in cmp.differences if d.quantity == "truncation_share.mean")
    assert trunc.change == "+15.9 pts" and trunc.b == pytest.approx(0.1695)


def test_ranking_puts_every_credible_difference_before_the_rest(pairs: Path) -> None:
    for b in ("longer", "slow-gen", "clipping"):
        flags = [d.credible for d in _cmp(pairs, "again", b).differences]
        assert flags == sorted(flags, reverse=True)


def test_step_ranges_of_one_run(pairs: Path) -> None:
    cmp = _cmp(pairs, "clipping:1-9", "clipping:10-20")
    assert not cmp.alignment.paired
    assert (cmp.alignment.steps_a, cmp.alignment.steps_b) == (tuple(range(1, 10)), tuple(range(10, 21)))
    assert "truncation_share.mean" in _credible(cmp)
    assert not any(d.kind in ("config", "run_fact") for d in cmp.differences)  # one run: no fact differs
    doc = json.loads(json.dumps(cmp.to_dict()))
    assert doc["a"]["label"] == "clipping:1-9" and doc["b"]["steps"] == 11


def test_json_items_have_the_fields_the_issue_names(pairs: Path) -> None:
    doc = _cmp(pairs, "again", "longer").to_dict()
    assert doc["differences"] and all({"quantity", "a", "b", "credible", "text"} <= set(d) for d in doc["differences"])
    assert isinstance(doc["not_compared"], list) and "moving-block bootstrap" in doc["test"]


def test_what_one_side_lacks_is_said(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    stage_run(root, "samples-only", {"samples": _samples(np.random.default_rng(1))})
    stage_run(root, "timings-only", {"steps": _steps(np.random.default_rng(2))})
    cmp = _cmp(root, "samples-only", "timings-only")
    reasons = {n["quantity"]: n["reason"] for n in cmp.not_compared}
    assert reasons["gen_time_s.median"] == "only B has generation time"
    assert reasons["response_length distribution"].startswith("only A has per-sample response length")
    assert cmp.alignment.paired  # both have steps 1-20


def test_few_steps_are_reported_not_judged(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    for rid, seed in (("a", 1), ("b", 2)):
        stage_run(root, rid, {"steps": _steps(np.random.default_rng(seed)).head(3)})
    d = next(d for d in _cmp(root, "a", "b").differences if d.quantity == "gen_time_s.median")
    assert not d.credible and d.verdict.startswith("not judged: A has 3 steps; B has 3 steps")


def test_cli_compare_table_and_json(pairs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analyses.cli import main

    assert main(["compare", "again", "slow-gen", "--warehouse", str(pairs), "--boot", "2000"]) == 0
    out = capsys.readouterr().out
    assert "  1  yes       gen_time_s.median" in out and "test: A difference is credible" in out
    assert main(["compare", "again", "slow-gen", "--warehouse", str(pairs), "--format", "json", "--boot", "2000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["differences"][0]["quantity"] == "gen_time_s.median" and doc["differences"][0]["credible"] is True
    assert main(["compare", "again", "nope", "--warehouse", str(pairs)]) == 2
    assert "run(s) not in the warehouse: nope" in capsys.readouterr().err
    assert main(["compare", "again:9-3", "again", "--warehouse", str(pairs)]) == 2


def test_compare_report_html_and_json_beside_it(pairs: Path) -> None:
    pt = PolyTrace(pairs)
    cmp = pt.compare("again", "clipping", n_boot=BOOT)
    res = pt.compare_report(cmp, png=False)
    assert res.path == pairs / "reports" / "comparisons" / "clipping__vs__again.html"
    page = res.path.read_text()
    assert "alert.clip_ratio_high" in page and "data-figure='compare__curves'" in page
    assert json.loads(res.path.with_suffix(".json").read_text())["b"]["run_id"] == "clipping"


# ----------------------------------------------------------------------------- the statistics


def test_parse_side() -> None:
    assert parse_side("run-a") == Side("run-a")
    assert parse_side("run-a:1-100") == Side("run-a", 1, 100)
    assert parse_side("run-a:300-") == Side("run-a", 300, None) and parse_side("r:-5").last == 5
    assert parse_side("run-a:1-100").label == "run-a:1-100"
    for bad in ("run-a:", "run-a:x-3", "run-a:5-1", "run-a:1-2:3"):
        with pytest.raises(ValueError):
            parse_side(bad)


def test_alignment_rules() -> None:
    al = align(Side("a"), Side("b"), [0, 1, 2, 3], [2, 3, 4])
    assert (al.steps_a, al.paired) == ((2, 3), True) and "left out: 2 step(s) only in A, 1 only in B" in al.note
    al = align(Side("a"), Side("b"), [1, 2], [7, 8])
    assert (al.steps_a, al.steps_b, al.paired) == ((1, 2), (7, 8), False) and "no step in common" in al.note
    al = align(Side("a", 1, 2), Side("a", 3, 9), [1, 2, 3, 4], [1, 2, 3, 4])
    assert (al.steps_a, al.steps_b) == ((1, 2), (3, 4))


def test_block_bootstrap_draws_whole_blocks() -> None:
    idx = S.block_indices(27, 50, np.random.default_rng(0))
    assert idx.shape == (50, 27) and S.block_length(27) == 3
    # every block is 3 consecutive units
    blocks = idx[:, :27].reshape(50, 9, 3)
    assert (np.diff(blocks, axis=2) == 1).all() and idx.min() >= 0 and idx.max() <= 26
    w = S.index_weights(idx, 27)
    assert (w.sum(axis=1) == 27).all()


def test_histogram_quantiles_are_the_views_quantile_disc(tmp_path: Path) -> None:
    import duckdb

    x = np.random.default_rng(3).integers(1, 500, 997).astype(float)
    ha, hb = S.unit_histograms(np.zeros(x.size, dtype=int), x, np.zeros(1, dtype=int), np.array([1.0]))
    c = ha.pooled()
    got = [S.hist_quantile(ha.values, c, q)[0] for q in (0.5, 0.9, 0.99, 0.999)]
    want = duckdb.sql("SELECT quantile_disc(v, [0.5, 0.9, 0.99, 0.999]) FROM (SELECT unnest($1) AS v)",
                      params=[x.tolist()]).fetchall()[0][0]
    assert got == want
    assert S.hist_mean(ha.values, c)[0] == pytest.approx(x.mean())


def test_histogram_distances_are_ks_and_the_crps_distance() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 300, 400).astype(float), rng.integers(50, 400, 300).astype(float)
    ha, hb = S.unit_histograms(np.zeros(a.size, dtype=int), a, np.zeros(b.size, dtype=int), b)
    ks, crps = S.hist_distances(ha.values, ha.pooled(), hb.pooled())
    assert ks[0] == pytest.approx(ks_2samp(a, b)) and crps[0] == pytest.approx(crps_distance(a, b))
    # the CRPS distance is how much worse a's ensemble forecasts b's values than b's own does
    ref = crps_ensemble(a[:, None], b).mean() - crps_ensemble(b[:, None], b).mean()
    assert crps_distance(a, b) == pytest.approx(ref)


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.02, 0.04 (m=3): 0.03, 0.04, 0.04 (monotone); NaN is no test
    assert S.holm([0.04, 0.01, float("nan"), 0.02]) == pytest.approx([0.04, 0.03, float("nan"), 0.04], nan_ok=True)


def test_percentile_p_value_by_hand() -> None:
    assert S.two_sided_p(np.zeros(99)) == 1.0  # identical sides
    # 3 of 99 replicates at or below 0: 2 x (3 + 1) / 100
    assert S.two_sided_p(np.array([-1.0, -2.0, 0.0] + [1.0] * 96)) == pytest.approx(0.08)
    assert S.two_sided_p(np.ones(99)) == pytest.approx(0.02)  # every replicate agrees: the floor 2 / (n + 1)


def test_observed_quantiles_match_length_quantiles(pairs: Path) -> None:
    cmp = _cmp(pairs, "base", "again")
    view = open_wh(pairs).sql("SELECT run_id, p50, p90, p99, mean FROM length_quantiles WHERE kind = 'response'").pl()
    got = {d.quantity: (d.a, d.b) for d in cmp.differences}
    for stat in ("p50", "p90", "p99", "mean"):
        want = dict(view.select("run_id", stat).iter_rows())
        assert got[f"response_length.{stat}"] == pytest.approx((want["base"], want["again"]))


def test_overlaid_curves_switch_axes_and_mark_alerts() -> None:
    from analyses import figures as F
    from analyses.compare.curves import AXES, PANELS, thin, with_axes

    curves = with_axes(pl.DataFrame({
        "series": ["a"] * 6 + ["b"] * 6, "step": [1, 2, 3, 4, 5, 6] * 2,
        "gen_time_s": [10.0] * 6 + [20.0] * 6, "step_time_s": [30.0] * 12, "total_tokens": [1000.0] * 12,
        "clip_ratio": [0.0] * 6 + [0.0, 0.0, 0.3, 0.3, 0.3, 0.3],
    }))
    assert curves.filter(pl.col("series") == "b")["elapsed_s"].to_list() == [30, 60, 90, 120, 150, 180]
    alerts = pl.DataFrame({"series": ["b"], "kind": ["clip_ratio_high"], "metric": ["clip_ratio"], "first_step": [3],
                           "last_step": [6], "detail": ["clip_ratio >= 0.1"]})
    fig = F.compare_curves_figure(curves, alerts, PANELS, AXES, "t")
    names = [t.name for t in fig.data]
    # per panel drawn (gen time, step time, truncation): a line per series, b's alert dashed on each
    assert names.count("a") == 3 and names.count("b") == 3 and names.count("b alerts") == 3
    alert = next(t for t in fig.data if t.name == "b alerts")
    assert list(alert.x) == [3, 3, None] and alert.line.dash == "dash"
    (menu,) = fig.layout.updatemenus
    assert [b.label for b in menu.buttons] == [f"x: {t}" for _c, t in AXES]
    wall = next(b for b in menu.buttons if b.label == "x: wall time since the first step (s)")
    assert list(wall.args[0]["x"][0]) == [30, 60, 90, 120, 150, 180]  # a's first panel, cumulative step time
    assert list(wall.args[0]["x"][names.index("b alerts")]) == [90, 90, None]
    # a long series is thinned for drawing, its last step kept
    long = pl.DataFrame({"series": ["x"] * 1000, "step": range(1000)})
    t = thin(long, 400)
    assert t.height <= 400 and t["step"][-1] == 999
