"""``polytrace compare`` on the real runs of ../shared/real_logs (issue 27's done-when).

- the same log ingested under two run ids: no credible difference at all (a verl console log with
  435 steps, and a PolyTrace v2 log of 21 steps x 512 responses);
- two runs that differ in their response cap: the shared logs hold none (both verl/ GSM8K logs say
  resp512; the two open-agentrl runs are both 8096), so the pair is built from the real video run:
  its 21 steps as logged (cap 16,000) and the same rollouts under a 256-token cap (every response
  longer than 256 cut there, as a cap cuts it), each with a run.toml stating its cap. The PolyTrace
  logs carry no generation time, so both runs get one by the same rule from their own responses
  (0.03 s per token of the step's longest response, plus the busiest DP rank's tokens at 20,000
  tokens/s): any generation-time difference comes from the cap alone, and its step-to-step spread
  is the real runs' own;
- every pair of the shared real runs: compare runs without error and says what it cannot compare.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from analyses.api import PolyTrace
from analyses.compare import Side, compare_data
from analyses.compare.collect import load_run
from analyses.compare.quantities import SERIES, VARIABLES
from analyses.ingest import ingest_run

# one worker builds the module's warehouse once (make test runs -n 2 --dist loadgroup)
pytestmark = [pytest.mark.real_logs, pytest.mark.xdist_group("compare_real")]

VIDEO = "polytrace/verl-video/profile/packed_length_log/20260609_033329"
QWEN = "verl/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
# every run of the shared real logs, one id each (a directory of several separate logs is one run per log)
REAL_RUNS = {
    "qwen-gsm8k": QWEN,
    "gemma-gsm8k": "verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log",
    "gui-cursor": "verl/GUI-Cursor-Moving_verl_demo.log",
    "agentic-i80": "verl_agentic_open-agentrl/run-20251129_221801-i80f2v90",
    "agentic-gjv": "verl_agentic_open-agentrl/run-20251130_144822-gjvwlq13",
    "jsonl-gsm8k": "verl_jsonl_filelogger/HanlinDu_verl",
    "rollout-zyqiu": "verl_rollout_dump/ZyQiu6_verl_dev",
    "rollout-hecate": "verl_rollout_dump/hecate_verl_rollouts",
    "video": VIDEO,
    "coder": "polytrace/rllm/profile/packed_length_log/20260616_024512",
    "dapo": "polytrace/verl/profile/packed_length_log/20260610_092349",
    "dapo-filter": "polytrace/verl/profile/packed_length_log/20260614_023133",
    "search": "polytrace/search_r1/profile/multiturn_workload_log/0617_0223",
    "trl": "trl_grpo_terminal/20251022_181457",
    "unsloth": "unsloth_grpo",
    "nvidia-smi": "nvidia_smi_csv",
    "dcgm": "dcgm_prometheus",
    "pai-workers": "alibaba_pai_minibatch",
    "kineto": "kineto_traces_hta",
    "genai-util": "alibaba_genai_gpu_util",
}


@pytest.fixture(scope="module")
def real_wh(real_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real-cmp") / "wh"
    runs = {**REAL_RUNS, "qwen-gsm8k-again": QWEN, "video-again": VIDEO}
    for rid, rel in runs.items():
        assert (real_logs / rel).exists(), f"{rel} missing from the real logs"
        ingest_run(real_logs / rel, root, run_id=rid)
    return root


def test_same_log_under_two_run_ids_has_no_credible_difference(real_wh: Path) -> None:
    pt = PolyTrace(real_wh)
    for a, b in (("qwen-gsm8k", "qwen-gsm8k-again"), ("video", "video-again")):
        cmp = pt.compare(a, b)  # the default 4,000 replicates
        assert cmp.credible == [], [d.text for d in cmp.credible]
        measured = [d for d in cmp.differences if d.kind in ("measured", "distribution")]
        assert len(measured) >= 10 and all(d.p_adjusted == 1.0 for d in measured)
        assert not any(d.kind in ("config", "run_fact", "alert") for d in cmp.differences)
        assert cmp.alignment.paired and cmp.not_compared == []


def _build_video(src: Path, dst: Path, cap: int | None, declared: int) -> None:
    """The video run's packed-length logs (responses cut at ``cap``), a run.toml stating ``declared``,
    and a verl JSONL trainer log with the generation time of each step (the module's rule)."""
    dst.mkdir(parents=True)
    gen = []
    for f in sorted(src.glob("packed_lengths_step_*.jsonl")):
        out, per_rank, longest, step = [], {}, 0, None
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if cap is not None:
                rec["output"] = [min(o, cap) for o in rec["output"]]
            if not rec.get("validate"):
                step = rec["step"]
                per_rank[rec["dp_rank"]] = per_rank.get(rec["dp_rank"], 0) + sum(rec["output"])
                longest = max(longest, *rec["output"])
            out.append(json.dumps(rec))
        (dst / f.name).write_text("\n".join(out) + "\n")
        gen.append((step, 0.03 * longest + max(per_rank.values()) / 20_000))
    (dst / "trainer.jsonl").write_text("".join(json.dumps({"step": s, "data": {"timing_s/gen": g}}) + "\n"
                                               for s, g in gen))
    (dst / "run.toml").write_text(f"max_response_length = {declared}\n")


@pytest.fixture(scope="module")
def cap_pair(real_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> PolyTrace:
    tmp = tmp_path_factory.mktemp("cap")
    _build_video(real_logs / VIDEO, tmp / "video-16k", None, 16000)
    _build_video(real_logs / VIDEO, tmp / "video-256", 256, 256)
    for rid in ("video-16k", "video-256"):
        ingest_run(tmp / rid, tmp / "wh", run_id=rid)
    return PolyTrace(tmp / "wh")


def test_a_lower_response_cap_shows_its_config_and_the_differences_it_causes(cap_pair: PolyTrace) -> None:
    cmp = cap_pair.compare("video-16k", "video-256")
    by = {d.quantity: d for d in cmp.differences}
    rank = {d.quantity: i for i, d in enumerate(cmp.differences)}
    cap = by["run.max_response_length"]
    assert (cap.a, cap.b, cap.credible) == (16000, 256, True) and rank["run.max_response_length"] == 0
    assert cap.text == "response cap x0.016 (16,000 tokens → 256 tokens) (A: run.toml, B: run.toml)"
    caused = ["response_length.p99", "response_length.mean", "response_length.distribution", "truncation_share.mean",
              "gen_time_s.median"]
    assert all(by[q].credible for q in caused), [by[q].text for q in caused]
    # ranked above the noise: every credible difference before every other one
    first_noise = min(i for i, d in enumerate(cmp.differences) if not d.credible)
    assert max(rank[q] for q in caused) < first_noise
    assert by["response_length.p99"].a == 316 and by["response_length.p99"].b == 256  # quantile_disc of the views
    assert by["gen_time_s.median"].ratio < 0.5 and by["gen_time_s.median"].b_interval[1] < by["gen_time_s.median"].a_interval[0]
    # what the cap does not touch stays within the spread: the prompts, the median response
    for q in ("prompt_length.p50", "prompt_length.distribution", "response_length.p50"):
        assert not by[q].credible and by[q].p_adjusted == 1.0


def _variables(data) -> set[str]:  # noqa: ANN001 - RunData
    have = set(data.series["quantity"].unique()) | set(data.samples)
    return have | ({"gpu"} if data.gpu_time.height else set())


def test_every_pair_of_the_shared_real_runs(real_wh: Path) -> None:
    con = PolyTrace(real_wh).connect()
    data = {r: load_run(con, r) for r in REAL_RUNS}
    keys = {q.key for q in SERIES} | {v.key for v in VARIABLES}
    sharing = 0
    for a, b in itertools.combinations(REAL_RUNS, 2):
        # few replicates: this checks that every pair compares and says what it cannot, not the verdicts
        cmp = compare_data(Side(a), Side(b), data[a], data[b], n_boot=200)
        doc = json.loads(json.dumps(cmp.to_dict()))  # serializable as the CLI writes it
        assert doc["aligned"] and all({"quantity", "a", "b", "credible", "text"} <= set(d) for d in doc["differences"])
        shared = _variables(data[a]) & _variables(data[b])
        measured = {d.quantity.rsplit(".", 1)[0] for d in cmp.differences if d.kind in ("measured", "distribution")}
        said = {n["quantity"].rsplit(".", 1)[0].split(" ")[0] for n in cmp.not_compared}
        if shared:
            sharing += 1
            # every per-step series or per-sample variable both runs have is compared, or said why not (on
            # the steps both have, one of them may lack it); a series a per-sample distribution supersedes
            # is said through that distribution; turns of two single-turn runs are no comparison
            for k in shared & keys:
                sup = next((q.sample_variable for q in SERIES if q.key == k), None)
                assert k in measured or k in said or (sup is not None and sup in measured) or (
                    k == "turns" and max(data[a].samples["turns"]["value"].max(),
                                         data[b].samples["turns"]["value"].max()) <= 1), (a, b, k)
        only = (_variables(data[a]) ^ _variables(data[b])) & keys
        if only:  # what one side has and the other lacks is said
            assert cmp.not_compared, (a, b, only)
    assert sharing >= 100  # of the 190 pairs of 20 runs
