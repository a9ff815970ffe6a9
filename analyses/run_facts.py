"""Run facts a log implies when ``run.toml`` does not say them: the response-length cap and the
number of GPUs the job used, each with where it came from.

The response cap (``runs.max_response_length`` / ``runs.max_response_length_source``), first
source that gives it:

``run.toml``
    declared by the user;
``config_dump``
    the config a verl console log prints at start (``'max_response_length': N`` in the pretty
    printed ``data`` section, or a ``data.max_response_length=N`` override on the command line);
``clip_ratio``
    ``response_length/clip_ratio > 0`` at a step means some response of that step hit the cap,
    so that step's ``response_length/max`` is the cap (the largest such max over the run);
``sample_flags``
    samples a reader flagged ``truncated`` (from the record's own limit): the shortest of them;
``point_mass``
    a point mass at the maximum of the per-sample response lengths (:func:`point_mass_cap`): for
    token counts spread over many values, several samples landing on the same largest value is
    the signature of a length limit, not chance (the rllm run: 96 of 640 responses at exactly 16000).

The GPU count (``runs.n_gpus`` / ``runs.n_gpus_source``): ``run.toml``; ``config_dump``
(``trainer.nnodes x trainer.n_gpus_per_node`` of a verl config dump); ``telemetry`` (the GPUs
whose utilization is not idle for the whole run, :func:`is_idle_whole_run`).

The batch (``runs.train_batch_size``, ``rollout_n``, ``samples_per_step``, ``batch_source``), which
a fit from per-step summaries needs (:mod:`analyses.fit.summaries`): ``run.toml``, else
``config_dump`` -- verl's ``data.train_batch_size`` (prompts per step) and
``actor_rollout_ref.rollout.n`` (responses per prompt), in the dump or as command-line overrides;
Unsloth's banner ``Total batch size (4 x 1 x 1) = 4`` (completions per optimizer step) and TRL's
``num_generations``; transformers' ``trainer_state.json`` ``train_batch_size`` (the per-device batch
times the process's GPUs). The prompt cap ``runs.max_prompt_length``: run.toml, else the dump's
``data.max_prompt_length``.

A value the logs imply is taken only when plausible (at least 1, at most :data:`MAX_PLAUSIBLE_CAP`
tokens or :data:`MAX_PLAUSIBLE_GPUS` GPUs); otherwise the next source is asked.

The fits read the cap from ``runs`` too (:func:`analyses.fit.continuous.infer_cap` applies the
same :func:`point_mass_cap` rule), so the views, the report and the fits agree on it.
"""

from __future__ import annotations

import re
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Polars in the functions that take frames: the views import this module's constants
    import polars as pl

# point mass at the maximum: at least this many samples exactly at the maximum, among at least
# this many distinct values (a handful of distinct lengths says nothing about a cap)
POINT_MASS_MIN_AT_MAX = 2
POINT_MASS_MIN_DISTINCT = 50
# a verl config dump is printed before the first step: only this much of a console log is read for it
CONFIG_HEAD_BYTES = 4 * 1024 * 1024
# a GPU sample below this utilization is idle (sampling jitter keeps an idle GPU at 0-2 %)
IDLE_UTIL_PCT = 5.0
UTIL_METRIC = "gpu_util_pct"

# a step with fewer training samples than this share of the run's median step is *partial* (a run
# stopped mid-rollout: Search-R1's last step has 47 trajectories after 2048); views flag it and
# leave it out of slopes and means, the fits never fit it
PARTIAL_STEP_SHARE = 0.5

# an inferred fact beyond these is a corrupt log line, not a run (the longest contexts served today are
# ~10 M tokens; the largest training jobs ~100 k GPUs): such a source is passed over as silent
MAX_PLAUSIBLE_CAP = 10_000_000
MAX_PLAUSIBLE_GPUS = 1_000_000

CAP_SOURCES = ("run.toml", "config_dump", "clip_ratio", "sample_flags", "point_mass")
N_GPUS_SOURCES = ("run.toml", "config_dump", "telemetry")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CAP_DUMP = re.compile(r"'max_response_length':\s*(\d+)")
_CAP_ARG = re.compile(r"(?:^|\s)data\.max_response_length=(\d+)")
_TRAINER = re.compile(r"'trainer':\s*\{")
_GPUS_DUMP = re.compile(r"'n_gpus_per_node':\s*(\d+)")
_NODES_DUMP = re.compile(r"'nnodes':\s*(\d+)")
# the dump prints actor_rollout_ref first, so its model.path is the first 'path' string
_MODEL_DUMP = re.compile(r"'path':\s*'([^']+)'")
_MODEL_ARG = re.compile(r"(?:^|\s)actor_rollout_ref\.model\.path=(\S+)")
_GPUS_ARG = re.compile(r"(?:^|\s)trainer\.n_gpus_per_node=(\d+)")
_NODES_ARG = re.compile(r"(?:^|\s)trainer\.nnodes=(\d+)")
_PROMPT_CAP_DUMP = re.compile(r"'max_prompt_length':\s*(\d+)")
_PROMPT_CAP_ARG = re.compile(r"(?:^|\s)data\.max_prompt_length=(\d+)")
_TBS_DUMP = re.compile(r"'train_batch_size':\s*(\d+)")
_TBS_ARG = re.compile(r"(?:^|\s)data\.train_batch_size=(\d+)")
# the dump prints keys sorted: rollout's own 'n' comes before its val_kwargs' 'n'
_ROLLOUT = re.compile(r"'rollout':\s*\{")
_N_DUMP = re.compile(r"'n':\s*(\d+)")
_N_ARG = re.compile(r"(?:^|\s)actor_rollout_ref\.rollout\.n=(\d+)")
# transformers / TRL / Unsloth: the banner's total batch, the config's completions per prompt, trainer_state.json
_TOTAL_BATCH = re.compile(r"Total batch size \([^)]*\)\s*=\s*([\d,]+)")
_NUM_GENERATIONS = re.compile(r"num_generations`? (?:of |[=:]\s*)(\d+)")
_STATE_BATCH = re.compile(r'"train_batch_size":\s*(\d+)')


@dataclass(frozen=True)
class ConfigFacts:
    """What a verl config dump (or the command line printed above it) says, or a transformers
    run's banner and trainer state."""

    max_response_length: int | None = None
    n_gpus: int | None = None
    model: str | None = None
    max_prompt_length: int | None = None
    train_batch_size: int | None = None  # prompts per step
    rollout_n: int | None = None  # responses per prompt (verl rollout.n, TRL num_generations)
    samples_per_step: int | None = None  # responses per step where only their total is said (transformers)

    def merged(self, other: ConfigFacts) -> ConfigFacts:
        """Each fact from ``self`` when it has it, else from ``other`` (files read in order)."""
        return ConfigFacts(*(a if a is not None else b for a, b in zip(astuple(self), astuple(other), strict=True)))


def config_dump_facts(text: str) -> ConfigFacts:
    """The cap and GPU count in the head of a verl console log.

    The cap: the first ``'max_response_length': N`` (only ``data`` has that key), else a
    ``data.max_response_length=N`` override. GPUs: ``n_gpus_per_node`` x ``nnodes`` of the
    ``'trainer': {`` section (the reward-model pool has its own, often 0, earlier in the dump),
    else the command-line overrides. A zero is not a fact. The model: the first ``'path': '...'``
    (the actor's ``model.path``: a hub id or a local path, as written), else the
    ``actor_rollout_ref.model.path=`` override.
    """
    text = _ANSI.sub("", text)
    m = _CAP_DUMP.search(text) or _CAP_ARG.search(text)
    cap = int(m.group(1)) if m and int(m.group(1)) > 0 else None
    gpus = nodes = None
    t = _TRAINER.search(text)
    if t:
        g, n = _GPUS_DUMP.search(text, t.end()), _NODES_DUMP.search(text, t.end())
        gpus, nodes = (int(g.group(1)) if g else None), (int(n.group(1)) if n else None)
    if gpus is None:
        g, n = _GPUS_ARG.search(text), _NODES_ARG.search(text)
        gpus, nodes = (int(g.group(1)) if g else None), (int(n.group(1)) if n else nodes)
    n_gpus = gpus * (nodes or 1) if gpus else None
    m = _MODEL_DUMP.search(text) or _MODEL_ARG.search(text)
    model = m.group(1).rstrip("/") or None if m else None
    rollout = _ROLLOUT.search(text)
    n = _N_DUMP.search(text, rollout.end()) if rollout else None
    n = n or _N_ARG.search(text) or _NUM_GENERATIONS.search(text)
    return ConfigFacts(cap, n_gpus, model, _positive(_PROMPT_CAP_DUMP.search(text) or _PROMPT_CAP_ARG.search(text)),
                       _positive(_TBS_DUMP.search(text) or _TBS_ARG.search(text)), _positive(n),
                       _positive(_TOTAL_BATCH.search(text) or _STATE_BATCH.search(text)))


def _positive(m: re.Match[str] | None) -> int | None:
    v = int(m.group(1).replace(",", "")) if m else 0
    return v if v > 0 else None


def config_dump_file_facts(path: Path) -> ConfigFacts:
    """:func:`config_dump_facts` of the first :data:`CONFIG_HEAD_BYTES` of ``path``."""
    # the readers (numpy) only where a file is read: the views import only this module's constants
    from analyses.readers.base import read_head

    return config_dump_facts(read_head(path, CONFIG_HEAD_BYTES))


def point_mass_cap(max_value: float | None, n_at_max: int, n_distinct: int) -> float | None:
    """The cap a point mass at the maximum implies, or None (the one rule, for views and fits)."""
    if max_value is None or max_value <= 0:
        return None
    if n_at_max >= POINT_MASS_MIN_AT_MAX and n_distinct >= POINT_MASS_MIN_DISTINCT:
        return float(max_value)
    return None


def sample_point_mass_cap(samples: pl.LazyFrame) -> float | None:
    """:func:`point_mass_cap` over the training samples' ``response_tokens``."""
    import polars as pl

    r = (
        samples.filter(~pl.col("validate").fill_null(False) & pl.col("response_tokens").is_not_null())
        .select(mx=pl.col("response_tokens").max(),
                at=(pl.col("response_tokens") == pl.col("response_tokens").max()).sum(),
                nd=pl.col("response_tokens").n_unique())
        .collect()
    )
    return point_mass_cap(r["mx"][0], int(r["at"][0] or 0), int(r["nd"][0] or 0))


def flagged_cap(samples: pl.LazyFrame) -> float | None:
    """The shortest training response a reader flagged ``truncated`` (None when none is)."""
    import polars as pl

    v = (samples.filter(~pl.col("validate").fill_null(False) & pl.col("truncated").fill_null(False))
         .select(pl.col("response_tokens").min()).collect().item())
    return float(v) if v is not None and v > 0 else None


def clip_ratio_cap(step_metrics: pl.LazyFrame) -> float | None:
    """The largest ``response_length/max`` of the training steps whose ``response_length/clip_ratio`` > 0."""
    import polars as pl

    wide = (
        step_metrics.filter(~pl.col("is_validation")
                            & pl.col("metric").is_in(["response_length/max", "response_length/clip_ratio"]))
        .group_by("step", "metric").agg(pl.col("value").last())
        .collect()
    )
    if wide.height == 0:
        return None
    piv = wide.pivot(on="metric", index="step", values="value")
    if not {"response_length/max", "response_length/clip_ratio"} <= set(piv.columns):
        return None
    v = piv.filter(pl.col("response_length/clip_ratio") > 0)["response_length/max"].max()
    return float(v) if v is not None and v > 0 else None


def is_idle_whole_run(max_util: pl.Expr) -> pl.Expr:
    """A GPU idle for the whole run: its utilization never reached :data:`IDLE_UTIL_PCT`."""
    return max_util < IDLE_UTIL_PCT


def telemetry_gpus_used(gpu_samples: pl.LazyFrame) -> int | None:
    """GPUs with utilization samples that are not idle for the whole run (None without utilization)."""
    import polars as pl

    per = (
        gpu_samples.filter((pl.col("metric") == UTIL_METRIC) & pl.col("value").is_not_null())
        .group_by(pl.col("host").fill_null(""), "gpu").agg(mx=pl.col("value").max())
        .collect()
    )
    if per.height == 0:
        return None
    used = per.filter(~is_idle_whole_run(pl.col("mx"))).height
    return used or None


def first_fact(*candidates: tuple[float | int | None, str],
               upper: float = float("inf")) -> tuple[float | int | None, str | None]:
    """The first (value, source) whose value is known and plausible (finite, in ``[1, upper]``),
    else (None, None)."""
    for value, source in candidates:
        if value is not None and 1 <= value <= upper:
            return value, source
    return None, None


@dataclass(frozen=True)
class RunFacts:
    """The run's cap and GPU count, each with its source (one of :data:`CAP_SOURCES` / :data:`N_GPUS_SOURCES`),
    and its batch (``batch_source``: ``run.toml`` or ``config_dump``) and prompt cap."""

    max_response_length: int | None = None
    max_response_length_source: str | None = None
    n_gpus: int | None = None
    n_gpus_source: str | None = None
    max_prompt_length: int | None = None
    train_batch_size: int | None = None
    rollout_n: int | None = None
    samples_per_step: int | None = None
    batch_source: str | None = None


def batch_facts(declared: ConfigFacts, config: ConfigFacts) -> tuple[int | None, int | None, int | None, str | None]:
    """(train batch size, rollout n, samples per step, source): run.toml's when it says any, else
    the config's (one source for the three, so they describe one batch)."""
    for src, f in (("run.toml", declared), ("config_dump", config)):
        if f.train_batch_size or f.samples_per_step:
            return f.train_batch_size, f.rollout_n, f.samples_per_step, src
    n = declared.rollout_n or config.rollout_n
    return None, n, None, None


def infer_run_facts(
    declared_cap: int | None,
    declared_gpus: int | None,
    config: ConfigFacts,
    samples: pl.LazyFrame,
    step_metrics: pl.LazyFrame,
    gpu_samples: pl.LazyFrame,
    declared: ConfigFacts | None = None,
) -> RunFacts:
    """The cap and GPU count from the first source that gives each (lazy: a later source is
    read only when the earlier ones are silent); the batch and the prompt cap from ``declared``
    (run.toml), else ``config``."""
    # run.toml is the user's word (validated when it is read); what logs imply must be plausible
    cap, cap_src = first_fact((declared_cap, "run.toml"))
    for source, fact in (("config_dump", lambda: config.max_response_length), ("clip_ratio", lambda: clip_ratio_cap(step_metrics)),
                         ("sample_flags", lambda: flagged_cap(samples)), ("point_mass", lambda: sample_point_mass_cap(samples))):
        if cap is None:
            cap, cap_src = first_fact((fact(), source), upper=MAX_PLAUSIBLE_CAP)
    gpus, gpus_src = first_fact((declared_gpus, "run.toml"))
    for source, fact in (("config_dump", lambda: config.n_gpus), ("telemetry", lambda: telemetry_gpus_used(gpu_samples))):
        if gpus is None:
            gpus, gpus_src = first_fact((fact(), source), upper=MAX_PLAUSIBLE_GPUS)
    declared = declared or ConfigFacts()
    tbs, n, per_step, batch_src = batch_facts(declared, config)
    return RunFacts(int(cap) if cap is not None else None, cap_src, int(gpus) if gpus is not None else None, gpus_src,
                    declared.max_prompt_length or config.max_prompt_length, tbs, n, per_step, batch_src)


def with_truncation(samples: pl.LazyFrame, cap: int | None) -> pl.LazyFrame:
    """``samples`` with ``truncated`` filled where unknown: the response reached ``cap``."""
    import polars as pl

    if cap is None:
        return samples
    return samples.with_columns(truncated=pl.coalesce(pl.col("truncated"), pl.col("response_tokens") >= cap))


def framework_of(file_formats: list[tuple[str, int]], framework_by_format: dict[str, str | None]) -> str | None:
    """The training framework a run's logs show, when run.toml does not say: among the files that gave
    parsed lines (``(format, rows_ok)``), the framework of the format with the most parsed lines
    (``framework_by_format``: each reader's ``framework``; verl's console and JSONL logs and rollout
    dumps say verl, transformers' console logs and trainer_state.json say trl); None when no such
    file names one (wandb, TensorBoard, telemetry and PolyTrace logs are written by several)."""
    votes: dict[str, int] = {}
    for fmt, rows in file_formats:
        fw = framework_by_format.get(fmt)
        if fw is not None and rows > 0:
            votes[fw] = votes.get(fw, 0) + rows
    return max(sorted(votes), key=lambda f: votes[f]) if votes else None
