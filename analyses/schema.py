"""The warehouse contract: one schema class per table.

Every reader emits frames that :func:`conform` turns into exactly these columns and dtypes;
the warehouse writes them, the DuckDB catalog exposes them, and the asset checks validate them.
``run_id`` is not stored inside the Parquet files: it is the hive partition key
(``parquet/<table>/run_id=<id>/``) and both DuckDB and Polars read it back from the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Polars only where a frame is built or cast: `polytrace query`/`runs` never load it
    import polars as pl


@dataclass(frozen=True)
class Table:
    """A warehouse table: its columns (in order) with their DuckDB types, key, and what one row is.

    The types are declared as DuckDB names (:data:`S`, :data:`I64`, ...) so that the catalog
    needs no Polars; :attr:`columns` gives them as Polars dtypes for the readers and writers."""

    name: str
    row: str
    types: dict[str, str]
    key: tuple[str, ...] = ()
    docs: dict[str, str] = field(default_factory=dict)

    @cached_property
    def columns(self) -> dict[str, pl.DataType]:
        """The columns as Polars dtypes (what every reader's frame is conformed to)."""
        return {k: polars_type(v) for k, v in self.types.items()}

    @property
    def stored_columns(self) -> dict[str, pl.DataType]:
        """Columns written to Parquet (all but the partition key)."""
        return {k: v for k, v in self.columns.items() if k != "run_id"}

    def empty(self) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame(schema=self.columns)


# the contract's column types, as DuckDB names them (:func:`polars_type` maps each to Polars)
S, I64, I32, F64, B, DT = "VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "BOOLEAN", "TIMESTAMP WITH TIME ZONE"

RUNS = Table(
    "runs",
    "run",
    {
        "run_id": S,
        "task": S,
        "framework": S,
        "model": S,
        "n_gpus": I64,
        "max_response_length": I64,
        "max_prompt_length": I64,
        "started_at": DT,
        "source_dir": S,
        "tags": S,  # JSON object of free-form run.toml tags
        "n_files": I64,
        "n_gpus_source": S,
        "max_response_length_source": S,
        "train_batch_size": I64,
        "rollout_n": I64,
        "samples_per_step": I64,
        "batch_source": S,
    },
    key=("run_id",),
    docs={
        "task": "what the run trains on (run.toml `task`, e.g. math, search, code, video); NULL when not given",
        "framework": "training framework: run.toml `framework`, else what the logs' formats show (verl console/JSONL "
        "logs and rollout dumps: verl; TRL/transformers console logs and trainer_state.json: trl; the format with the "
        "most parsed lines wins); NULL when neither says (wandb, TensorBoard, telemetry, PolyTrace logs alone)",
        "model": "run.toml's model, else the actor's model.path in a verl config dump (a hub id or a local path, as "
        "written); NULL when neither says",
        "n_gpus": "GPUs the job used: run.toml, else a verl config dump (nnodes x n_gpus_per_node), else the GPUs "
        "whose telemetry is not idle for the whole run (see n_gpus_source; analyses.run_facts)",
        "max_response_length": "the response-length cap: run.toml, else a verl config dump, else response_length/max "
        "at steps with clip_ratio > 0, else the shortest response a reader flagged truncated, else a point mass at "
        "the longest response (see max_response_length_source; analyses.run_facts)",
        "max_prompt_length": "prompt cap in tokens (run.toml, else a verl config dump's data.max_prompt_length)",
        "train_batch_size": "prompts per training step (run.toml, else verl's data.train_batch_size in a config dump or "
        "command line; see batch_source)",
        "rollout_n": "responses per prompt (run.toml, else verl's actor_rollout_ref.rollout.n, TRL's num_generations)",
        "samples_per_step": "responses per step where only their total is logged (Unsloth's `Total batch size`, "
        "transformers' trainer_state.json train_batch_size)",
        "batch_source": "where train_batch_size / samples_per_step came from: run.toml | config_dump (NULL: unknown)",
        "started_at": "when the run started (run.toml `started_at`, UTC)",
        "source_dir": "the directory (or file) the run was ingested from, as given to `polytrace ingest`",
        "tags": "JSON object of the free-form run.toml [tags]",
        "n_gpus_source": "where n_gpus came from: run.toml | config_dump | telemetry (NULL: unknown)",
        "max_response_length_source": "where max_response_length came from: run.toml | config_dump | clip_ratio | "
        "sample_flags | point_mass (NULL: unknown)",
        "n_files": "input files of the run, every status counted (see source_files)",
    },
)

RUN_CONFIG = Table(
    "run_config",
    "run × config key",
    {
        "run_id": S,
        "key": S,
        "value": S,
        "source": S,
        "path": S,
    },
    key=("run_id", "key"),
    docs={
        "key": "dotted config key as the framework names it (data.max_response_length, "
        "actor_rollout_ref.rollout.n, trainer.n_gpus_per_node)",
        "value": "the value as JSON text (512, 1e-06, \"vllm\", true, null, [\"model\", \"optimizer\"]); values "
        "over 2,000 characters are cut",
        "source": "config_dump (the resolved config a verl console log prints at start; parsed, never evaluated) "
        "or command_line (the launch command's Hydra overrides, when the log prints no dump); "
        "analyses.config_dump",
        "path": "the input file it was read from (relative to the run)",
    },
)

SOURCE_FILES = Table(
    "source_files",
    "input file",
    {
        "run_id": S,
        "path": S,  # relative to the run directory (the file name for a single-file run)
        "sha256": S,
        "bytes": I64,
        "format": S,  # reader name, or "unknown"
        "lines": I64,  # physical lines (records for whole-document JSON)
        "rows_ok": I64,  # lines/records parsed into rows
        "rows_rejected": I64,  # lines/records rejected (see `rejects`)
        "rows_skipped": I64,  # lines skipped by a documented rule (blank, banner, config dump, ...)
        "rows_out": I64,  # rows emitted into warehouse tables
        "rows_superseded": I64,  # step metrics / telemetry samples also carried by a later line or another file, stored once
        "rows_repeated": I64,  # of rows_superseded: step metrics this same file logged again later (a step re-logged)
        "status": S,  # ok | partial | no_data | error | unsupported | empty | skipped
        "error": S,
    },
    key=("run_id", "path"),
    docs={
        "path": "relative to the run directory (the file name for a single-file run), '/'-separated",
        "sha256": "digest of the file's bytes as stored on disk (compressed bytes for .gz); NULL when not read",
        "bytes": "size on disk",
        "format": "the reader that recognized the file by content (README: formats), or unknown",
        "rows_ok": "lines/records parsed into rows",
        "rows_skipped": "lines skipped by a documented rule of the reader (blank lines, banners, config dumps, "
        "progress bars, lines that are not records)",
        "rows_out": "rows this file contributed to warehouse tables (one line may give many rows)",
        "error": "why the file is no_data, error, unsupported, empty or skipped; for partial, how many lines were "
        "rejected and the first reason (all of them are in rejects); NULL for ok",
        "lines": "rows_ok + rows_rejected + rows_skipped == lines for every status other than error; for error, the "
        "lines read before it (and rows_* 0: nothing of the file lands)",
        "status": "ok, partial (some lines rejected), no_data (read to its end, but no line parsed: every line "
        "skipped or rejected; `error` says how many of each), error (the file could not be read; `error` says why), "
        "unsupported (no reader recognizes it), empty, or skipped (not read as a log: the run's run.toml and "
        "tokenizer, a hidden file or directory, a symlink out of the run directory, a directory symlink, a "
        "dangling link; `error` says which). Every file under a run directory has a row",
        "rows_superseded": "step_metrics rows of this file not stored because the run has a better copy of the same "
        "key (step, metric, is_validation): a later line of the same file (a step logged again: the later occurrence "
        "wins, docs/integrity.md), or another file: a wandb run directory holds the binary history and the console's "
        "output.log, and the wandb file's copy is kept (then JSONL, then console text; between files of one kind the "
        "later in path order, as in steps); rows_out no longer counts them. Likewise a telemetry sample (host, gpu, ts, "
        "metric, value) that two files hold (one DCGM scrape saved twice) is kept from the first file in path order",
        "rows_repeated": "of rows_superseded, the rows a later line of this same file logged again (a log concatenated "
        "to itself, a run restarted into the same log); more than a small share raises the superseded_share check",
        "rows_rejected": "whole lines/records rejected; `rejects` may hold more rows than this, because a parsed "
        "line can also lose a part (a non-numeric pair, the tail of a line cut at 4096 characters) "
        "that is recorded there",
    },
)

STEP_METRICS = Table(
    "step_metrics",
    "run × step × metric",
    {
        "run_id": S,
        "step": I64,
        "metric": S,  # canonical name (timing/* -> timing_s/*)
        "value": F64,
        "raw_metric": S,  # name as written in the log
        "is_validation": B,
        "path": S,
        "line_no": I64,
    },
    key=("run_id", "step", "metric", "is_validation"),
    docs={
        'step': 'training step the metric was logged for (as the log numbers it)',
        'metric': 'canonical name (analyses.steps: timing/* -> timing_s/*, framework aliases -> one name)',
        'value': 'the logged number (float64; a non-numeric value is a `rejects` row instead)',
        'raw_metric': 'the name as written in the log',
        'is_validation': 'a validation metric (val-*, val/*, test_score/*), logged at validation steps',
        'path': 'the input file it came from (relative to the run)',
        'line_no': 'line (or record) of that file, 1-based',
    },
)

STEPS = Table(
    "steps",
    "run × training step",
    {
        "run_id": S,
        "step": I64,
        "step_time_s": F64,
        "step_time_source": S,  # logged, tqdm_elapsed, tqdm_rate, sum_of_stages, log_ts_diff (analyses.steps.STEP_TIME_SOURCES)
        "gen_time_s": F64,
        "reward_time_s": F64,
        "old_log_prob_time_s": F64,
        "ref_time_s": F64,
        "values_time_s": F64,
        "adv_time_s": F64,
        "update_actor_time_s": F64,
        "update_critic_time_s": F64,
        "tool_time_s": F64,
        "total_tokens": F64,
        "throughput_tokens_per_s": F64,
        "response_len_mean": F64,
        "response_len_max": F64,
        "response_len_min": F64,
        "response_clip_ratio": F64,
        "prompt_len_mean": F64,
        "prompt_len_max": F64,
        "prompt_len_min": F64,
        "ts": DT,  # wall-clock time the step line was logged, when the log says it
        "has_validation": B,
        "truncated_line": B,  # the step's log line was cut by the console capture
    },
    key=("run_id", "step"),
    docs={
        'step': 'training step',
        'step_time_s': 'wall seconds of the step, from the best source the log has (see step_time_source)',
        'step_time_source': "logged (the trainer's own step time), tqdm_elapsed / tqdm_rate (the progress bar), sum_of_stages (the stage times added), log_ts_diff (time between consecutive step lines)",
        'gen_time_s': 'rollout (generation) seconds: timing_s/gen or its aliases (analyses.steps.STEP_COLUMNS)',
        'reward_time_s': 'reward computation seconds (timing_s/reward)',
        'old_log_prob_time_s': "seconds recomputing the old policy's log-probs (timing_s/old_log_prob)",
        'ref_time_s': 'reference-model log-prob seconds (timing_s/ref)',
        'values_time_s': 'critic value seconds (timing_s/values)',
        'adv_time_s': 'advantage computation seconds (timing_s/adv)',
        'update_actor_time_s': 'actor update (training) seconds (timing_s/update_actor)',
        'update_critic_time_s': 'critic update seconds (timing_s/update_critic)',
        'tool_time_s': "tool-call seconds of the step (timing_s/tool_calls, or the slowest agent loop's)",
        'total_tokens': 'tokens processed in the step (perf/total_num_tokens, or the difference of a cumulative counter)',
        'throughput_tokens_per_s': "the job's tokens per second: total_tokens / step_time_s (verl's per-GPU perf/throughput stays in step_metrics)",
        'response_len_mean': "mean response length of the step's batch (tokens; response_length/mean)",
        'response_len_max': 'longest response of the batch (tokens)',
        'response_len_min': 'shortest response of the batch (tokens)',
        'response_clip_ratio': 'share of responses cut at the length cap (response_length/clip_ratio)',
        'prompt_len_mean': 'mean prompt length of the batch (tokens)',
        'prompt_len_max': 'longest prompt (tokens)',
        'prompt_len_min': 'shortest prompt (tokens)',
        'ts': 'wall-clock time the step was logged, when the log says it (UTC)',
        'has_validation': 'validation metrics were logged at this step',
        'truncated_line': "the step's log line was cut by the console capture (its tail is a `rejects` row)",
    },
)

SAMPLES = Table(
    "samples",
    "rollout sample",
    {
        "run_id": S,
        "step": I64,
        "sample_id": S,
        "group_id": S,
        "rank": I64,
        "dp_rank": I64,
        "tp_rank": I64,
        "local_index": I64,
        "task": S,
        "prompt_tokens": I64,
        "response_tokens": I64,
        "n_turns": I64,
        "n_tool_calls": I64,
        "finish_reason": S,
        "truncated": B,
        "reward": F64,
        "validate": B,
        "token_source": S,  # 'recorded' | 'tokenizer' | 'estimate_chars_div_4' ...
        "path": S,
        "line_no": I64,
        "generated_tokens": I64,  # model-generated (loss-masked) response tokens, tool outputs excluded
    },
    key=("run_id", "step", "sample_id"),
    docs={
        "step": "training step the sample was generated for",
        "sample_id": "unique within (run, step): from the source's own ids, else from rank, group and position",
        "group_id": "the prompt group (GRPO: samples of one prompt share it); NULL when the source has none",
        "rank": "global rank that generated the sample, when the source records it",
        "dp_rank": "data-parallel rank, when recorded",
        "tp_rank": "tensor-parallel rank, when recorded",
        "local_index": "position of the prompt within its rank's batch (PolyTrace v2), when recorded",
        "task": "task of the sample (the source's own field, else run.toml `task`)",
        "prompt_tokens": "prompt length in tokens (the first turn's prompt for multi-turn samples)",
        "response_tokens": "response length in tokens, tool outputs included for multi-turn samples",
        "n_turns": "assistant turns (1 for single-turn samples)",
        "n_tool_calls": "tool calls over all turns (0 when none)",
        "finish_reason": "why generation stopped (stop, length, abort, ...), as the source names it; NULL when absent",
        "truncated": "the response hit the cap (response_tokens >= the run's response cap); NULL when unknown "
        "(no cap known, or token counts estimated)",
        "reward": "the sample's reward, when recorded",
        "validate": "a validation sample (not used for training)",
        "token_source": "where token counts come from: recorded (the log's own counts), tokenizer (a local "
        "tokenizer.json), or estimate_chars_div_4 (documented estimate from text length)",
        "path": "source file (relative to the run directory)",
        "line_no": "1-based line (record) of the source file",
        "generated_tokens": "model-generated response tokens (loss-masked), tool outputs excluded; NULL when the "
        "source does not say",
    },
)

TURNS = Table(
    "turns",
    "turn of a multi-turn sample",
    {
        "run_id": S,
        "step": I64,
        "sample_id": S,
        "turn": I64,
        "prompt_tokens": I64,
        "cached_tokens": I64,
        "completion_tokens": I64,
        "engine_latency_s": F64,
        "finish_reason": S,
    },
    key=("run_id", "step", "sample_id", "turn"),
    docs={
        'step': 'training step of the trajectory',
        'sample_id': 'the trajectory (a `samples` row)',
        'turn': 'turn index within the trajectory, from 0',
        'prompt_tokens': 'context tokens sent to the engine for this turn (prompt plus earlier turns and tool results)',
        'cached_tokens': 'of those, tokens served from the prefix cache',
        'completion_tokens': 'tokens the model generated in this turn',
        'engine_latency_s': 'inference engine seconds for this turn',
        'finish_reason': 'why generation stopped (stop, length, tool_call, ...)',
    },
)

TOOL_CALLS = Table(
    "tool_calls",
    "tool call",
    {
        "run_id": S,
        "step": I64,
        "sample_id": S,
        "turn": I64,
        "call_index": I64,
        "tool_name": S,
        "latency_s": F64,
        "status": S,
        "response_tokens": I64,
    },
    key=("run_id", "step", "sample_id", "turn", "call_index"),
    docs={
        'step': 'training step of the trajectory',
        'sample_id': 'the trajectory (a `samples` row)',
        'turn': 'the turn that issued the call',
        'call_index': 'order of the call within its turn, from 0',
        'tool_name': 'the tool called (search, code, ...)',
        'latency_s': 'seconds until the tool answered',
        'status': 'how the call ended; success / ok / succeeded are successes (TOOL_OK_STATUSES), any other value a failure, NULL unknown',
        'response_tokens': "tokens of the tool's answer appended to the context",
    },
)

# tool_calls.status values that mean the call returned normally (compared lower-cased); any other
# non-NULL status is a failure, NULL is neither
TOOL_OK_STATUSES = ("success", "ok", "succeeded")

RANK_TIMES = Table(
    "rank_times",
    "run × step × rank × phase",
    {
        "run_id": S,
        "step": I64,
        "rank": I64,
        "dp_rank": I64,
        "host": S,
        "phase": S,  # reward | iteration | gpu_busy | gpu_idle | comm | compute | memcpy | ...
        "seconds": F64,
        "tokens": I64,
        "n_samples": I64,
        "source": S,  # reader that produced the row
        "tokens_max": I64,  # longest single sample's tokens on that rank (PolyTrace reward timings)
    },
    key=("run_id", "step", "rank", "phase"),
    docs={
        "step": "training step",
        "rank": "global rank (worker) the time belongs to",
        "dp_rank": "data-parallel rank, when recorded",
        "host": "host name, when recorded",
        "phase": "what the time measures: reward, iteration, gpu_busy, gpu_idle, comm, compute, memcpy, ...",
        "seconds": "duration of the phase on that rank in that step; a source of normalised times keeps its "
        "unit in `source` (PAI worker times are ratios, not seconds)",
        "tokens": "tokens that rank processed in that phase, when recorded",
        "n_samples": "samples that rank processed, when recorded",
        "source": "the reader that produced the row",
        "tokens_max": "longest single sample's tokens on that rank (PolyTrace reward timings)",
    },
)

# --- PyTorch profiler (Kineto) traces: analyses/trace/model.py says how each column is derived -----

_TRACE_COMMON_DOCS = {
    "path": "the trace file (relative to the run): one file per rank",
    "rank": "the trace's rank (distributedInfo.rank, else rank-N in the file name)",
    "ev": "the event's number in the file's traceEvents, from 1 (as rejects.line_no counts them)",
    "ts_us": "start, microseconds on the trace's clock (ns-resolution traces rounded as HTA does: ceil(ts), "
    "floor(ts + dur) - ceil(ts))",
    "dur_us": "duration, microseconds (after the same rounding: may be 0, or -1 for a sub-µs event, as in HTA)",
    "step": "the ProfilerStep#N whose CPU window holds the event (a GPU event: its launch's)",
    "stage": "the RL stage (analyses/trace/stages.py: gen, reward, old_log_prob, ref, values, adv, update_critic, "
    "update_actor, ...) of the innermost stage span covering the event's start (a GPU event: its launch); NULL "
    "outside every stage span",
    "in_hta_window": "in HolisticTraceAnalysis's analysis window: with two or more ProfilerSteps, CPU-side events that "
    "start before the last ProfilerStep starts and the GPU events they launched; else every event",
    "pid": "process id as the trace writes it", "tid": "thread id (CPU) or lane (GPU) as the trace writes it",
    "correlation": "links a CUDA runtime call to the GPU work it launched",
}

TRACE_RANKS = Table(
    "trace_ranks",
    "profiler trace file (one rank)",
    {
        "run_id": S, "path": S, "rank": I64, "world_size": I64, "n_events": I64, "n_gpu_events": I64, "n_ops": I64,
        "n_steps": I64, "first_ts_us": F64, "last_end_us": F64, "hta_window_end_us": F64, "hta_span_us": F64,
        "ns_resolution": B, "display_time_unit": S, "base_time_ns": I64, "stage_spans": I64, "truncated": B,
    },
    key=("run_id", "path"),
    docs={
        **_TRACE_COMMON_DOCS,
        "world_size": "distributedInfo.world_size",
        "n_events": "events in traceEvents (complete or not)",
        "n_gpu_events": "rows in trace_kernels", "n_ops": "rows in trace_ops",
        "n_steps": "ProfilerStep#N windows (CPU side)",
        "first_ts_us": "earliest start of a complete event", "last_end_us": "latest end of a complete event",
        "hta_window_end_us": "start of the last ProfilerStep, where HTA's window ends (NULL: fewer than two steps, "
        "no window)",
        "hta_span_us": "HTA's trace duration: last minus first start among the window's events",
        "ns_resolution": "timestamps carry fractions of a microsecond (rounded as HTA does)",
        "display_time_unit": "the trace's displayTimeUnit (ms or ns): a viewer's label only, ts and dur stay µs",
        "base_time_ns": "baseTimeNanoseconds: Unix time of the trace clock's origin, when written",
        "stage_spans": "user annotations naming an RL stage",
        "truncated": "the file ends inside traceEvents (see rejects)",
    },
)

TRACE_KERNELS = Table(
    "trace_kernels",
    "GPU event of a profiler trace (kernel, memcpy, memset, CUDA sync)",
    {
        "run_id": S, "path": S, "rank": I64, "ev": I64, "stream": I64, "device": I64, "pid": S, "tid": S,
        "correlation": I64, "cat": S, "name": S, "kernel_type": S, "ts_us": F64, "dur_us": F64, "bytes": I64,
        "memory_bw_gbps": F64, "launch_ev": I64, "launch_name": S, "launch_ts_us": F64, "launch_dur_us": F64,
        "launch_pid": S, "launch_tid": S, "launch_pos": I64, "link_pos": I64, "step": I64, "step_by_launch": B,
        "stage": S, "in_hta_window": B,
    },
    key=("run_id", "path", "ev"),
    docs={
        **_TRACE_COMMON_DOCS,
        "stream": "CUDA stream", "device": "GPU index",
        "cat": "kernel, gpu_memcpy, gpu_memset, cuda_sync, ...", "name": "kernel name as written",
        "kernel_type": "HTA's kernel type: COMMUNICATION (^nccl.*Kernel), MEMORY (^Memcpy|^Memset|^dma), COMPUTATION "
        "(neither, and not HTA's ^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)), OTHER",
        "bytes": "bytes moved (memcpy, memset)", "memory_bw_gbps": "the trace's memory bandwidth (GB/s) of a memcpy/memset",
        "launch_ev": "ev of the CPU-side event with the same correlation (the last in file order, as HTA)",
        "launch_name": "cudaLaunchKernel, cudaMemcpyAsync, ...", "launch_ts_us": "launch start",
        "launch_dur_us": "launch duration", "launch_pid": "launching process", "launch_tid": "launching thread",
        "launch_pos": "the launch's trace_ops.pos (for call-stack joins)",
        "link_pos": "pos of the main-thread annotation a backward-thread launch hangs under (HTA's CallGraph)",
        "step_by_launch": "the step is the launch's; false: no launch in a step window, the step holding the event's own "
        "start (HTA leaves those without an iteration)",
    },
)

TRACE_OPS = Table(
    "trace_ops",
    "CPU-side event of a profiler trace (cpu_op, user_annotation, cuda_runtime, python_function, gpu_user_annotation, ...)",
    {
        "run_id": S, "path": S, "rank": I64, "ev": I64, "cat": S, "name": S, "pid": S, "tid": S, "ts_us": F64,
        "dur_us": F64, "correlation": I64, "step": I64, "stage": S, "in_hta_window": B, "depth": I64, "pos": I64,
        "sub_end": I64, "link_pos": I64, "num_kernels": I64, "kernel_dur_sum_us": F64,
    },
    key=("run_id", "path", "ev"),
    docs={
        **_TRACE_COMMON_DOCS,
        "cat": "the event's category (cpu_op, user_annotation, cuda_runtime, ...)", "name": "as written",
        "step": "the ProfilerStep#N whose CPU window holds the event's start",
        "depth": "call-stack depth on its pid/tid lane, 0 = top level (HTA's CallStackGraph; backward-thread ops hang "
        "under the main thread's ## backward ## / ProfilerStep annotation); NULL on lanes HTA takes for GPU lanes",
        "pos": "the event's place in its lane's start order, unique within the file",
        "sub_end": "its descendants are the ops with pos in (pos, sub_end)",
        "link_pos": "for a backward-thread op: pos of the main-thread annotation its top-level op hangs under",
        "num_kernels": "GPU kernels (HTA's window, stream > 0) launched in its subtree",
        "kernel_dur_sum_us": "their summed duration",
    },
)

GPU_SAMPLES = Table(
    "gpu_samples",
    "telemetry sample",
    {
        "run_id": S,
        "host": S,
        "gpu": S,  # index or UUID as the source names it
        "ts": DT,
        "metric": S,  # canonical metric (gpu_util_pct, mem_used_mib, power_w, ...)
        "value": F64,
        "source": S,
        "quality": S,  # null = as read; 'counter_reset' = counter repaired from here on (telemetry_units)
    },
    key=("run_id", "host", "gpu", "ts", "metric"),
    docs={
        "host": "host name (the telemetry's own label, else the file's)",
        "gpu": "GPU index or UUID as the source names it",
        "ts": "sample time, UTC",
        "metric": "canonical metric: gpu_util_pct, mem_util_pct, mem_used_mib, power_w, sm_clock_mhz, ... (telemetry_units)",
        "value": "in the canonical metric's unit (telemetry_units converts bytes, W, ratios)",
        "source": "the reader that produced the row",
        "quality": "NULL = as read; counter_reset = a cumulative counter repaired from here on",
    },
)

FILTER_BATCHES = Table(
    "filter_batches",
    "generation batch of a filtering (DAPO) run",
    {
        "run_id": S,
        "trainer_step": I64,
        "gen_batch": I64,
        "prompts_generated": I64,
        "prompts_kept": I64,
        "prompts_used": I64,
        "train_batch_size": I64,
        "samples_generated": I64,
        "samples_kept": I64,
        "path": S,
        "line_no": I64,
        "workload_step": I64,  # the packed_lengths_step_N file holding this generation batch
    },
    key=("run_id", "trainer_step", "gen_batch"),
    docs={
        'trainer_step': 'the training step these generation batches fed',
        'gen_batch': 'generation batch within the trainer step, from 1',
        'prompts_generated': 'prompts sampled in the batch',
        'prompts_kept': 'prompts that passed the filter (e.g. non-zero reward variance)',
        'prompts_used': 'kept prompts that went into the training batch (kept beyond the batch size are surplus)',
        'train_batch_size': 'prompts per training batch',
        'samples_generated': 'responses generated (prompts x n)',
        'samples_kept': 'responses of the kept prompts',
        'path': 'the input file (dapo_filter_indices.jsonl)',
        'line_no': 'its line',
        'workload_step': 'the packed_lengths_step_N file holding this generation batch',
    },
)

STEP_WINDOWS = Table(
    "step_windows",
    "run × step time window (for aligning telemetry)",
    {
        "run_id": S,
        "step": I64,
        "start_ts": DT,
        "end_ts": DT,
        "rollout_end_ts": DT,
        "method": S,  # how the window was obtained
    },
    key=("run_id", "step"),
    docs={
        'step': 'training step',
        'start_ts': 'when the step started (UTC)',
        'end_ts': 'when it ended (UTC); telemetry samples in [start_ts, end_ts) belong to the step',
        'rollout_end_ts': 'when its rollout (generation) ended, when the log gives a generation time',
        'method': 'how the window was obtained: log timestamps, wandb history, or started_at plus cumulative step times',
    },
)

REJECTS = Table(
    "rejects",
    "rejected input line/record",
    {
        "run_id": S,
        "path": S,
        "line_no": I64,
        "reason": S,
        "raw": S,  # first 500 characters
    },
    docs={
        "path": "the input file (relative to the run)",
        "line_no": "line (or record) of that file, 1-based",
        "reason": "why it was rejected (a short code and detail)",
        "raw": "the rejected text, cut at RAW_MAX_CHARS characters",
    },
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        RUNS,
        RUN_CONFIG,
        SOURCE_FILES,
        STEP_METRICS,
        STEPS,
        SAMPLES,
        TURNS,
        TOOL_CALLS,
        RANK_TIMES,
        GPU_SAMPLES,
        FILTER_BATCHES,
        STEP_WINDOWS,
        REJECTS,
        TRACE_RANKS,
        TRACE_KERNELS,
        TRACE_OPS,
    )
}

RAW_MAX_CHARS = 500

RUN_ID_DOC = "run id; the hive partition key (parquet/<table>/run_id=<id>/)"


def table_description(table: Table | str) -> str:
    """What a table is, in the words Dagster, the DuckDB catalog and the Parquet files all show."""
    t = TABLES[table] if isinstance(table, str) else table
    return (f"PolyTrace warehouse table {t.name}: one row per {t.row}"
            + (f"; key ({', '.join(t.key)})" if t.key else "") + ". Columns and meanings: analyses/schema.py.")


def column_docs(table: Table | str) -> dict[str, str | None]:
    """Each column's description as every tool shows it (key columns say so; run_id is the partition)."""
    t = TABLES[table] if isinstance(table, str) else table
    out: dict[str, str | None] = {}
    for name in t.types:
        doc = t.docs.get(name)
        if name == "run_id":
            doc = RUN_ID_DOC
        elif name in t.key:
            doc = f"key column{'; ' + doc if doc else ''}"
        out[name] = doc
    return out


def parquet_metadata(table: Table | str) -> dict[str, str]:
    """The key-value metadata every published Parquet file of ``table`` carries: ``polytrace.table``,
    ``polytrace.description`` and ``polytrace.columns`` (JSON: column -> description), so pyarrow,
    DuckDB's ``parquet_kv_metadata`` and Spark readers find the meaning beside the data."""
    import json

    t = TABLES[table] if isinstance(table, str) else table
    docs = {k: v for k, v in column_docs(t).items() if k != "run_id" and v}
    return {"polytrace.table": t.name, "polytrace.description": table_description(t),
            "polytrace.columns": json.dumps(docs, ensure_ascii=False)}


def conform(df: pl.DataFrame | pl.LazyFrame, table: Table | str) -> pl.DataFrame:
    """Cast ``df`` to ``table``'s columns in contract order; missing columns become nulls.

    Columns the contract does not name are dropped: a reader that finds more should add them
    to the schema, where they are documented, rather than smuggle them through.
    """
    import polars as pl

    t = TABLES[table] if isinstance(table, str) else table
    lf = df.lazy() if isinstance(df, pl.DataFrame) else df
    have = set(lf.collect_schema().names())
    exprs = [
        (pl.col(name).cast(dtype, strict=False) if name in have else pl.lit(None, dtype=dtype)).alias(name)
        for name, dtype in t.columns.items()
    ]
    return lf.select(exprs).collect()


def polars_type(sql_type: str) -> pl.DataType:
    """The Polars dtype of a contract column type (:data:`S`, :data:`I64`, ...)."""
    import polars as pl

    types = {S: pl.String(), I64: pl.Int64(), I32: pl.Int32(), F64: pl.Float64(), B: pl.Boolean(),
             DT: pl.Datetime("us", "UTC")}
    try:
        return types[sql_type]
    except KeyError:
        raise TypeError(f"no Polars dtype for the contract type {sql_type!r}") from None
