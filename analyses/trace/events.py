"""The runtime calls and GPU event categories HTA's analyses select by name.

Plain names, apart from :mod:`analyses.trace.model` (numpy, Polars): the views' SQL
(:mod:`.counters`, :mod:`.idle`, :mod:`.launches`) reads them when the catalog is built, and
``polytrace query`` builds the catalog without loading either.
"""

from __future__ import annotations

# runtime calls that enqueue work on a stream (HTA's get_runtime_launch_events_query)
QUEUE_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync",
                  "cudaMemsetAsync", "runFunction - job_prep_and_submit_for_execution", "hipLaunchKernel",
                  "hipExtModuleLaunchKernel", "hipMemsetAsync", "hipMemcpyAsync", "hipMemcpyWithStream")
# what HTA's get_cuda_kernel_launch_stats joins (include_memory_events=True)
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution")
MEMORY_LAUNCHES = ("cudaMemcpyAsync", "cudaMemsetAsync")
# the GPU event categories HTA's get_idle_time_breakdown looks at (not cuda_sync)
IDLE_KERNEL_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")
