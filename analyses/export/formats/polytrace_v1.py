"""PolyTrace v1 workload file: ``workload_v1.json`` = ``{"<step>": {"input": [per prompt], "output": [n per
prompt, consecutive]}}``."""

from __future__ import annotations

import json
from pathlib import Path

from analyses.export.consumer_versions import UPSTREAM_POLYTRACE
from analyses.export.records import packed_records
from analyses.export.registry import ExportFormat, ExportJob
from analyses.export.structure import check_polytrace_v1
from analyses.fit.sampler import Generated


def write_v1(g: Generated, path: Path) -> Path:
    recs = packed_records(g.samples)
    doc = {
        str(int(k)): {"input": part["input"].to_list(), "output": part["output"].explode().to_list()}
        for (k,), part in recs.group_by("step", maintain_order=True)
    }
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return path


def _write(job: ExportJob) -> list[Path]:
    return [write_v1(job.generated, job.out / "workload_v1.json")]


FORMAT = ExportFormat(
    name="polytrace-v1",
    order=20,
    description="PolyTrace v1 per-step JSON (input lengths per prompt, output lengths per sample)",
    files="workload_v1.json",
    consumer="upstream PolyTrace v1 readers",
    loader="*/verl/trainer/Generator.py (v1 layout)",
    try_it="python tests/conformance/upstream_polytrace.py --read-v1 workload_v1.json (the model of the v1 reader)",
    write=_write,
    check=check_polytrace_v1,
    checked_against=UPSTREAM_POLYTRACE,
)
