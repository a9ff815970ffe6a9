"""``polytrace runs``: one line per ingested run with its counts."""

from __future__ import annotations

import argparse

from analyses.cli.common import EXIT_OK, Command, add_warehouse, warehouse


def _run(args: argparse.Namespace) -> int:
    rows = warehouse(args).run_rows()
    if not rows:
        print("no runs")
        return EXIT_OK
    for r in rows:
        print(_line(r))
    return EXIT_OK


def _line(r: dict) -> str:
    """A run on one line: what it holds, and the GPU count and cap with where each came from when known."""
    extra = ""
    if r["n_gpus"] is not None:
        extra += f" gpus={r['n_gpus']} ({r['n_gpus_source']})"
    if r["max_response_length"] is not None:
        extra += f" cap={r['max_response_length']} ({r['max_response_length_source']})"
    return (f"{r['run_id']}: task={r['task'] or '-'} model={r['model'] or '-'} files={r['files']} "
            f"(errors={r['file_errors']}) steps={r['steps']} samples={r['samples']} tool_calls={r['tool_calls']} "
            f"rank_times={r['rank_times']} gpu_samples={r['gpu_samples']} rejects={r['rejects']}{extra}")


COMMAND = Command(
    name="runs",
    help="list ingested runs with their counts",
    description="One line per run: task, model, files, steps, samples, tool calls, rank times, GPU samples, rejects; "
    "the GPU count and the response cap (with where each came from) when known.",
    epilog="example:\n  polytrace runs --warehouse /tmp/wh",
    add_arguments=add_warehouse,
    run=_run,
)
