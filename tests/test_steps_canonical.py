"""Canonical metric names (one registry for verl generations, TRL, OpenRLHF, NeMo-RL) and the
step-time / token rules of ``derive_steps``, on small frames with hand-computed answers."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest

from analyses.steps import (
    ALIASES,
    CANONICAL_METRICS,
    HEALTH_KINDS,
    HF_ALIASES,
    STEP_COLUMNS,
    canonical_metric,
    derive_steps,
    metrics_of_kind,
    resolve_alias_collisions,
)


def _canon(names: list[str], hf: bool = False) -> list[str]:
    return pl.select(canonical_metric(pl.Series(names), hf=hf)).to_series().to_list()


def test_every_spelling_has_one_canonical_name() -> None:
    names = [m.name for m in CANONICAL_METRICS]
    assert len(names) == len(set(names))
    assert not set(names) & set(HF_ALIASES)  # a canonical name is never someone's alias
    assert set(ALIASES) <= set(HF_ALIASES)  # bare transformers names only widen the table
    for col, cands in STEP_COLUMNS.items():
        assert not set(cands) & set(HF_ALIASES), col


def test_verl_generations_map_to_one_name() -> None:
    # spellings of the real logs: Qwen2.5-0.5B (Dec 2024) vs the Open-AgentRL runs (Nov 2025)
    old = ["timing/gen", "actor/entropy_loss", "critic/kl", "critic/kl_coeff", "response_length/mean"]
    new = ["timing_s/gen", "actor/entropy", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "response_length/mean"]
    assert _canon(old) == _canon(new) == ["timing_s/gen", "actor/entropy", "critic/kl", "critic/kl_coeff", "response_length/mean"]


def test_trl_names_canonical_only_in_transformers_logs() -> None:
    raw = ["completions/mean_length", "completions/clipped_ratio", "reward", "kl", "entropy", "step_time", "loss"]
    assert _canon(raw, hf=True) == [
        "response_length/mean", "response_length/clip_ratio", "critic/score/mean", "actor/kl_loss",
        "actor/entropy", "timing_s/step", "loss",
    ]
    # a bare "reward" column of some other export stays as written; TRL's distinctive names do not
    assert _canon(["reward", "kl", "completions/mean_length"]) == ["reward", "kl", "completions/mean_length"]


def test_prefixed_names_of_tensorboard_and_wandb_callbacks() -> None:
    raw = [
        "train/completions/mean_length", "train/reward", "train/kl",  # transformers TB/wandb callbacks
        "train/response_length", "train/policy_loss",  # OpenRLHF
        "train/mean_gen_tokens_per_sample", "train/truncation_rate", "timing/train/total_step_time",  # NeMo-RL
        "timing/train/generation", "timing/train/unknown_stage",
    ]
    assert _canon(raw) == [
        "response_length/mean", "critic/score/mean", "actor/kl_loss",
        "response_length/mean", "actor/pg_loss",
        "response_length/mean", "response_length/clip_ratio", "timing_s/step",
        "timing_s/gen", "timing_s/train/unknown_stage",  # undeclared timing/: the verl rename applies
    ]


def test_health_kinds_are_declared() -> None:
    kinds = {m.kind for m in CANONICAL_METRICS}
    assert set(HEALTH_KINDS) <= kinds
    health = metrics_of_kind(*HEALTH_KINDS)
    for name in ("response_length/mean", "response_length/clip_ratio", "response/aborted_ratio", "num_turns/mean",
                 "critic/score/mean", "actor/entropy", "actor/kl_loss", "perf/mfu/actor", "perf/max_memory_allocated_gb"):
        assert name in health


def test_metrics_of_kind() -> None:
    assert metrics_of_kind("kl") == ("actor/kl_loss", "critic/kl")
    assert "response_length/clip_ratio" in metrics_of_kind("clip_ratio")
    assert metrics_of_kind("entropy") == ("actor/entropy",)


def test_two_spellings_in_one_record_keep_one_canonical_row() -> None:
    rows = pl.DataFrame({
        "step": [1, 1, 1, 2],
        "metric": ["response_length/mean"] * 3 + ["response_length/mean"],
        "value": [100.0, 101.0, 0.5, 7.0],
        "raw_metric": ["completion_length", "completions/mean_length", "response_length/mean", "completion_length"],
        "is_validation": [False] * 4,
        "line_no": [10, 10, 11, 12],
    })
    out = resolve_alias_collisions(rows)
    # line 10: completions/mean_length is listed first, completion_length keeps its raw name
    assert out["metric"].to_list() == ["completion_length", "response_length/mean", "response_length/mean", "response_length/mean"]


def _sm(rows: list[tuple[int, str, float]]) -> pl.LazyFrame:
    return pl.DataFrame(
        {
            "step": [r[0] for r in rows], "metric": [r[1] for r in rows], "value": [r[2] for r in rows],
            "is_validation": [False] * len(rows), "path": ["a"] * len(rows), "line_no": list(range(len(rows))),
        }
    ).lazy()


def test_step_time_sources_in_order() -> None:
    sm = _sm([
        (1, "timing_s/step", 50.0), (1, "progress/step_time_s/tqdm_elapsed", 48.0),
        (2, "progress/step_time_s/tqdm_elapsed", 30.0), (2, "progress/step_time_s/tqdm_rate", 31.5),
        (3, "progress/step_time_s/tqdm_rate", 31.5),
        (4, "timing_s/gen", 10.0), (4, "timing_s/update_actor", 5.0),
        (5, "response_length/mean", 1.0), (6, "response_length/mean", 1.0), (8, "response_length/mean", 1.0),
    ])
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    attrs = pl.DataFrame({
        "step": [5, 6, 8],
        "ts": [t0, datetime(2025, 1, 1, 0, 1, 30, tzinfo=UTC), datetime(2025, 1, 1, 0, 5, tzinfo=UTC)],
        "truncated_line": [False] * 3,
    }).lazy()
    out = derive_steps(sm, attrs)
    got = dict(zip(out["step"], zip(out["step_time_s"], out["step_time_source"], strict=True), strict=True))
    assert got == {
        1: (50.0, "logged"),
        2: (30.0, "tqdm_elapsed"),
        3: (31.5, "tqdm_rate"),
        4: (15.0, "sum_of_stages"),
        5: (None, None),  # step 4 has no time stamp
        6: (90.0, "log_ts_diff"),
        8: (None, None),  # steps 6 and 8 are not consecutive
    }


def test_tokens_from_a_cumulative_counter_between_consecutive_steps() -> None:
    sm = _sm([
        (1, "perf/cumulative_num_tokens", 1000.0), (1, "timing_s/step", 10.0),
        (2, "perf/cumulative_num_tokens", 2500.0), (2, "timing_s/step", 10.0),
        (4, "perf/cumulative_num_tokens", 5000.0), (4, "timing_s/step", 10.0),
        (5, "perf/total_num_tokens", 700.0), (5, "perf/cumulative_num_tokens", 9000.0), (5, "timing_s/step", 7.0),
    ])
    out = derive_steps(sm)
    assert out["total_tokens"].to_list() == [None, 1500.0, None, 700.0]  # a logged count wins
    assert out["throughput_tokens_per_s"].to_list() == [None, 150.0, None, pytest.approx(100.0)]
