"""Every number of HTA 0.5.0's analyses against ours, on one trace set.

``compare(ta, hta)`` takes our :class:`analyses.trace.TraceAnalysis` of the run holding the trace
set and the HTA driver's output for it (tests/conformance/drivers/hta_driver.py) and returns one
:class:`Check` per analysis: how many numbers were compared, the problems found (empty: all
equal), and a one-line summary of both sides for the comparison table.

Equal means: exactly, up to float noise (1e-9 relative; HTA's integer µs against our seconds x 1e6),
and at HTA's own display rounding where it rounds (overlap: 2 decimals, kernel-type share: 1).
Where the definitions differ on purpose the documented tolerance applies, named in the check:

* queue length summary: HTA orders simultaneous changes with an unstable sort, so each of its
  statistics must lie between ours with increments first and with decrements first (the std,
  which is not monotone in the order, within 1e-5 relative of that range);
* memory bandwidth: counts and statistics equal, except values below 1e-9 GB/s (float residue),
  which HTA may count and we do not;
* time blocked on a full queue: HTA keeps one stream per rank; that stream's value must equal ours;
* top kernels: once HTA groups kernels into ``others`` it reports each kept kernel's
  max/min/mean as its sum and std 0; there only the sum is compared;
* kernel-type combinations HTA lists with 0 µs (a zero-length state of its sort) are not ours;
* frequent kernel sequences, stragglers: where HTA raises (ns traces, one rank) we compare nothing
  and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analyses.trace import TraceAnalysis, counters

REL = 1e-9


@dataclass
class Check:
    analysis: str
    compared: int = 0
    problems: list[str] = field(default_factory=list)
    ours: str = ""
    hta: str = ""
    note: str = ""

    def eq(self, what: str, ours: Any, hta: Any, rel: float = REL, abs_: float = 1e-6) -> None:
        self.compared += 1
        if ours is None or hta is None:
            if not (ours is None and hta is None):
                self.problems.append(f"{what}: ours {ours} vs HTA {hta}")
            return
        a, b = float(ours), float(hta)
        if abs(a - b) > max(abs_, rel * max(abs(a), abs(b))):
            self.problems.append(f"{what}: ours {a!r} vs HTA {b!r}")


def _us(v: float | None) -> float | None:
    return None if v is None else v * 1e6


def compare(ta: TraceAnalysis, hta: dict[str, Any], con: Any = None) -> list[Check]:
    out = [_temporal(ta, hta), _idle(ta, hta), *_kernels(ta, hta), _overlap(ta, hta), _launch(ta, hta),
           _queue(ta, hta), _blocked(ta, hta), _memory(ta, hta), *_annotations(ta, hta), _stragglers(ta, hta),
           _sequences(ta, hta)]
    return out


def _temporal(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("temporal_breakdown")
    ours = {r["rank"]: r for r in ta.get_temporal_breakdown().to_dicts()}
    for r in hta["temporal"]:
        o = ours.get(r["rank"], {})
        for a, b in (("idle_s", "idle_time(us)"), ("compute_s", "compute_time(us)"),
                     ("non_compute_s", "non_compute_time(us)"), ("kernel_time_s", "kernel_time(us)")):
            c.eq(f"rank {r['rank']} {b}", _us(o.get(a)), r[b])
    c.hta = "; ".join(f"r{r['rank']} idle {r['idle_time(us)']:.0f} µs" for r in hta["temporal"][:2])
    c.ours = "; ".join(f"r{k} idle {v['idle_s'] * 1e6:.0f} µs" for k, v in list(sorted(ours.items()))[:2])
    return c


def _idle(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("kernel_idle_breakdown")
    ours = {(r["rank"], r["stream"], r["idle_category"]): _us(r["idle_time_s"])
            for r in ta.get_idle_time_breakdown().to_dicts()}
    theirs = {(r["rank"], r["stream"], r["idle_category"]): r["idle_time"] for r in hta["idle"]}
    for k in sorted(set(ours) | set(theirs)):
        c.eq(f"rank {k[0]} stream {k[1]} {k[2]}", ours.get(k), theirs.get(k))
    c.hta = f"{len(theirs)} rows, host_wait {sum(v for k, v in theirs.items() if k[2] == 'host_wait'):.0f} µs"
    c.ours = f"{len(ours)} rows, host_wait {sum(v for k, v in ours.items() if k[2] == 'host_wait'):.0f} µs"
    return c


def _kernels(ta: TraceAnalysis, hta: dict) -> list[Check]:
    types, top = ta.get_gpu_kernel_breakdown()
    c = Check("kernel_type_breakdown")
    ot = {r["kernel_type"]: r for r in types.to_dicts()}
    for r in hta["kernels"]["types"]:
        o = ot.pop(r["kernel_type"], None)
        if o is None and r["sum"] == 0:
            continue  # a zero-length state of HTA's sort
        c.eq(f"{r['kernel_type']} sum", _us(o and o["sum_s"]), r["sum"])
        c.eq(f"{r['kernel_type']} percentage", o and round(o["share_pct"], 1), r["percentage"], abs_=1e-9)
    for k in ot:
        c.problems.append(f"{k}: ours only")
    c.hta = ", ".join(f"{r['kernel_type'].replace('COMPUTATION', 'COMP').replace('COMMUNICATION', 'COMM')} "
                      f"{r['percentage']}%" for r in hta["kernels"]["types"][:3])
    c.ours = ", ".join(f"{r['kernel_type'].replace('COMPUTATION', 'COMP').replace('COMMUNICATION', 'COMM')} "
                       f"{r['share_pct']:.1f}%" for r in types.head(3).to_dicts())
    t = Check("top_kernels")
    otop = {(r["rank"], r["kernel_type"], r["name"]): r for r in top.to_dicts()}
    htop = {(r["rank"], r["kernel_type"], r["name"]): r for r in hta["kernels"]["top"]}
    grouped = {(k[0], k[1]) for k in htop if k[2] == "others"}
    for k in sorted(set(otop) | set(htop)):
        o, h = otop.get(k), htop.get(k)
        if o is None or h is None:
            t.problems.append(f"{k[:2]} {k[2][:60]}: {'HTA' if h else 'ours'} only")
            continue
        t.eq(f"{k[:2]} {k[2][:40]} sum", _us(o["sum_s"]), h["sum (us)"])
        if k[2] == "others" or (k[0], k[1]) not in grouped:
            for a, b in (("max_s", "max (us)"), ("min_s", "min (us)"), ("mean_s", "mean (us)"), ("std_s", "stddev")):
                t.eq(f"{k[:2]} {k[2][:40]} {b}", _us(o[a]), h[b], rel=1e-6)
    t.hta = f"{len(htop)} rows ({len(grouped)} grouped)"
    t.ours = f"{len(otop)} rows"
    if grouped:
        t.note = "kept kernels of a grouped (rank, type): sum only (HTA reports max = min = mean = sum there)"
    return [c, t]


def _overlap(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("comm_comp_overlap")
    ours = {r["rank"]: r["overlap_pct"] for r in ta.get_comm_comp_overlap().to_dicts()}
    for r in hta["overlap"]:
        o = ours.get(r["rank"])
        c.eq(f"rank {r['rank']}", None if o is None else round(o, 2), r["comp_comm_overlap_pctg"], abs_=1e-9)
    c.hta = ", ".join(f"r{r['rank']} {r['comp_comm_overlap_pctg']}%" for r in hta["overlap"][:4])
    c.ours = ", ".join(f"r{k} {v:.2f}%" if v is not None else f"r{k} NULL" for k, v in sorted(ours.items())[:4])
    return c


def _launch(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("kernel_launch_stats")
    ls = ta.get_cuda_kernel_launch_stats()
    n_h = n_o = 0
    for rk, rows in hta["launch"].items():
        od = {r["correlation"]: r for r in ls.filter(pl.col("rank") == int(rk)).to_dicts()}
        n_h, n_o = n_h + len(rows), n_o + len(od)
        for r in rows:
            o = od.pop(r["correlation"], None)
            if o is None:
                c.problems.append(f"rank {rk} correlation {r['correlation']}: HTA only")
                continue
            c.eq(f"rank {rk} corr {r['correlation']} cpu", o["cpu_duration_us"], r["cpu_duration"])
            c.eq(f"rank {rk} corr {r['correlation']} gpu", o["gpu_duration_us"], r["gpu_duration"])
            c.eq(f"rank {rk} corr {r['correlation']} delay", o["launch_delay_us"], r["launch_delay"])
        c.problems += [f"rank {rk} correlation {k}: ours only" for k in od]
    c.hta, c.ours = f"{n_h} launches", f"{n_o} launches"
    return c


_DESCRIBE = (("count", "count"), ("mean", "mean"), ("std", "std"), ("min", "min"), ("25%", "p25"), ("50%", "p50"),
             ("75%", "p75"), ("max", "max"))


def _queue(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("queue_length_summary", note="HTA's tie order is unstable: each statistic within ours with increments "
                                           "first and decrements first")
    hi = {(r["rank"], r["stream"]): r for r in ta.get_queue_length_summary().to_dicts()}
    src = f"({counters.queue_points_sql(increments_first=False)})"
    lo_df = ta._q(counters.queue_summary_sql(source=src))
    lo = {(r["rank"], r["stream"]): r for r in lo_df.to_dicts()}
    for r in hta["queue"]:
        k = (r["rank"], r["stream"])
        a, b = hi.get(k), lo.get(k)
        if a is None or b is None:
            c.problems.append(f"{k}: HTA only")
            continue
        std_range = _std_over_tie_orders(a, b)
        for h_name, o_name in _DESCRIBE:
            v = r[f"queue_length_{h_name}"]
            x, y = sorted(float(z) if z is not None else float("nan") for z in (a[o_name], b[o_name]))
            slack = 1e-9
            if o_name == "std" and std_range is not None:
                x, y = std_range
            elif o_name == "std":  # a queue below zero: no enclosure, the extremes with a slack
                slack = 1e-5
            c.compared += 1
            if v is None or not (x - slack * abs(x) - 1e-12 <= v <= y + slack * abs(y) + 1e-12):
                c.problems.append(f"{k} {h_name}: HTA {v} outside ours [{x}, {y}]")
    c.problems += [f"{k}: ours only" for k in set(hi) - {(r["rank"], r["stream"]) for r in hta["queue"]}]
    c.hta = f"{len(hta['queue'])} streams"
    c.ours = f"{len(hi)} streams"
    return c


def _std_over_tie_orders(first_up: dict, first_down: dict) -> tuple[float, float] | None:
    """The sample std (ddof 1, as pandas' describe) a queue's series can have under any order of
    its same-timestamp events, from the two extreme orders' count, mean and std; None when the
    queue goes below zero.

    HTA sorts by timestamp with an unstable sort, whose order of ties changes with the CPU's sort
    routine (numpy's AVX-512 quicksort is another than its introsort), and a mixed order can put
    the std outside the two extremes'. Within a tie group the k-th level with every increment
    first is the highest any order gives (u) and with every decrement first the lowest (d). So,
    with no level below zero, the sums of the levels (S1) and of their squares (S2) of any order x
    lie between the extremes', and var = (S2 - S1**2/n)/(n-1) between the bounds those give.
    """
    if min(float(first_up["min"]), float(first_down["min"])) < 0 or first_up["count"] != first_down["count"]:
        return None
    n = float(first_up["count"])
    if n < 2:
        return None
    s1 = [n * float(o["mean"]) for o in (first_up, first_down)]
    s2 = [(n - 1) * float(o["std"]) ** 2 + t * t / n for o, t in zip((first_up, first_down), s1, strict=True)]
    lo = (min(s2) - max(s1) ** 2 / n) / (n - 1)
    hi = (max(s2) - min(s1) ** 2 / n) / (n - 1)
    # the sums are recovered from rounded statistics: a relative 1e-9 of S2 on the variance
    eps = 1e-9 * max(s2) / (n - 1)
    return max(lo - eps, 0.0) ** 0.5, (hi + eps) ** 0.5


def _blocked(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("queue_full_time", note="HTA keeps one stream per rank: that stream compared")
    parts_h, parts_o = [], []
    for m, rows in hta["blocked"].items():
        ours = {(r["rank"], r["stream"]): r for r in ta.get_time_spent_blocked_on_full_queue(int(m)).to_dicts()}
        for r in rows:
            o = ours.get((r["rank"], r["stream"]))
            c.eq(f">= {m} rank {r['rank']} stream {r['stream']}", _us(o and o["duration_at_max_queue_length_s"]),
                 r["duration_at_max_queue_length"])
            c.eq(f">= {m} rank {r['rank']} relative", o and o["relative_duration_at_max_queue_length"],
                 r["relative_duration_at_max_queue_length"])
        ranks_o = {k[0] for k in ours}
        if ranks_o != {r["rank"] for r in rows}:
            c.problems.append(f">= {m}: ranks blocked, ours {sorted(ranks_o)} vs HTA {sorted(r['rank'] for r in rows)}")
        parts_h.append(f">={m}: {sum(r['duration_at_max_queue_length'] for r in rows):.0f} µs")
        parts_o.append(f">={m}: {sum(_us(r['duration_at_max_queue_length_s']) for (rk, _s), r in ours.items() if any(x['rank'] == rk and x['stream'] == _s for x in rows)):.0f} µs"
                       f" ({len(ours)} streams)")
    c.hta, c.ours = "; ".join(parts_h), "; ".join(parts_o)
    return c


def _memory(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("memory_bw_summary", note="values < 1e-9 GB/s (float residue) not counted")
    ours = {(r["rank"], r["copy_kind"]): r for r in ta.get_memory_bw_summary().to_dicts()}
    for r in hta["memory_bw"]:
        o = ours.pop((r["rank"], r["name"]), None)
        if o is None:
            c.problems.append(f"rank {r['rank']} {r['name']}: HTA only")
            continue
        for h_name, o_name in _DESCRIBE:
            c.eq(f"rank {r['rank']} {r['name']} {h_name}", o[o_name], r[f"memory_bw_gbps_{h_name}"], rel=1e-6)
    c.problems += [f"{k}: ours only" for k in ours]
    c.hta = f"{len(hta['memory_bw'])} (rank, kind)"
    c.ours = f"{len(hta['memory_bw']) - len([p for p in c.problems if 'HTA only' in p])} matched"
    return c


def _annotations(ta: TraceAnalysis, hta: dict) -> list[Check]:
    out = []
    for key, gpu in (("annotations_gpu", True), ("annotations_cpu", False)):
        c = Check(f"user_annotation_breakdown ({'GPU' if gpu else 'CPU'})")
        ours = {(r["rank"], r["name"]): r for r in ta.get_gpu_user_annotation_breakdown(use_gpu_annotation=gpu).to_dicts()}
        rows = hta[key] if isinstance(hta[key], list) else []
        for r in rows:
            o = ours.pop((r["rank"], r["name"]), None)
            if o is None:
                c.problems.append(f"rank {r['rank']} {r['name'][:50]}: HTA only")
                continue
            for a, b in (("sum_s", "sum (us)"), ("max_s", "max (us)"), ("min_s", "min (us)"), ("mean_s", "mean (us)"),
                         ("std_s", "stddev")):
                c.eq(f"rank {r['rank']} {r['name'][:40]} {b}", _us(o[a]), r[b], rel=1e-6)
        c.problems += [f"{k[0]} {k[1][:50]}: ours only" for k in ours]
        c.hta, c.ours = f"{len(rows)} names", f"{len(rows) - len([p for p in c.problems if 'only' in p])} matched"
        out.append(c)
    return out


def _stragglers(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("trace_stragglers")
    ours = ta.get_potential_stragglers()
    h = hta["stragglers"]
    if isinstance(h, dict):  # HTA raised: one rank, or no communication kernel to measure
        c.hta = f"raised {h['error'][:60]}"
        c.ours = f"{ours or 'none'}"
        c.note = "HTA raises; we give no straggler" if not ours else ""
        if ours:
            c.problems.append(f"HTA raised but ours found {ours}")
        return c
    c.compared = 1
    if sorted(ours) != sorted(h):
        c.problems.append(f"stragglers: ours {ours} vs HTA {h}")
    c.hta, c.ours = str(sorted(h)), str(sorted(ours))
    return c


def _sequences(ta: TraceAnalysis, hta: dict) -> Check:
    c = Check("frequent_kernel_sequences")
    hs, os_ = [], []
    for s in hta["sequences"]:
        o = {r["pattern"]: r for r in ta.get_frequent_cuda_kernel_sequences(s["operator"], rank=s["rank"]).to_dicts()}
        if isinstance(s["rows"], dict):
            hs.append(f"{s['operator']!r}: raised")
            os_.append(f"{s['operator']!r}: {len(o)} patterns")
            c.note = "HTA's call graph refuses its own -1 µs durations of ns traces"
            continue
        rows = {r["pattern"]: r for r in s["rows"]}
        hs.append(f"{s['operator']!r} r{s['rank']}: {len(rows)} patterns")
        os_.append(f"{s['operator']!r} r{s['rank']}: {len(o)} patterns")
        for p, r in rows.items():
            m = o.pop(p, None)
            if m is None:
                c.problems.append(f"{s['operator']!r}: pattern {p[:80]} HTA only")
                continue
            c.eq(f"{s['operator']!r} count", m["count"], r["count"])
            c.eq(f"{s['operator']!r} GPU kernel duration", _us(m["kernel_dur_s"]), r["GPU kernel duration (us)"])
            c.eq(f"{s['operator']!r} CPU op duration", _us(m["op_dur_s"]), r["CPU op duration (us)"])
        c.problems += [f"{s['operator']!r}: pattern {p[:80]} ours only" for p in o]
    c.hta, c.ours = "; ".join(hs), "; ".join(os_)
    return c


def compare_diff(diff_rows: pl.DataFrame, hta_rows: list[dict[str, Any]]) -> Check:
    """TraceDiff.compare_traces rows (by name) against ours."""
    c = Check("trace_diff")
    od = {r["name"]: r for r in diff_rows.to_dicts()}
    for r in hta_rows:
        o = od.pop(r["name"], None)
        if o is None:
            c.problems.append(f"{r['name'][:60]}: HTA only")
            continue
        for a, b in (("control_counts", "control_counts"), ("test_counts", "test_counts"), ("diff_counts", "diff_counts")):
            c.eq(f"{r['name'][:40]} {b}", o[a], r[b])
        for a, b in (("control_total_duration_s", "control_total_duration"), ("test_total_duration_s", "test_total_duration"),
                     ("diff_duration_s", "diff_duration")):
            c.eq(f"{r['name'][:40]} {b}", _us(o[a]), r[b])
        if o["counts_change_categories"] != r["counts_change_categories"]:
            c.problems.append(f"{r['name'][:40]}: category {o['counts_change_categories']} vs {r['counts_change_categories']}")
    c.problems += [f"{k[:60]}: ours only" for k in od]
    c.hta, c.ours = f"{len(hta_rows)} names", f"{diff_rows.height} names"
    return c
