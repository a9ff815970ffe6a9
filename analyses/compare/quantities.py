"""Every quantity a comparison measures, declared once: where its per-step values come from, the
statistic over steps, its unit and scale (how a change is sized for the ranking).

Scales: ``ratio`` (positive amounts: seconds, tokens, tokens/s; a change is relative, +38% or x2.4),
``share`` (0..1: a change is in percentage points), ``pct`` (0..100 %: points too), ``signed``
(can be negative: reward, KL; a change is relative to the larger magnitude).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quantity:
    """A per-step series (``source`` view, ``column``) summarized by ``stat`` over the compared steps."""

    key: str  # quantity name before the statistic: gen_time_s -> gen_time_s.median
    label: str  # plain words
    unit: str
    scale: str  # ratio | share | pct | signed
    stat: str  # median | mean
    source: str  # steps | stage_breakdown | training_health | gpu_step_utilization | filter_waste
    column: str
    sample_variable: str | None = None  # a per-sample distribution that supersedes it when both sides have one

    @property
    def name(self) -> str:
        return f"{self.key}.{self.stat}"


def _t(column: str, label: str) -> Quantity:
    return Quantity(column, label, "s", "ratio", "median", "steps", column)


SERIES: tuple[Quantity, ...] = (
    _t("step_time_s", "step time"),
    _t("gen_time_s", "generation time"),
    _t("reward_time_s", "reward time"),
    _t("old_log_prob_time_s", "old log-prob time"),
    _t("ref_time_s", "reference log-prob time"),
    _t("values_time_s", "critic values time"),
    _t("update_actor_time_s", "actor update time"),
    _t("update_critic_time_s", "critic update time"),
    _t("tool_time_s", "tool time"),
    Quantity("throughput_tokens_per_s", "throughput", "tokens/s", "ratio", "median", "steps", "throughput_tokens_per_s"),
    Quantity("total_tokens", "tokens per step", "tokens", "ratio", "median", "steps", "total_tokens"),
    Quantity("stage.rollout_share", "rollout share of the step", "", "share", "median", "stage_breakdown", "rollout_share"),
    Quantity("stage.inference_share", "inference share of the step", "", "share", "median", "stage_breakdown",
             "inference_share"),
    Quantity("stage.training_share", "training share of the step", "", "share", "median", "stage_breakdown",
             "training_share"),
    Quantity("stage.other_share", "unexplained share of the step", "", "share", "median", "stage_breakdown",
             "other_share"),
    Quantity("response_length_mean", "mean response length per step", "tokens", "ratio", "median", "training_health",
             "response_length_mean", "response_length"),
    Quantity("response_length_max", "longest response per step", "tokens", "ratio", "median", "training_health",
             "response_length_max", "response_length"),
    Quantity("truncation_share", "truncation share", "", "share", "mean", "training_health",
             "clip_ratio"),
    Quantity("aborted_share", "aborted responses", "", "share", "mean", "training_health", "aborted_ratio"),
    Quantity("turns_mean", "mean turns per trajectory", "turns", "ratio", "median", "training_health", "turns_mean",
             "turns"),
    Quantity("reward_mean", "mean reward", "", "signed", "median", "training_health", "reward_mean"),
    Quantity("reward_std", "reward spread (std)", "", "ratio", "median", "training_health", "reward_std"),
    Quantity("entropy", "policy entropy", "", "ratio", "median", "training_health", "entropy"),
    Quantity("kl", "KL", "", "signed", "median", "training_health", "kl"),
    Quantity("mfu", "model FLOPs utilization", "", "share", "median", "training_health", "mfu"),
    Quantity("memory_allocated_gb", "peak memory allocated", "GB", "ratio", "median", "training_health",
             "memory_allocated_gb"),
    Quantity("gpu.mean_util_pct", "GPU utilization", "%", "pct", "median", "gpu_step_utilization", "mean_util_pct"),
    Quantity("gpu.idle_share", "GPU idle share", "", "share", "median", "gpu_step_utilization", "idle_share"),
    Quantity("gpu.rollout_idle_share", "GPU idle share during rollout", "", "share", "median", "gpu_step_utilization",
             "rollout_idle_share"),
    Quantity("gpu.spread_max_over_mean", "GPU utilization spread (max/mean)", "x", "ratio", "median",
             "gpu_step_utilization", "spread_max_over_mean"),
    Quantity("filter.filtered_share", "share of generated prompts filtered out", "", "share", "mean", "filter_waste",
             "filtered_share"),
    Quantity("filter.unused_share", "share of generated prompts not trained on", "", "share", "mean", "filter_waste",
             "unused_share"),
    Quantity("filter.gen_batches", "generation batches per step", "batches", "ratio", "mean", "filter_waste",
             "gen_batches"),
)


def imbalance_quantity(phase: str, quantity: str) -> Quantity:
    """max/mean across units of one ``rank_imbalance`` (phase, quantity), per step."""
    what = "longest/mean response in a rollout batch" if phase == "rollout_batch" else f"{phase} {quantity} max/mean"
    return Quantity(f"imbalance.{phase}.{quantity}", what, "x", "ratio", "median", "rank_imbalance", "max_over_mean")


# quantities over time buckets, for runs whose telemetry has no step windows
GPU_TIME = Quantity("gpu.util_pct_over_time", "GPU utilization (over time)", "%", "pct", "mean", "gpu_timeline",
                    "util_pct")


@dataclass(frozen=True)
class Variable:
    """A per-sample variable compared as a distribution: its quantiles and KS / CRPS distances."""

    key: str
    label: str
    unit: str


VARIABLES: tuple[Variable, ...] = (
    Variable("response_length", "response length", "tokens"),
    Variable("prompt_length", "prompt length", "tokens"),
    Variable("turns", "turns per trajectory", "turns"),
    Variable("tool_latency_s", "tool-call latency", "s"),
)
DIST_STATS: tuple[tuple[str, float | None], ...] = (("mean", None), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

# config keys that shape the workload: a change of one ranks by its size; other keys (names,
# paths, logging) are listed after every measured credible difference
WORKLOAD_KEY_PATTERNS = (
    r"max_response_length$", r"max_prompt_length$", r"train_batch_size$", r"ppo_mini_batch_size$",
    r"micro_batch_size(_per_gpu)?$", r"rollout\.n$", r"n_gpus_per_node$", r"nnodes$", r"model\.path$",
    r"tensor_model_parallel_size$", r"gpu_memory_utilization$", r"rollout\.name$", r"rollout\.mode$",
    r"adv_estimator$", r"optim\.lr$", r"kl_coef$", r"kl_loss_coef$", r"use_kl_loss$", r"temperature$", r"top_p$",
    r"clip_ratio(_high|_low)?$", r"entropy_coeff$", r"max_num_batched_tokens$", r"max_num_seqs$",
    r"use_dynamic_bsz$", r"max_token_len_per_gpu$", r"max_turns$", r"multi_turn\.enable$", r"total_epochs$",
    r"total_training_steps$", r"loss_agg_mode$",
)

# run facts compared (runs columns) and their words; sources say where each came from
RUN_FACTS: tuple[tuple[str, str, str, str | None], ...] = (
    ("model", "model", "", None),
    ("framework", "framework", "", None),
    ("task", "task", "", None),
    ("n_gpus", "GPUs", "GPUs", "n_gpus_source"),
    ("max_response_length", "response cap", "tokens", "max_response_length_source"),
    ("max_prompt_length", "prompt cap", "tokens", None),
    ("tags", "run.toml tags", "", None),
)
