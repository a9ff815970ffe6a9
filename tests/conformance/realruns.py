"""The real PolyTrace runs the conformance suite exports from, and which upstream config each goes with.

One registry: every conformance test that needs a real run, its directory, its upstream config or its
batch shape reads it from :data:`REAL_RUNS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import upstream_polytrace as up

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RealRun:
    run_id: str  # the run id we ingest it under (also its export subdirectory)
    rel_path: str  # under ../shared/real_logs
    config: str  # upstream config (configs/<name>.yaml) that names this kind of workload
    multi_turn: bool
    prompts_per_step: int  # the recorded batch: prompts x samples per prompt
    samples_per_prompt: int


class _Runs(tuple):
    def by_id(self, run_id: str) -> RealRun:
        for r in self:
            if r.run_id == run_id:
                return r
        raise KeyError(run_id)


# Each config's own workload_path ends in the directory name of one of these; dapo-0610 is a second,
# earlier DAPO run with no config of its own, so it is held to the DAPO config.
REAL_RUNS: _Runs = _Runs((
    RealRun("verl-video", "polytrace/verl-video/profile/packed_length_log/20260609_033329", "verl_video_qwen2_5_vl_7b",
            False, 64, 8),
    RealRun("dapo-0610", "polytrace/verl/profile/packed_length_log/20260610_092349", "verl_dapo_qwen2_5_32b", False, 96, 8),
    RealRun("dapo-0614", "polytrace/verl/profile/packed_length_log/20260614_023133", "verl_dapo_qwen2_5_32b", False, 96, 8),
    RealRun("rllm", "polytrace/rllm/profile/packed_length_log/20260616_024512", "rllm_deepcoder_14b_16k", False, 16, 8),
    RealRun("search-r1", "polytrace/search_r1/profile/multiturn_workload_log/0617_0223", "search_r1_qwen2_5_7b",
            True, 256, 8),
))


@dataclass(frozen=True)
class StepOnlyRun:
    """A real run that logged only per-step summaries: fitted from them (issue 23), exported like the rest.
    ``config``: the upstream config its v2 directory is validated under (the batch is the fitted one)."""

    run_id: str
    rel_path: str  # a log file under ../shared/real_logs
    config: str
    multi_turn: bool


# verl < 0.2 console (old `timing/` keys, a config dump: 512 prompts x 1 response) and an agentic verl run
# (wandb's console capture: num_turns, tool-call time, perf/total_num_tokens / global_seqlen for n and ranks)
STEP_ONLY_RUNS: tuple[StepOnlyRun, ...] = (
    StepOnlyRun("verl-gemma-steps", "verl/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log",
                "rllm_deepcoder_14b_16k", False),
    StepOnlyRun("agentic-steps", "verl_agentic_open-agentrl/run-20251130_144822-gjvwlq13/files/output.log",
                "search_r1_qwen2_5_7b", True),
)
ALL_RUN_IDS = [r.run_id for r in REAL_RUNS] + [r.run_id for r in STEP_ONLY_RUNS]


def upstream_dir(real_logs: Path) -> Path:
    """``../shared/upstream/PolyTrace`` (or ``$POLYTRACE_UPSTREAM``)."""
    env = os.environ.get("POLYTRACE_UPSTREAM")
    return Path(env) if env else real_logs.parent / "upstream" / "PolyTrace"


def upstream_config(name: str, real_logs: Path) -> dict[str, Any]:
    path = upstream_dir(real_logs) / "configs" / f"{name}.yaml"
    if not path.is_file():
        from _ci import skip_or_fail

        skip_or_fail(f"upstream config not found: {path} (set POLYTRACE_UPSTREAM)")
    return up.load_config(path)
