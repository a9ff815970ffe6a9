"""Benchmark: the verl console reader against a per-line Python loop and a DuckDB floor.

Builds a verl console log of ``--size-gb`` (default 1.0) in ``benchmarks/out/`` by repeating the
real Qwen2.5-0.5B GSM8K log (``../shared/real_logs/verl/...``) with renumbered steps, then times,
each in its own subprocess (same interpreter, same ``POLARS_MAX_THREADS``, warm page cache):

1. ``ours``   — :class:`analyses.readers.verl_console.VerlConsoleReader` consuming every chunk;
2. ``loop``   — what a user would otherwise run, in the style of PolyTrace's ``suite.py
   parse_log``: ``for line in f``, strip ANSI, regex the ``key:value`` pairs, ``float()`` each;
3. ``floor``  — DuckDB reading the same file as raw lines (one VARCHAR column, no quoting),
   ``count(*)`` and ``sum(length(line))``: the cost of just getting the bytes into lines.

Reports MB/s (input bytes over the in-process time), peak RSS per method (``os.wait4``), and the
ratios ours/loop and ours/floor. Run: ``make bench`` or
``.venv/bin/python benchmarks/bench_verl_reader.py --size-gb 0.05`` for a quick smoke run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL_LOGS = Path(os.environ.get("POLYTRACE_REAL_LOGS", REPO.parent / "shared" / "real_logs"))
TEMPLATE = REAL_LOGS / "verl" / "Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"
OUT = REPO / "benchmarks" / "out"
METHODS = ("floor", "ours", "loop")
TARGETS = {"ours_over_loop": 20.0, "ours_over_floor": 0.5, "peak_rss_mb": 1024.0}


# ---------------------------------------------------------------------------- input file


def build_log(size_gb: float, template: Path = TEMPLATE, out_dir: Path = OUT) -> Path:
    """A >= ``size_gb`` GB console log: the template repeated, step numbers continuing across
    repetitions (0..434, 435..869, ...) so the steps stay unique as in one long run."""
    data = template.read_bytes()
    target = int(size_gb * 1e9)
    reps = max(1, -(-target // len(data)))
    key = hashlib.sha256(data).hexdigest()[:12]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"verl_console_{size_gb:g}gb.log"
    meta = path.with_suffix(".json")
    stamp = {"template_sha": key, "reps": reps}
    if path.exists() and meta.exists() and json.loads(meta.read_text()) == stamp:
        return path
    spans = [m.span() for m in re.finditer(rb"(?<=step:)\d+(?= - )", data)]
    steps = [int(data[a:b]) for a, b in spans]
    period = max(steps) + 1
    pieces, prev = [], 0
    for a, b in spans:
        pieces.append(data[prev:a])
        prev = b
    tail = data[prev:]
    with open(path, "wb") as fh:
        for r in range(reps):
            off = r * period
            out = []
            for piece, s in zip(pieces, steps, strict=True):
                out.append(piece)
                out.append(str(s + off).encode())
            out.append(tail)
            fh.write(b"".join(out))
    meta.write_text(json.dumps(stamp))
    return path


# ---------------------------------------------------------------------------- methods (run in a child)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KV = re.compile(r"([A-Za-z0-9_./()@-]+):([-+0-9.eE]+|nan|inf)")
_STEP = re.compile(r"step:(\d+) - ")


def run_loop(path: Path) -> dict:
    """The per-line baseline: what a hand-written parser does (cf. PolyTrace suite.py parse_log).

    Rows are produced per line and then dropped (counted), like our reader's chunks, so that
    memory measures the parser and not a list of 30 M tuples."""
    lines = n_rows = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            lines += 1
            line = _ANSI.sub("", raw)
            m = _STEP.search(line)
            if m is None:
                continue
            step = int(m.group(1))
            rows = []
            for key, value in _KV.findall(line, m.end()):
                try:
                    rows.append((step, key, float(value)))
                except ValueError:
                    pass
            n_rows += len(rows)
    return {"lines": lines, "metric_rows": n_rows}


def run_ours(path: Path) -> dict:
    from analyses.manifest import RunManifest
    from analyses.readers.base import FileContext
    from analyses.readers.verl_console import VerlConsoleReader

    ctx = FileContext(run_id="bench", path=path, rel_path=path.name, manifest=RunManifest())
    lines = ok = rows = 0
    for chunk in VerlConsoleReader().read(ctx):
        lines += chunk.lines
        ok += chunk.rows_ok
        sm = chunk.tables.get("step_metrics")
        rows += 0 if sm is None else sm.height
    return {"lines": lines, "step_lines": ok, "metric_rows": rows}


def run_floor(path: Path) -> dict:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {int(os.environ.get('POLARS_MAX_THREADS', '2'))}")
    n, chars = con.execute(
        """
        SELECT count(*), sum(length(line)) FROM read_csv(?, columns = {'line': 'VARCHAR'},
            header = false, delim = '\x01', quote = '', escape = '', auto_detect = false,
            max_line_size = 100000000)
        """,
        [str(path)],
    ).fetchone()
    return {"lines": n, "chars": chars}


def run_duckdb_parse(path: Path) -> dict:
    """Reference, not a target: the same split in DuckDB SQL (what a DuckDB user would write:
    split on ' - ', unnest, split_part, TRY_CAST), rows streamed out as Arrow batches. No ANSI /
    prefix rules, no numpy reprs, no rejects: a lower bound for "an engine doing this parse"."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {int(os.environ.get('POLARS_MAX_THREADS', '2'))}")
    src = str(path).replace("'", "''")
    rel = con.sql(
        f"""
        WITH l AS (
            SELECT line FROM read_csv('{src}', columns = {{'line': 'VARCHAR'}}, header = false, delim = '\x01',
                quote = '', escape = '', auto_detect = false, max_line_size = 100000000)
            WHERE contains(line, 'step:')),
        p AS (SELECT TRY_CAST(split_part(string_split(line, ' - ')[1], 'step:', 2) AS BIGINT) AS step,
                     unnest(string_split(line, ' - ')[2:]) AS pair FROM l)
        SELECT step, split_part(pair, ':', 1) AS metric, TRY_CAST(split_part(pair, ':', 2) AS DOUBLE) AS value
        FROM p WHERE step IS NOT NULL
        """
    )
    rows = sum(b.num_rows for b in rel.to_arrow_reader(1 << 20))
    return {"metric_rows": rows}


RUNNERS = {"ours": run_ours, "loop": run_loop, "floor": run_floor, "duckdb_parse": run_duckdb_parse}


def child(method: str, path: Path) -> None:
    # imports are not what is measured: load them before the clock starts
    if method == "ours":
        import analyses.readers.verl_console  # noqa: F401
    elif method in ("floor", "duckdb_parse"):
        import duckdb  # noqa: F401
    t0, c0 = time.perf_counter(), time.process_time()
    out = RUNNERS[method](path)
    out["seconds"] = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0  # all threads: robust when the machine is shared
    print(json.dumps(out))


# ---------------------------------------------------------------------------- driver


def measure(method: str, path: Path) -> dict:
    env = dict(os.environ, POLARS_MAX_THREADS=os.environ.get("POLARS_MAX_THREADS", "2"), PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", method, "--file", str(path)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    stdout = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{method} failed with exit code {proc.returncode}")
    res = json.loads(stdout.decode().strip().splitlines()[-1])
    res["peak_rss_mb"] = usage.ru_maxrss / 1024  # KiB on Linux
    res["load"] = os.getloadavg()[0]  # 1-min load when the run ended: wall times depend on it
    return res


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


def report(path: Path, results: dict[str, dict]) -> str:
    mb = path.stat().st_size / 1e6
    lines = [
        f"input: {path.name}, {mb:,.0f} MB, {results['ours']['lines']:,} lines, "
        f"{results['ours']['step_lines']:,} step lines, {results['ours']['metric_rows']:,} metric rows",
        f"machine: {os.cpu_count()} CPUs, POLARS_MAX_THREADS={os.environ.get('POLARS_MAX_THREADS', '2')}, "
        f"load average during the runs {min(r['load'] for r in results.values()):.1f}"
        f"-{max(r['load'] for r in results.values()):.1f}",
        "",
        "| method | wall s | MB/s | CPU s | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in [m for m in (*METHODS, "duckdb_parse") if m in results]:
        r = results[m]
        lines.append(
            f"| {m} | {r['seconds']:.2f} | {mb / r['seconds']:,.0f} | {r['cpu_seconds']:.2f} | {r['peak_rss_mb']:,.0f} |"
        )
    over_loop = results["loop"]["seconds"] / results["ours"]["seconds"]
    over_floor = results["floor"]["seconds"] / results["ours"]["seconds"]
    rss = results["ours"]["peak_rss_mb"]
    cpu_loop = results["loop"]["cpu_seconds"] / results["ours"]["cpu_seconds"]
    cpu_floor = results["floor"]["cpu_seconds"] / results["ours"]["cpu_seconds"]
    lines += [
        "",
        f"ours vs loop:  {over_loop:.1f}x faster (target >= {TARGETS['ours_over_loop']:g}x)"
        f" {'OK' if over_loop >= TARGETS['ours_over_loop'] else 'MISSED'}",
        f"ours vs floor: {over_floor:.2f}x the DuckDB floor's speed (target >= {TARGETS['ours_over_floor']:g}x)"
        f" {'OK' if over_floor >= TARGETS['ours_over_floor'] else 'MISSED'}",
        f"ours peak RSS: {rss:,.0f} MB (target < {TARGETS['peak_rss_mb']:g} MB)"
        f" {'OK' if rss < TARGETS['peak_rss_mb'] else 'MISSED'}",
        f"by CPU seconds: ours vs loop {cpu_loop:.1f}x, ours vs floor {cpu_floor:.2f}x",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0, help="size of the generated log (default 1.0)")
    ap.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated subset of floor,ours,loop (add duckdb_parse for an extra reference)",
    )
    ap.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    ap.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.file)
        return 0
    if not TEMPLATE.exists():
        print(f"template log not found: {TEMPLATE} (set POLYTRACE_REAL_LOGS)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    path = build_log(args.size_gb)
    print(
        f"built {path} ({path.stat().st_size / 1e6:,.0f} MB) in {time.perf_counter() - t0:.1f}s", flush=True
    )
    warm(path)
    methods = [m for m in (*METHODS, "duckdb_parse") if m in args.methods.split(",")]
    results = {}
    for m in methods:
        results[m] = measure(m, path)
        print(f"{m}: {json.dumps(results[m])}", flush=True)
    if set(METHODS) <= set(results):
        print()
        print(report(path, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
