"""Helpers for the view tests: stage hand-made frames as runs of a throw-away warehouse."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analyses.api import PolyTrace
from analyses.warehouse import RunStaging


def stage_run(root: Path, run_id: str, tables: dict[str, pl.DataFrame | dict], **run_attrs: object) -> None:
    """Write ``tables`` (frames or column dicts) as run ``run_id``; a ``runs`` row is added from ``run_attrs``."""
    st = RunStaging(root, run_id)
    st.add("runs", pl.DataFrame([{"run_id": run_id, **run_attrs}]))
    for name, df in tables.items():
        st.add(name, df if isinstance(df, pl.DataFrame) else pl.DataFrame(df))
    st.commit()


def rows(con, sql: str) -> list[dict]:  # noqa: ANN001 - duckdb connection
    return con.sql(sql).pl().to_dicts()


def open_wh(root: Path):  # noqa: ANN201
    return PolyTrace(root).connect()


def build_demo_warehouse(root: Path, seed: int = 7) -> list[str]:
    """A small synthetic warehouse touching every view: returns its run ids.

    run 'math-a': 6 steps x 64 samples on 2 DP ranks (log-normal lengths, a long tail at step 4),
    step timings, global_seqlen, rank_times, 2 GPUs of telemetry aligned by step windows.
    run 'agent-b': multi-turn trajectories with tool calls. run 'dapo-c': DAPO filter batches.
    """
    from datetime import UTC, datetime, timedelta

    import numpy as np

    rng = np.random.default_rng(seed)
    n_steps, per_step = 6, 64
    step = np.repeat(np.arange(1, n_steps + 1), per_step)
    resp = np.minimum(rng.lognormal(5.5, 0.6, step.size).astype(int) + 1, 4096)
    resp[(step == 4)[: resp.size].nonzero()[0][:3]] = 4096  # three truncated responses at step 4
    samples = pl.DataFrame({
        "step": step, "sample_id": [f"{s}-{i}" for s, i in zip(step, range(step.size), strict=True)],
        "group_id": [f"{s}-g{i // 8}" for s, i in zip(step, range(step.size), strict=True)],
        "dp_rank": (np.arange(step.size) // 32) % 2, "prompt_tokens": rng.integers(100, 900, step.size),
        "response_tokens": resp,
    })
    t0 = datetime(2026, 6, 1, tzinfo=UTC)
    gen = rng.uniform(40, 60, n_steps)
    gen[3] = 140.0  # the long-tail step
    steps = pl.DataFrame({
        "step": np.arange(1, n_steps + 1), "gen_time_s": gen, "reward_time_s": rng.uniform(5, 8, n_steps),
        "old_log_prob_time_s": rng.uniform(4, 6, n_steps), "ref_time_s": rng.uniform(4, 6, n_steps),
        "update_actor_time_s": rng.uniform(20, 25, n_steps),
    }).with_columns(step_time_s=pl.sum_horizontal(pl.exclude("step")) + 3.0, step_time_source=pl.lit("logged"))
    tokens = samples.group_by("step").agg((pl.col("prompt_tokens") + pl.col("response_tokens")).sum().alias("tok"))
    steps = steps.join(tokens, on="step").with_columns(
        throughput_tokens_per_s=pl.col("tok") / pl.col("step_time_s"), total_tokens=pl.col("tok").cast(pl.Float64)
    ).drop("tok")
    ends = np.cumsum(steps.sort("step")["step_time_s"].to_numpy())
    starts = np.concatenate([[0.0], ends[:-1]])
    windows = pl.DataFrame({
        "step": np.arange(1, n_steps + 1),
        "start_ts": [t0 + timedelta(seconds=float(s)) for s in starts],
        "end_ts": [t0 + timedelta(seconds=float(e)) for e in ends],
    })
    ts = [t0 + timedelta(seconds=float(x)) for x in np.arange(0, ends[-1], 5.0)]
    util = [np.clip(rng.normal(80 if g == 0 else 60, 20, len(ts)), 0, 100) for g in (0, 1)]
    gpu = pl.DataFrame({
        "host": ["node0"] * (2 * len(ts)), "gpu": ["0"] * len(ts) + ["1"] * len(ts), "ts": ts + ts,
        "metric": ["gpu_util_pct"] * (2 * len(ts)), "value": np.concatenate(util),
    })
    seqlen = pl.DataFrame({
        "step": np.repeat(np.arange(1, n_steps + 1), 3),
        "metric": ["global_seqlen/max", "global_seqlen/min", "global_seqlen/mean"] * n_steps,
        "value": np.ravel([[1200.0 + 50 * s, 800.0, 1000.0] for s in range(n_steps)]), "is_validation": False,
    })
    rank_times = pl.DataFrame({
        "step": np.repeat(np.arange(1, n_steps + 1), 2), "rank": [0, 1] * n_steps, "dp_rank": [0, 1] * n_steps,
        "phase": "reward", "seconds": rng.uniform(20, 60, 2 * n_steps),
    })
    stage_run(root, "math-a", {"samples": samples, "steps": steps, "step_windows": windows, "gpu_samples": gpu,
                               "step_metrics": seqlen, "rank_times": rank_times},
              task="math", max_response_length=4096, n_gpus=2)

    n_traj = 40
    n_turns = rng.integers(1, 5, n_traj)
    tr = pl.DataFrame({"sample_id": [f"t{i}" for i in range(n_traj)], "n": n_turns}).with_columns(
        turn=pl.int_ranges(0, pl.col("n"))).explode("turn")
    k = tr.height
    turns = tr.with_columns(
        step=pl.lit(0), prompt_tokens=pl.Series(rng.integers(300, 3000, k)),
        cached_tokens=pl.when(pl.col("turn") > 0).then(pl.lit(250)).otherwise(0),
        completion_tokens=pl.Series(rng.integers(20, 400, k)), engine_latency_s=pl.Series(rng.lognormal(0.5, 0.5, k)),
    ).drop("n")
    calls = tr.filter(pl.col("turn") < pl.col("n") - 1).with_columns(
        step=pl.lit(0), call_index=pl.lit(0), tool_name=pl.lit("search"),
    )
    calls = calls.with_columns(
        latency_s=pl.Series(rng.lognormal(-2.5, 1.0, calls.height)),
        status=pl.Series(np.where(rng.uniform(size=calls.height) < 0.05, "error", "success")),
    ).drop("n")
    stage_run(root, "agent-b", {"turns": turns, "tool_calls": calls}, task="search")

    fb = pl.DataFrame({
        "trainer_step": [1, 1, 2, 2, 3], "gen_batch": [1, 2, 1, 2, 1], "prompts_generated": [96] * 5,
        "prompts_kept": [27, 33, 20, 30, 40], "prompts_used": [27, 5, 20, 12, 32], "train_batch_size": [32] * 5,
    }).with_columns(samples_generated=pl.col("prompts_generated") * 8, samples_kept=pl.col("prompts_kept") * 8)
    dsamples = pl.DataFrame({
        "step": np.repeat([1, 2, 3], 32), "sample_id": [str(i) for i in range(96)],
        "prompt_tokens": rng.integers(50, 400, 96), "response_tokens": rng.integers(100, 8000, 96),
    })
    stage_run(root, "dapo-c", {"filter_batches": fb, "samples": dsamples}, task="math", max_response_length=8000)
    return ["agent-b", "dapo-c", "math-a"]
