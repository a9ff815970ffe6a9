"""Before/after for the ingest targets of issue 29 (2, 3, 5): ``polytrace ingest`` of the same
inputs by the code of ``--base`` (a commit, checked out once under ``--work``) and by this tree,
interleaved round by round, each a whole process (``python -m analyses.cli ingest``, imported from
its own tree), into a fresh warehouse: best wall, best user+sys CPU, peak RSS.

The ratios of ``user_commands.py`` divide by an alternative (DuckDB, a ``json.loads`` loop) whose
own time moves from hour to hour on a shared VM; this compares our command with itself.

Run: ``.venv/bin/python benchmarks/ab_ingest.py --base a9d584c`` (inputs as ``user_commands.py
--large`` builds them under ``--work``: the 600 MB verl log, 1 GB of v2 JSONL, the 315 packed
step files; a missing one is skipped with a note).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from user_commands import PY, baseline_tree, load, run, warm_bytecode  # noqa: E402

INPUTS = {  # name -> (path under --work, rounds)
    "verl log 601 MB": ("verl_console_0.6gb.log", 3),
    "v2 JSONL 1 GB": ("v2_1gb", 3),
    "315 packed step files": ("packed_315", 7),
}


def ingest(tree: Path, src: Path, wh: Path) -> tuple[float, float, float]:
    """(wall s, user+sys s, peak RSS MiB) of one ingest of ``src`` by the code in ``tree``."""
    shutil.rmtree(wh, ignore_errors=True)
    r = run([PY, "-m", "analyses.cli", "ingest", str(src), "--warehouse", str(wh), "-q"], env={"PYTHONPATH": str(tree)},
            cwd=tree)  # POLARS_MAX_THREADS=2 unless set: user_commands sets its default on import
    return r.seconds, r.cpu, r.rss_mb * 1e6 / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (e.g. the last stop's main)")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("POLYTRACE_BENCH_WORK", "/tmp/polytrace-bench")))
    a = ap.parse_args(argv)
    trees = {a.base: baseline_tree(a.work, a.base), "this tree": REPO}
    warm_bytecode()
    print(f"load average {load()}; best of each, interleaved", flush=True)
    print("| input | side | best wall | best CPU | peak RSS |\n|---|---|---:|---:|---:|")
    for name, (rel, rounds) in INPUTS.items():
        src = a.work / rel
        if not src.exists():
            print(f"| {name} | (not built: run user_commands.py --large once) | | | |")
            continue
        got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in trees}
        for _ in range(rounds):
            for side, tree in trees.items():
                got[side].append(ingest(tree, src, a.work / "ab_wh"))
        for side, runs in got.items():
            print(f"| {name} | {side} | {min(r[0] for r in runs):.3f} s | {min(r[1] for r in runs):.3f} s | "
                  f"{max(r[2] for r in runs):.0f} MiB |", flush=True)
    shutil.rmtree(a.work / "ab_wh", ignore_errors=True)
    print(f"load average at the end {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
