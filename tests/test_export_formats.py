"""Every export format on a small synthetic spec, and the round trip through our own readers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from _fit_synth import synth_multiturn, synth_samples

from analyses.atomic_output import MARKER
from analyses.export.formats.aiperf import percent_thousandths
from analyses.export.registry import ExportError, export, format_names
from analyses.export.spec import build_spec
from analyses.fit.sampler import generate, steps_for
from analyses.fit.workload import fit_workload
from analyses.ingest import ingest_run
from analyses.warehouse import scan_table


@pytest.fixture(scope="module")
def single() -> dict:
    s = synth_samples(steps=3, prompts=8, n=4, cap=1000, seed=2, first_step=1)
    rt = pl.DataFrame({"step": [1, 1, 2, 2, 3, 3], "rank": [0, 4] * 3, "dp_rank": [0, 1] * 3, "phase": ["reward"] * 6,
                       "seconds": [30.0, 35.0, 28.0, 40.0, 33.0, 31.0], "n_samples": [16] * 6})
    w = fit_workload(s, rank_times=rt, run_id="single", task="math")
    return build_spec({"single": w}, ["single"])


@pytest.fixture(scope="module")
def multi() -> dict:
    mt = synth_multiturn(steps=2, prompts=8, n=4)
    w = fit_workload(mt["samples"], turns=mt["turns"], tool_calls=mt["tool_calls"], run_id="mt", task="search")
    return build_spec({"mt": w}, ["mt"])


def test_polytrace_v2_files_and_record_shape(single, tmp_path: Path):
    files = export(single, "polytrace-v2", tmp_path, seed=1)
    names = sorted(p.name for p in files)
    # 3 fitted steps (1..3), at least 4 exported (upstream's configs replay up to 4), numbered 0..3 as
    # upstream's step_groups name them: one packed file and one reward file per step
    assert names == sorted([f"packed_lengths_step_{k}.jsonl" for k in range(4)] + [f"reward_timings_step_{k}.jsonl" for k in range(4)])
    lines = (tmp_path / "packed_lengths_step_2.jsonl").read_text().splitlines()
    assert len(lines) == 8  # one record per prompt
    rec = json.loads(lines[0])
    assert list(rec) == ["step", "rank", "dp_rank", "tp_rank", "local_index", "input", "output", "n_sampling", "validate"]
    assert rec["step"] == 2 and len(rec["output"]) == rec["n_sampling"] == 4 and rec["validate"] is False
    more = export(single, "polytrace-v2", tmp_path / "more", seed=1, steps=2, records_per_step=12)
    assert sorted(p.name for p in more if p.name.startswith("packed")) == ["packed_lengths_step_0.jsonl", "packed_lengths_step_1.jsonl"]
    assert len((tmp_path / "more" / "packed_lengths_step_1.jsonl").read_text().splitlines()) == 3  # 12 records = 3 prompts x 4
    with pytest.raises(ExportError, match="must be a positive multiple of the workload's 4 samples per prompt"):
        export(single, "polytrace-v2", tmp_path / "bad", records_per_step=10)
    rw = [json.loads(x) for x in (tmp_path / "reward_timings_step_1.jsonl").read_text().splitlines()]
    assert [r["dp_rank"] for r in rw] == [0, 1] and all(r["batch_size"] == 16 and r["reward_time_s"] > 0 for r in rw)


def test_same_seed_gives_byte_identical_exports(single, tmp_path: Path):
    for fmt in ("polytrace-v2", "polytrace-v1", "vidur", "mooncake", "aiperf"):
        a = export(single, fmt, tmp_path / "a" / fmt, seed=9, steps=2)
        b = export(single, fmt, tmp_path / "b" / fmt, seed=9, steps=2)
        assert a and [p.read_bytes() for p in a] == [p.read_bytes() for p in b], fmt  # files written, same bytes


def test_v1_vidur_mooncake_aiperf_params(single, multi, tmp_path: Path):
    (v1,) = export(single, "polytrace-v1", tmp_path / "v1", steps=2, seed=0)
    doc = json.loads(v1.read_text())
    assert list(doc) == ["1", "2"] and len(doc["1"]["input"]) == 8 and len(doc["1"]["output"]) == 32

    vid, replay, interval = export(single, "vidur", tmp_path / "vidur", steps=2, seed=0, step_interval_s=100,
                                   vidur_date="2024-01-02")
    rows = list(csv.DictReader(vid.open()))
    assert list(rows[0]) == ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
    assert len(rows) == 64 and {float(r["arrived_at"]) for r in rows} == {0.0, 100.0}
    # the same requests as vidur's trace-replay and interval generators read them
    rep = list(csv.DictReader(replay.open()))
    assert list(rep[0]) == ["Date", "Time", "PromptTokenCount", "CompletionTokenCount"] and len(rep) == 64
    assert {r["Date"] for r in rep} == {"2024-01-02"} and {float(r["Time"]) for r in rep} == {0.0, 100.0}
    assert [(r["PromptTokenCount"], r["CompletionTokenCount"]) for r in rep] == [
        (r["num_prefill_tokens"], r["num_decode_tokens"]) for r in rows]
    arr = [r["arrival_time"] for r in csv.DictReader(interval.open())]
    assert len(arr) == 64 and set(arr) == {"1970-01-04 12:00:01.000000", "1970-01-04 12:01:41.000000"}

    (mc,) = export(multi, "mooncake", tmp_path / "mc", steps=1, seed=0)
    recs = [json.loads(x) for x in mc.read_text().splitlines()]
    assert {"timestamp", "input_length", "output_length", "hash_ids", "session_id", "turn", "tool_calls"} <= set(recs[0])
    ts = [r["timestamp"] for r in recs]
    assert ts == sorted(ts)
    assert all(isinstance(x, int) for x in ts)  # integer milliseconds
    by = {}
    for r in recs:
        by.setdefault(r["session_id"], []).append(r)
    long = next(v for v in by.values() if len(v) > 1)
    assert long[1]["timestamp"] > long[0]["timestamp"]
    # a later turn is an increment with blocks of its own; aiperf's history then is the generated context
    assert not set(long[1]["hash_ids"]) & set(long[0]["hash_ids"])
    turns = _generated(multi, 1, 0).turns
    ctx = {(f"{a}-{b}-{c}", t): p for a, b, c, t, p in turns.select("step", "group", "sample_index", "turn",
                                                                     "prompt_tokens").iter_rows()}
    for sid, rs in by.items():
        history = 0
        for r in sorted(rs, key=lambda r: r["turn"]):
            history += r["input_length"]
            if r["turn"] == 0 or r["input_length"] > 1:
                assert history == ctx[(sid, r["turn"])]
            else:  # an increment below one token is sent as one
                assert history >= ctx[(sid, r["turn"])]
            history += r["output_length"]
        for r in rs:  # an id stands for one block size: ceil(input_length / 512) ids
            assert len(r["hash_ids"]) == -(-r["input_length"] // 512)
    # the first turns of one prompt group share the prompt's blocks
    firsts = [r for r in recs if r["turn"] == 0]
    group = firsts[0]["session_id"].rsplit("-", 1)[0]
    assert len({tuple(r["hash_ids"]) for r in firsts if r["session_id"].rsplit("-", 1)[0] == group}) == 1

    txt, js = export(single, "aiperf", tmp_path / "ai", seed=0)
    buckets = txt.read_text().strip().split(";")
    assert 2 <= len(buckets) <= 8
    for b in buckets:  # ISL|SD,OSL|SD:PROB
        pair, prob = b.split(":")
        isl, osl = pair.split(",")
        assert int(isl.split("|")[0]) >= 1 and int(osl.split("|")[0]) >= 1 and float(prob) > 0
    # aiperf's DistributionParser allows 1e-6: the rounded shares must sum to 100 exactly
    assert sum(p["prob"] for p in json.loads(js.read_text())["pairs"]) == pytest.approx(100, abs=1e-9)
    assert sum(float(b.split(":")[1]) for b in buckets) == pytest.approx(100, abs=1e-9)


    (pp,) = export(single, "polytrace-params", tmp_path / "pp")
    params = json.loads(pp.read_text())
    task = params["math_task"]
    assert {"input_distribution", "output_distribution", "joint_distribution", "gmm_parameters"} <= set(task)
    assert {"type", "parameters", "ks_statistic", "ks_p_value"} <= set(task["output_distribution"])
    (pm,) = export(multi, "polytrace-params", tmp_path / "pm")
    assert "call_count_distribution" in json.loads(pm.read_text())["tool_calling_task"]


def test_unknown_format_and_workload_are_errors(single, tmp_path: Path):
    with pytest.raises(ValueError):
        export(single, "csv", tmp_path)
    with pytest.raises(KeyError):
        export(single, "polytrace-v2", tmp_path, workload="nope")
    assert set(format_names()) == {"polytrace-v2", "polytrace-v1", "polytrace-params", "vidur", "mooncake", "aiperf"}


def _generated(spec: dict, steps: int, seed: int):
    key, w = next(iter(spec["workloads"].items()))
    return generate(w, steps_for(w, steps), seed, key=key)


def test_v2_round_trip_through_our_reader(single, tmp_path: Path):
    out = tmp_path / "gen"
    export(single, "polytrace-v2", out, steps=2, seed=4)
    ingest_run(out, tmp_path / "wh", run_id="gen")
    got = scan_table(tmp_path / "wh", "samples", ["gen"]).collect()
    g = _generated(single, 2, 4).renumbered(1).samples  # the fitted run starts at step 1; files at 0
    cols = ["step", "dp_rank", "local_index", "prompt_tokens", "response_tokens"]
    assert got.select(cols).sort(cols).equals(g.select(cols).sort(cols))
    rw = scan_table(tmp_path / "wh", "rank_times", ["gen"]).collect().sort("step", "dp_rank")
    exp = _generated(single, 2, 4).renumbered(1).rewards.sort("step", "dp_rank")
    assert rw["seconds"].to_list() == pytest.approx(exp["reward_time_s"].to_list())


def test_v1_round_trip_through_our_reader(single, tmp_path: Path):
    export(single, "polytrace-v1", tmp_path / "v1", steps=2, seed=4)
    ingest_run(tmp_path / "v1", tmp_path / "wh", run_id="v1")
    got = scan_table(tmp_path / "wh", "samples", ["v1"]).collect()
    g = _generated(single, 2, 4).samples
    cols = ["step", "prompt_tokens", "response_tokens"]
    assert got.select(cols).sort(cols).equals(g.select(cols).sort(cols))


def test_multiturn_v2_round_trip(multi, tmp_path: Path):
    out = tmp_path / "mt"
    export(multi, "polytrace-v2", out, steps=1, seed=2)
    # a multi-turn task is written as trajectories only: a packed view would repeat the same samples
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == ["multiturn_workload_step_0.jsonl"]
    ingest_run(out, tmp_path / "wh", run_id="mt")
    g = _generated(multi, 1, 2)
    # exact counts: 8 prompts x 4 samples = 32 trajectories for the one step, each once
    assert g.samples.height == 32
    assert scan_table(tmp_path / "wh", "samples", ["mt"]).collect().height == g.samples.height
    turns = scan_table(tmp_path / "wh", "turns", ["mt"]).collect()
    calls = scan_table(tmp_path / "wh", "tool_calls", ["mt"]).collect()
    assert turns.height == g.turns.height and calls.height == g.tool_calls.height
    assert sorted(turns["completion_tokens"].to_list()) == sorted(g.turns["completion_tokens"].to_list())
    assert sorted(calls["latency_s"].to_list()) == pytest.approx(sorted(g.tool_calls["latency_s"].to_list()))
    s = scan_table(tmp_path / "wh", "samples", ["mt"]).collect()
    assert sorted(s["response_tokens"].to_list()) == sorted(g.samples["response_tokens"].to_list())


def test_cli_export_and_sample(single, tmp_path: Path, capsys):
    from analyses.cli import main
    from analyses.export.spec import write_spec

    spec = write_spec(single, tmp_path / "spec.json")
    assert main(["export", "--spec", str(spec), "--format", "vidur", "--out", str(tmp_path / "v"), "--steps", "2"]) == 0
    assert (tmp_path / "v" / "vidur_trace.csv").exists()
    assert main(["sample", "--spec", str(spec), "--steps", "2", "--seed", "3", "--out", str(tmp_path / "s1")]) == 0
    assert main(["sample", "--spec", str(spec), "--steps", "2", "--seed", "3", "--out", str(tmp_path / "s2")]) == 0
    from analyses.atomic_output import MARKER

    # the same seed, the same bytes; the ownership marker says when each was written (it crossed a
    # second boundary between the two in one CI run)
    a = sorted(p for p in (tmp_path / "s1").iterdir() if p.name != MARKER)
    assert a and (tmp_path / "s1" / MARKER).is_file() and (tmp_path / "s2" / MARKER).is_file()
    assert [p.name for p in a] == sorted(p.name for p in (tmp_path / "s2").iterdir() if p.name != MARKER)
    assert [p.read_bytes() for p in a] == [(tmp_path / "s2" / p.name).read_bytes() for p in a]
    assert main(["sample", "--spec", str(spec), "--steps", "0", "--out", str(tmp_path / "s3")]) == 2
    assert main(["export", "--spec", str(tmp_path / "missing.json"), "--format", "vidur", "--out", str(tmp_path / "x")]) == 2
    (tmp_path / "bad.json").write_text("{}")
    assert main(["export", "--spec", str(tmp_path / "bad.json"), "--format", "vidur", "--out", str(tmp_path / "x")]) == 2
    assert "missing required key" in capsys.readouterr().err


@pytest.mark.real_logs
def test_params_export_has_polytrace_parameter_file_structure(real_file, single, multi, tmp_path: Path):
    ref = json.loads(real_file("polytrace/dataset/workloads/enhanced_task_distribution_parameters.json").read_text())
    (pp,) = export(single, "polytrace-params", tmp_path / "pp")
    ours = json.loads(pp.read_text())
    assert {"version", "extraction_info"} <= set(ours)
    ref_task, our_task = ref["math_task"], ours["math_task"]
    # every key PolyTrace's math task has, ours has; same for its marginal and joint entries
    assert set(ref_task) - {"extraction_date"} <= set(our_task)
    assert set(ref_task["output_distribution"]) <= set(our_task["output_distribution"])
    assert set(ref_task["joint_distribution"]) <= set(our_task["joint_distribution"])
    assert set(ref_task["gmm_parameters"]) == set(our_task["gmm_parameters"])
    # scipy parameter order: the family loads with the listed parameters
    from scipy import stats

    d = our_task["output_distribution"]
    assert np.isfinite(getattr(stats, d["type"])(*d["parameters"]).mean())
    (pm,) = export(multi, "polytrace-params", tmp_path / "pm")
    tool = json.loads(pm.read_text())["tool_calling_task"]
    assert {"task_type", "call_count_distribution", "total_sessions", "available_call_counts"} <= set(tool)
    assert set(ref["tool_calling_task"]["call_count_distribution"]) and tool["call_count_distribution"]
    assert all(k.isdigit() for k in tool["call_count_distribution"])


def test_mooncake_blocks_are_shared_only_within_a_group(multi, tmp_path: Path):
    # 70 samples per prompt (> 64): a trajectory's own context blocks must not collide with another
    # trajectory's or with any prompt's blocks (a collision would fake prefix-cache hits)
    import copy

    spec = copy.deepcopy(multi)
    w = next(iter(spec["workloads"].values()))
    w["batch"]["prompts_per_step"], w["batch"]["samples_per_prompt"] = 3, 70
    (mc,) = export(spec, "mooncake", tmp_path / "mc", steps=1, seed=0)
    recs = [json.loads(x) for x in mc.read_text().splitlines()]
    owners: dict[int, set[str]] = {}
    for r in recs:
        step, group, _ = r["session_id"].split("-")
        for h in r["hash_ids"]:
            owners.setdefault(h, set()).add(r["session_id"])
    groups_of = {h: {s.rsplit("-", 1)[0] for s in ss} for h, ss in owners.items()}
    assert len(recs) > 210 and owners
    # every block is used by the sessions of one group only (prompt blocks: the group's; the rest: one session)
    assert all(len(g) == 1 for g in groups_of.values())
    shared = [h for h, ss in owners.items() if len(ss) > 1]
    assert shared and all(len(groups_of[h]) == 1 for h in shared)


def test_percent_thousandths_give_the_rounding_to_the_largest_remainders() -> None:
    # by hand: 1/3 each = 33333.33 thousandths: floors sum to 99,999, one goes to the first
    assert percent_thousandths(np.array([1, 1, 1])) == [33.334, 33.333, 33.333]
    # 2/7, 5/7 -> 28571.43 + 71428.57 thousandths: the larger remainder (.57) gets the missing unit
    assert percent_thousandths(np.array([2, 5])) == [28.571, 71.429]
    assert sum(percent_thousandths(np.array([0.1] * 7 + [0.3]))) == pytest.approx(100, abs=1e-9)


def test_a_spec_lacking_what_a_format_needs_exits_2_and_writes_nothing(multi, tmp_path: Path, capsys) -> None:
    import copy

    from analyses.cli import main
    from analyses.export.spec import write_spec

    broken = copy.deepcopy(multi)
    (w,) = broken["workloads"].values()
    del w["variables"]["n_turns"]
    spec = tmp_path / "spec.json"
    write_spec(broken, spec)
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("{}\n")  # an earlier export's directory (polytrace replaces only those)
    (out / "keep.txt").write_text("mine\n")
    assert main(["export", "--spec", str(spec), "--format", "polytrace-v2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no 'variables.n_turns', which this format needs" in err[0]
    # nothing partial: the directory holds what it held, and no staging directory is left beside it
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "spec.json"]


def test_params_task_keys_follow_the_data_or_the_option(multi, single, tmp_path: Path) -> None:
    (pm,) = export(multi, "polytrace-params", tmp_path / "pm")
    doc = json.loads(pm.read_text())
    # a workload with tool calls is upstream's tool_calling_task: lengths and call counts in one entry
    assert [k for k in doc if k.endswith("_task")] == ["tool_calling_task"]
    assert {"input_distribution", "output_distribution", "call_count_distribution"} <= set(doc["tool_calling_task"])
    (po,) = export(single, "polytrace-params", tmp_path / "po", task="coding")
    assert [k for k in json.loads(po.read_text()) if k.endswith("_task")] == ["coding_task"]


def test_empirical_alternative_by_hand() -> None:
    from analyses.export.formats.polytrace_params import empirical_alternative, length_marginal

    e = empirical_alternative({"kind": "categorical", "values": [20, 10, 11], "probs": [0.25, 0.5, 0.25]})
    # bins: 10 -> [9.5, 10.5], 11 -> [10.5, 11.5], a gap to 20 -> [19.5, 20.5]; each atom mid-bin: KS = 0.5 * 0.5
    assert e["parameters"] == [[[0.5, 0.25, 0.0, 0.25], [9.5, 10.5, 11.5, 19.5, 20.5]]]
    assert e["ks_statistic"] == pytest.approx(0.25)
    # never a family whose KS is worse than the empirical alternative's, and a better family is kept
    atoms = {"kind": "categorical", "values": list(range(1, 1001)), "probs": [0.001] * 1000}
    family = {"kind": "continuous", "family": "uniform", "params": [0.5, 1000.0], "gof": {"ks": 0.3, "ks_p": 0.0}}
    worse = length_marginal({**atoms, "scipy_fallback": family})
    assert worse["type"] == "rv_histogram" and worse["ks_statistic"] == pytest.approx(0.0005)
    assert worse["parametric_alternative"]["type"] == "uniform"
    better = length_marginal({**atoms, "scipy_fallback": {**family, "gof": {"ks": 0.0001, "ks_p": 1.0}}})
    assert better["type"] == "uniform" and better["ks_statistic"] == 0.0001


def test_multiturn_records_carry_upstreams_replay_fields(multi, tmp_path: Path) -> None:
    files = export(multi, "polytrace-v2", tmp_path, seed=3)
    assert sorted(p.name for p in files) == [f"multiturn_workload_step_{k}.jsonl" for k in range(4)]
    recs = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert len(recs) == 32  # prompts x samples of the source batch
    for r in recs:
        turns, calls = r["turns"], r["tool_calls"]
        assert turns[0]["generation_prompt_len"] == r["prompt_len"]
        for a, b in zip(turns, turns[1:], strict=False):
            # the next turn starts exactly where this turn's appends end
            appended = a["assistant_append_len"] + sum(c["append_len"] for c in calls if c["turn"] == a["turn"])
            assert b["generation_prompt_len"] == a["generation_prompt_len"] + appended == b["prompt_tokens"]
        assert all(t["assistant_loss_len"] == t["assistant_append_len"] == t["completion_tokens"] for t in turns)
        assert all(c["loss_len"] == 0 and c["append_len"] >= c["response_token_len"] for c in calls)
        rle = r["response_loss_mask_rle"]
        assert sum(n for _, n in rle) == r["final_response_len"]
        assert all(v1 != v2 for (v1, _), (v2, _) in zip(rle, rle[1:], strict=False))  # adjacent runs merged


def test_dapo_filter_fit_and_file_by_hand(single, tmp_path: Path) -> None:
    from analyses.export.formats.polytrace_v2 import filter_records
    from analyses.fit.dynamic_filter import fit_filter

    batches = pl.DataFrame({"trainer_step": [1, 1, 2], "gen_batch": [1, 2, 1], "prompts_generated": [96, 96, 96],
                            "prompts_kept": [27, 33, 30], "train_batch_size": [32, 32, 32]})
    f = fit_filter(batches)
    assert f == {"kind": "dynamic_sampling", "prompts_per_gen_batch": 96, "keep_rate": 90 / 288, "train_batch_size": 32,
                 "gen_batches": 3, "trainer_steps": 2}
    assert fit_filter(None) is None and fit_filter(batches.clear()) is None
    # every prompt kept, 8 per step, batches of 12: step 0 fills 8, step 1 uses 4 of its 8 (trainer step 1 done)
    w = {"batch": {"prompts_per_step": 8, "samples_per_prompt": 4}, "filter": {**f, "keep_rate": 1.0, "train_batch_size": 12}}
    recs = filter_records(w, [0, 1, 2], seed=0, key="k")
    assert [(r["trainer_step"], r["gen_batch_index"], r["num_prompt_in_batch_before"], r["kept_prompt_count"],
             r["used_prompt_count"]) for r in recs] == [(1, 1, 0, 8, 8), (1, 2, 8, 8, 4), (2, 1, 0, 8, 8)]
    assert recs[1]["used_prompt_indices"] == [0, 1, 2, 3]
    # through the export: the file upstream's DAPO config names, one record per step file
    spec = {**single, "workloads": {k: {**v, "filter": f} for k, v in single["workloads"].items()}}
    files = export(spec, "polytrace-v2", tmp_path, seed=2, steps=3)
    lines = (tmp_path / "dapo_filter_indices.jsonl").read_text().splitlines()
    assert tmp_path / "dapo_filter_indices.jsonl" in files and [json.loads(x)["workload_step"] for x in lines] == [0, 1, 2]


def test_every_format_of_a_spec_from_one_draw_writes_the_same_bytes(multi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from analyses.export import registry

    calls: list[str | None] = []
    real = registry.generate
    monkeypatch.setattr(registry, "generate", lambda *a, **k: calls.append(k.get("key")) or real(*a, **k))
    drawn: dict = {}
    for fmt in format_names():
        export(multi, fmt, tmp_path / "shared" / fmt, drawn=drawn)
    shared_calls = len(calls)
    for fmt in format_names():
        export(multi, fmt, tmp_path / "alone" / fmt)
    # each workload drawn once for every format that replays steps, instead of once per format
    assert shared_calls == len(multi["workloads"]) < len(calls) - shared_calls

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER}

    assert files(tmp_path / "shared") == files(tmp_path / "alone")
