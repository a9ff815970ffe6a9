"""CUDA kernel launch statistics: HTA's ``get_cuda_kernel_launch_stats``
(``hta/analyzers/cuda_kernel_analysis.py``).

For each GPU event of HTA's window launched by ``cudaLaunchKernel``, ``cudaLaunchKernelExC``
(MTIA's ``runFunction``) or, with memory events (HTA's default), ``cudaMemcpyAsync`` /
``cudaMemsetAsync``: the launch's duration (``cpu_duration``), the GPU event's (``gpu_duration``)
and the launch delay, from the end of the launch to the start on the GPU, clipped at 0. HTA
returns these rows and draws three histograms with its cutoffs; the views count them:

* short kernels: ``cpu_duration <= runtime_cutoff`` (50 µs) and ``gpu_duration < cpu_duration``,
  the GPU ran for less time than it took to launch the kernel;
* runtime outliers: ``cpu_duration > runtime_cutoff``;
* launch delay outliers: ``launch_delay > launch_delay_cutoff`` (100 µs).

Difference from HTA: HTA joins a GPU event to every CPU-side event of its correlation (a runtime
and a driver call of one correlation give two rows); we take its launch, one row.
"""

from __future__ import annotations

from analyses.trace.events import KERNEL_LAUNCHES, MEMORY_LAUNCHES
from analyses.trace.sqlparts import US, WINDOW_KERNELS, lead

RUNTIME_CUTOFF_US = 50.0
LAUNCH_DELAY_CUTOFF_US = 100.0


def launch_stats_sql(runtime_cutoff_us: float = RUNTIME_CUTOFF_US, launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US,
                     include_memory_events: bool = True) -> str:
    """One row per launched GPU event: durations (µs), delay and the three flags."""
    names = KERNEL_LAUNCHES + (MEMORY_LAUNCHES if include_memory_events else ())
    launch_names = ", ".join(f"'{n}'" for n in names)
    return f"""
SELECT run_id, path, rank, ev, correlation, name, kernel_type, stream, step, stage,
       launch_dur_us AS cpu_duration_us, dur_us AS gpu_duration_us,
       greatest(ts_us - launch_ts_us - launch_dur_us, 0) AS launch_delay_us,
       launch_dur_us <= {runtime_cutoff_us!r} AND dur_us < launch_dur_us AS is_short,
       launch_dur_us > {runtime_cutoff_us!r} AS is_runtime_outlier,
       greatest(ts_us - launch_ts_us - launch_dur_us, 0) > {launch_delay_cutoff_us!r} AS is_launch_delay_outlier
FROM {WINDOW_KERNELS} WHERE launch_name IN ({launch_names})"""


def launch_summary_sql(keys: tuple[str, ...] = (), source: str = "kernel_launch_stats") -> str:
    """Counts and launch-delay quantiles per run, rank and ``keys``."""
    part = ("run_id", "rank", *keys)
    return f"""
SELECT {lead(part)}count(*) AS launches, count(*) FILTER (WHERE is_short) AS short_kernels,
       count(*) FILTER (WHERE is_runtime_outlier) AS runtime_outliers,
       count(*) FILTER (WHERE is_launch_delay_outlier) AS launch_delay_outliers,
       avg(cpu_duration_us) * {US} AS mean_cpu_duration_s, avg(gpu_duration_us) * {US} AS mean_gpu_duration_s,
       avg(launch_delay_us) * {US} AS mean_launch_delay_s,
       quantile_cont(launch_delay_us, 0.5) * {US} AS p50_launch_delay_s,
       quantile_cont(launch_delay_us, 0.99) * {US} AS p99_launch_delay_s,
       max(launch_delay_us) * {US} AS max_launch_delay_s
FROM {source} GROUP BY ALL"""
