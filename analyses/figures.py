"""Plotly figure builders for the characterization views.

Each function takes frames read from a view (see :mod:`analyses.views`) and returns a figure; none
computes a statistic, so what a figure shows is exactly what the view says. Frames may hold
several runs; functions that draw one run take a frame already filtered to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import polars as pl
from plotly.subplots import make_subplots

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
OUTLIER = "#d62728"
TEMPLATE = "plotly_white"


@contextmanager
def house_template() -> Iterator[None]:
    """Figures created inside start from :data:`TEMPLATE` (plotly's default template meanwhile;
    the caller's default is back on the way out). Plotly gives a new figure its default template
    without validating it, where ``update_layout(template=...)`` validates and deep-copies the
    whole template: 13-35 ms a figure on 2 cores, a third of a report's time. Builders lay their
    figures out with :func:`template_arg`, so a figure built outside still gets the template.

    Plotly's setter of the default validates the template it is given, which builds a whole
    ``Template`` (~40 ms) and discards it; so a nested use (a section inside a report) leaves the
    default alone."""
    before = pio.templates.default
    if before == TEMPLATE:
        yield
        return
    pio.templates.default = TEMPLATE
    try:
        yield
    finally:
        pio.templates.default = before


def template_arg() -> dict[str, str]:
    """``update_layout``'s template argument: none when the figure was created with ours already
    (inside :func:`house_template`; figures are created and laid out in one builder call)."""
    return {} if pio.templates.default == TEMPLATE else {"template": TEMPLATE}


@dataclass
class FigureSpec:
    """A figure with a stable key (``group__figure[__run]``, file-name safe)."""

    key: str
    fig: go.Figure
    key_figure: bool = False  # exported as PNG by default

    @property
    def drawn(self) -> bool:
        return len(self.fig.data) > 0


def safe_key(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)


def per_run(frame: pl.DataFrame, runs: list[str], key: str, build: Callable[[pl.DataFrame, str], go.Figure],
            key_figure: bool = False) -> list[FigureSpec]:
    """One figure per run of ``runs`` that has rows in ``frame``, keyed ``key__<run>``."""
    present = set(frame["run_id"].to_list()) if frame.height else set()
    return [FigureSpec(f"{key}__{safe_key(r)}", build(frame, r), key_figure) for r in runs if r in present]


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


# a log axis labels 1-2-5 steps while they are at most this many, else decades only
LOG_TICKS_MAX = 10


def short_number(v: float) -> str:
    """A tick label: 1k, 20k, 1.5M for large values, 0.001 for small ones."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick values and labels of a log axis spanning [lo, hi]: 1, 2, 5 x 10^k inside the span, or only
    the powers of ten when those are more than :data:`LOG_TICKS_MAX`. Empty within one decade, where
    plotly's own ticks (1.1, 1.2, ...) read well; its 1-2-5 digits over several decades ("2", "5"
    beside "1000") do not."""
    if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)) or hi / lo < 10:
        return [], []
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    tol = 1e-9
    cand = [float(f"{m}e{k}") for k in range(k0, k1 + 1) for m in (1, 2, 5)]
    vals = [v for v in cand if lo * (1 - tol) <= v <= hi * (1 + tol)]
    if len(vals) > LOG_TICKS_MAX:
        vals = [v for v in vals if f"{v:e}".startswith("1.")]
        while len(vals) > LOG_TICKS_MAX:
            vals = vals[::2]
    return vals, [short_number(v) for v in vals]


def _numbers(arr: object) -> list[float]:
    try:
        a = np.asarray(arr, dtype=float).ravel()
    except (TypeError, ValueError):
        return []
    return a[np.isfinite(a) & (a > 0)].tolist()


def readable_log_axes(fig: go.Figure) -> go.Figure:
    """Give every log axis of ``fig`` the ticks of :func:`log_ticks` over the data drawn on it."""
    for ax in [*fig.select_xaxes(), *fig.select_yaxes()]:
        if ax.type != "log":
            continue
        letter, ref = ax.plotly_name[0], ax.plotly_name[0] + ax.plotly_name[5:]
        vals = [v for t in fig.data if (getattr(t, f"{letter}axis", None) or letter) == ref
                for v in _numbers(getattr(t, letter, None))]
        tv, tt = log_ticks(min(vals), max(vals)) if vals else ([], [])
        if tv:
            ax.update(tickvals=tv, ticktext=tt)
    return fig


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    readable_log_axes(fig)
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        **template_arg(),
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "y": -0.18},
    )
    return fig


def _step_ticks(fig: go.Figure, steps: pl.Series, **kw: object) -> None:
    """Integer ticks on a step axis: plotly would label 1.5 between two steps of a short run."""
    n = steps.n_unique() if steps.len() else 0
    fig.update_xaxes(title_text="step", **({"dtick": 1} if 0 < n <= 15 else {}), **kw)


def _groups(df: pl.DataFrame, keys: list[str]) -> list[tuple[tuple, pl.DataFrame]]:
    if df.height == 0:
        return []
    return sorted(((k, g) for k, g in df.group_by(keys, maintain_order=True)), key=lambda kg: [str(x) for x in kg[0]])


def vline(x: float, line: dict, xref: str = "x", yref: str = "y") -> dict:
    """The shape ``fig.add_vline`` draws, to be added with the others in one ``update_layout``
    (each ``add_vline`` walks every shape already there: quadratic with a line per run)."""
    return {"type": "line", "x0": x, "x1": x, "xref": xref, "y0": 0, "y1": 1, "yref": f"{yref} domain", "line": line}


def length_cdf_figure(cdf: pl.DataFrame, quantiles: pl.DataFrame, kind: str = "response") -> go.Figure:
    """CDF (log x) and CCDF (log-log, where the tail lives) per run x task, tail beyond p99 marked."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("CDF", "tail: share ≥ x"), horizontal_spacing=0.1)
    cdf = cdf.filter(pl.col("kind") == kind).sort("value")
    q = quantiles.filter(pl.col("kind") == kind)
    lines = []
    for i, ((run, task), g) in enumerate(_groups(cdf, ["run_id", "task"])):
        name, color = f"{run} · {task}", _color(i)
        fig.add_trace(go.Scatter(x=g["value"], y=g["cdf"], mode="lines", line={"color": color, "shape": "hv"},
                                 name=name, legendgroup=name), row=1, col=1)
        # share >= x is never 0, so the longest response still shows on a log axis
        body = g
        fig.add_trace(go.Scatter(x=body["value"], y=body["share_ge"], mode="lines", line={"color": color, "shape": "hv"},
                                 name=name, legendgroup=name, showlegend=False), row=1, col=2)
        tail = body.filter(pl.col("in_tail"))
        if tail.height:
            fig.add_trace(go.Scatter(x=tail["value"], y=tail["share_ge"], mode="markers",
                                     marker={"color": color, "size": 5, "symbol": "circle-open"},
                                     name=f"{name} tail (> p99)", legendgroup=name), row=1, col=2)
        qq = q.filter((pl.col("run_id") == run) & (pl.col("task") == task))
        if qq.height:
            r = qq.row(0, named=True)
            for label, dash in (("p99", "dash"), ("p999", "dot")):
                if r[label] is not None:
                    lines.append(vline(r[label], {"color": color, "dash": dash, "width": 1}, "x2", "y2"))
    fig.update_layout(shapes=lines)
    fig.update_xaxes(type="log", title_text=f"{kind} tokens")
    fig.update_yaxes(title_text="share ≤ x", row=1, col=1)
    fig.update_yaxes(type="log", title_text="share ≥ x", row=1, col=2)
    return _layout(fig, f"{kind.capitalize()} length distribution (dashed: p99, dotted: p99.9)")


def length_drift_figure(drift: pl.DataFrame, run_id: str) -> go.Figure:
    """Response length per step for one run: p10–p90 band, p50, p99, max; detected shifts marked."""
    d = drift.filter(pl.col("run_id") == run_id).sort("step")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=d["step"], y=d["p90"], mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=d["step"], y=d["p10"], mode="lines", line={"width": 0}, fill="tonexty",
                             fillcolor="rgba(31,119,180,0.2)", name="p10–p90"))
    fig.add_trace(go.Scatter(x=d["step"], y=d["p50"], mode="lines+markers", line={"color": PALETTE[0]}, name="p50"))
    fig.add_trace(go.Scatter(x=d["step"], y=d["p99"], mode="lines", line={"color": PALETTE[1], "dash": "dash"}, name="p99"))
    fig.add_trace(go.Scatter(x=d["step"], y=d["max"], mode="markers", marker={"color": PALETTE[3], "size": 6}, name="max"))
    shifts = d.filter(pl.col("is_shift"))
    for s in shifts.iter_rows(named=True):
        fig.add_vline(x=s["step"], line={"color": OUTLIER, "dash": "dot"},
                      annotation_text=f"shift ×{s['shift_ratio']:.2f}", annotation_position="top left")
    fig.update_yaxes(type="log", title_text="response tokens")
    _step_ticks(fig, d["step"])
    slope = d["run_log_p50_slope_per_step"][0] if d.height else None
    trend = f" — ln(p50) slope {slope:+.4f}/step" if slope is not None else ""
    return _layout(fig, f"Response length drift, {run_id}{trend}")


def step_series_figure(series: pl.DataFrame, metric: str) -> go.Figure:
    """One metric per step (throughput, step time, generation time) per run, outliers marked ×."""
    s = series.filter(pl.col("metric") == metric).sort("step")
    fig = go.Figure()
    for i, ((run,), g) in enumerate(_groups(s, ["run_id"])):
        fig.add_trace(go.Scatter(x=g["step"], y=g["value"], mode="lines+markers", marker={"size": 4},
                                 line={"color": _color(i)}, name=run, legendgroup=run))
        out = g.filter(pl.col("is_outlier"))
        if out.height:
            fig.add_trace(go.Scatter(x=out["step"], y=out["value"], mode="markers", legendgroup=run,
                                     marker={"color": OUTLIER, "size": 11, "symbol": "x"}, name=f"{run} outliers"))
    _step_ticks(fig, s["step"])
    fig.update_yaxes(title_text=metric)
    return _layout(fig, f"{metric} per step (× = outside Tukey fences)")


STAGES = (("rollout", "#1f77b4"), ("inference", "#ff7f0e"), ("training", "#2ca02c"), ("other", "#c7c7c7"))


def stage_share_figure(stages: pl.DataFrame, run_id: str) -> go.Figure:
    """Stacked time shares of rollout / inference / training / other per step of one run."""
    d = stages.filter(pl.col("run_id") == run_id).sort("step")
    fig = go.Figure()
    for stage, color in STAGES:
        fig.add_trace(go.Bar(x=d["step"], y=d[f"{stage}_share"], name=stage, marker={"color": color},
                             customdata=d[f"{stage}_s"], hovertemplate="step %{x}: %{y:.1%} (%{customdata:.1f} s)"))
    fig.update_layout(barmode="stack", bargap=0.05)
    fig.update_yaxes(title_text="share of step time", tickformat=".0%", range=[0, 1])
    _step_ticks(fig, d["step"])
    return _layout(fig, f"Stage time shares per step, {run_id}")


def imbalance_figure(imbalance: pl.DataFrame, run_id: str) -> go.Figure:
    """Max/mean across units per step for each (phase, quantity), and the implied idle share."""
    d = imbalance.filter(pl.col("run_id") == run_id).sort("step")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("max / mean across units", "idle share = 1 − mean / max"))
    for i, ((phase, quantity), g) in enumerate(_groups(d, ["phase", "quantity"])):
        name, color = f"{phase} · {quantity}", _color(i)
        fig.add_trace(go.Scatter(x=g["step"], y=g["max_over_mean"], mode="lines+markers", name=name,
                                 legendgroup=name, line={"color": color}), row=1, col=1)
        fig.add_trace(go.Scatter(x=g["step"], y=g["idle_share"], mode="lines+markers", name=name, legendgroup=name,
                                 showlegend=False, line={"color": color}), row=2, col=1)
    fig.update_yaxes(type="log", title_text="max / mean", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1], title_text="idle", row=2, col=1)
    _step_ticks(fig, d["step"], row=2, col=1)
    # the straggler: the busiest rank of the most imbalanced step that names its ranks
    named = d.filter(pl.col("busiest_unit_id").is_not_null()) if "busiest_unit_id" in d.columns else d.clear()
    who = ""
    if named.height:
        w = named.sort("max_over_mean", descending=True, nulls_last=True).row(0, named=True)
        who = f" — busiest: {w['unit']} {w['busiest_unit_id']} at step {w['step']} ({w['phase']} {w['quantity']}, ×{w['max_over_mean']:.2f} the mean)"
    return _layout(fig, f"Load imbalance per step, {run_id}{who}", height=560)


def training_health_figure(health: pl.DataFrame, alerts: pl.DataFrame, run_id: str,
                           panel: tuple[tuple[str, str], ...]) -> go.Figure:
    """One row per health column the run has (``panel``: (column, label)), per step; each alert's
    first step is a dashed red line on the rows of its metric, its sustained stretch shaded."""
    d = health.filter(pl.col("run_id") == run_id).sort("step")
    rows = [(c, label) for c, label in panel if c in d.columns and d[c].drop_nulls().len()]
    fig = make_subplots(rows=max(len(rows), 1), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[label for _c, label in rows] or [""])
    a = alerts.filter(pl.col("run_id") == run_id)
    for i, (col, label) in enumerate(rows, start=1):
        g = d.filter(pl.col(col).is_not_null())
        fig.add_trace(go.Scatter(x=g["step"], y=g[col], mode="lines+markers", name=label, marker={"size": 4},
                                 line={"color": _color(i - 1)}, showlegend=False), row=i, col=1)
        for al in a.filter(pl.col("metric") == col).iter_rows(named=True):
            fig.add_vrect(x0=al["first_step"], x1=al["last_step"], fillcolor=OUTLIER, opacity=0.08, line_width=0,
                          row=i, col=1)
            fig.add_vline(x=al["first_step"], line={"color": OUTLIER, "dash": "dash", "width": 1}, row=i, col=1)
            fig.add_annotation(x=al["first_step"], y=1, yref=f"y{i if i > 1 else ''} domain", text=al["kind"],
                               showarrow=False, xanchor="left", font={"color": OUTLIER, "size": 10})
    # alerts on columns the panel does not draw (throughput) are named in the title
    other = sorted({k for k, m in zip(a["kind"], a["metric"], strict=True) if m not in dict(rows)}) if a.height else []
    _step_ticks(fig, d["step"], row=max(len(rows), 1), col=1)
    title = f"Training health per step, {run_id}" + (f" (also: {', '.join(other)})" if other else "")
    return _layout(fig, title, height=max(260, 150 * len(rows) + 80))


def gpu_timeline_figure(timeline: pl.DataFrame, run_id: str, windows: pl.DataFrame | None = None) -> go.Figure:
    """Utilization over time per GPU of one run; with ``windows`` (run_id, step, start_ts), a thin grey
    line where each training step starts, so idle stretches read against the steps."""
    d = timeline.filter(pl.col("run_id") == run_id).sort("ts")
    fig = go.Figure()
    w = windows.filter((pl.col("run_id") == run_id) & pl.col("start_ts").is_not_null()).sort("step") \
        if windows is not None and windows.height else None
    if w is not None and w.height and d.height:
        w = w.filter(pl.col("start_ts").is_between(d["ts"].min(), d["ts"].max()))
        xs = [x for t in w["start_ts"] for x in (t, t, None)]
        ys = [y for _ in range(w.height) for y in (0, 105, None)]
        text = [x for s in w["step"] for x in (f"step {s}", f"step {s}", None)]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="step starts", text=text, hoverinfo="text",
                                 line={"color": "rgba(120,120,120,0.35)", "width": 1}))
    for i, ((host, gpu), g) in enumerate(_groups(d, ["host", "gpu"])):
        label = f"{host}:{gpu}" if host else f"gpu {gpu}"
        fig.add_trace(go.Scatter(x=g["ts"], y=g["util_pct"], mode="lines", name=label, line={"color": _color(i), "width": 1}))
    fig.update_yaxes(title_text="utilization %", range=[0, 105])
    fig.update_xaxes(title_text="time")
    return _layout(fig, f"GPU utilization over time, {run_id}")


def gpu_step_figure(util: pl.DataFrame, run_id: str) -> go.Figure:
    """Per step: utilization of each GPU (markers) over the mean of the GPUs the job used (bars)."""
    d = util.filter((pl.col("run_id") == run_id) & (pl.col("scope") == "step")).sort("step")
    fig = go.Figure()
    if d.height:
        per_step = d.unique("step", keep="first").sort("step")
        fig.add_trace(go.Bar(x=per_step["step"], y=per_step["used_gpus_mean_util_pct"], name="mean of used GPUs",
                             marker={"color": "rgba(31,119,180,0.35)"}, customdata=per_step["gpu_spread_pct"],
                             hovertemplate="step %{x}: %{y:.1f} % (spread %{customdata:.1f} pts)"))
        for i, ((host, gpu), g) in enumerate(_groups(d, ["host", "gpu"])):
            fig.add_trace(go.Scatter(x=g["step"], y=g["mean_util_pct"], mode="markers", name=f"{host}:{gpu}" if host else gpu,
                                     marker={"color": _color(i + 1), "size": 7}, customdata=g["idle_share"],
                                     hovertemplate="step %{x}: %{y:.1f} % (idle %{customdata:.0%})"))
    fig.update_yaxes(title_text="utilization %", range=[0, 105])
    _step_ticks(fig, d["step"])
    return _layout(fig, f"GPU utilization per step (bars: mean of used GPUs, markers: each GPU), {run_id}")


def tool_latency_figure(cdf: pl.DataFrame, latency: pl.DataFrame) -> go.Figure:
    """Latency CCDF per run x tool on log-log axes, p99 marked."""
    fig = go.Figure()
    lines = []
    for i, ((run, tool), g) in enumerate(_groups(cdf.sort("value"), ["run_id", "tool_name"])):
        color = _color(i)
        fig.add_trace(go.Scatter(x=g["value"], y=g["share_ge"], mode="lines", line={"color": color, "shape": "hv"},
                                 name=f"{run} · {tool}"))
        q = latency.filter((pl.col("run_id") == run) & (pl.col("tool_name") == tool))
        if q.height and q["p99"][0] is not None and q["p99"][0] > 0:
            lines.append(vline(q["p99"][0], {"color": color, "dash": "dash", "width": 1}))
    fig.update_layout(shapes=lines)
    fig.update_xaxes(type="log", title_text="latency (s)")
    fig.update_yaxes(type="log", title_text="share of calls taking ≥ x")
    return _layout(fig, "Tool-call latency tail (dashed: p99)")


def tool_latency_by_turn_figure(by_turn: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    for i, ((run, tool), g) in enumerate(_groups(by_turn.sort("turn"), ["run_id", "tool_name"])):
        name = f"{run} · {tool}"
        fig.add_trace(go.Scatter(x=g["turn"], y=g["p50"], mode="lines+markers", name=f"{name} p50",
                                 line={"color": _color(i)}))
        fig.add_trace(go.Scatter(x=g["turn"], y=g["p99"], mode="lines+markers", name=f"{name} p99",
                                 line={"color": _color(i), "dash": "dash"}))
    fig.update_xaxes(title_text="turn index", dtick=1)
    fig.update_yaxes(type="log", title_text="latency (s)")
    return _layout(fig, "Tool-call latency by turn")


def multiturn_pmf_figure(pmf: pl.DataFrame) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("turns per trajectory", "tool calls per trajectory"))
    for col, var in ((1, "turns"), (2, "tool_calls")):
        for i, ((run,), g) in enumerate(_groups(pmf.filter(pl.col("variable") == var).sort("value"), ["run_id"])):
            fig.add_trace(go.Bar(x=g["value"], y=g["share"], name=run, legendgroup=run, showlegend=col == 1,
                                 marker={"color": _color(i)}), row=1, col=col)
    fig.update_yaxes(tickformat=".0%", title_text="share of trajectories", row=1, col=1)
    fig.update_xaxes(dtick=1)
    return _layout(fig, "Multi-turn structure (pmf)")


def multiturn_by_turn_figure(by_turn: pl.DataFrame) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("engine latency per turn (s)", "prefix-cache share of prompt tokens"))
    for i, ((run,), g) in enumerate(_groups(by_turn.sort("turn"), ["run_id"])):
        c = _color(i)
        fig.add_trace(go.Scatter(x=g["turn"], y=g["engine_latency_p50_s"], mode="lines+markers", name=f"{run} p50",
                                 line={"color": c}), row=1, col=1)
        fig.add_trace(go.Scatter(x=g["turn"], y=g["engine_latency_p90_s"], mode="lines+markers", name=f"{run} p90",
                                 line={"color": c, "dash": "dash"}), row=1, col=1)
        fig.add_trace(go.Bar(x=g["turn"], y=g["prefix_cache_share"], name=f"{run} cache share", marker={"color": c}),
                      row=1, col=2)
    fig.update_xaxes(title_text="turn index", dtick=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1], row=1, col=2)
    return _layout(fig, "Per-turn engine latency and prefix caching")


def filter_waste_figure(waste: pl.DataFrame, run_id: str) -> go.Figure:
    """Generated prompts per trainer step split into used, kept but surplus, and filtered out."""
    d = waste.filter(pl.col("run_id") == run_id).sort("trainer_step")
    used = d["prompts_used"].cast(pl.Float64)
    kept = d["prompts_kept"].cast(pl.Float64)
    gen = d["prompts_generated"].cast(pl.Float64)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=d["trainer_step"], y=used, name="used for training", marker={"color": "#2ca02c"}))
    fig.add_trace(go.Bar(x=d["trainer_step"], y=kept - used, name="kept, surplus", marker={"color": "#ffbb78"}))
    fig.add_trace(go.Bar(x=d["trainer_step"], y=gen - kept, name="filtered out", marker={"color": OUTLIER},
                         customdata=d["gen_batches"], hovertemplate="step %{x}: %{y} prompts (%{customdata} gen batches)"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="trainer step", dtick=1)
    fig.update_yaxes(title_text="prompts generated")
    return _layout(fig, f"Filtering waste per trainer step, {run_id}")


def compare_quantiles_figure(quantiles: pl.DataFrame, kind: str = "response") -> go.Figure:
    """Cross-run: the quantile profile (mean, p50, p90, p99, p99.9, max) of each run x task, log y."""
    d = quantiles.filter(pl.col("kind") == kind).sort("run_id", "task")
    cols = ("mean", "p50", "p90", "p99", "p999", "max")
    fig = go.Figure()
    for i, r in enumerate(d.iter_rows(named=True)):
        fig.add_trace(go.Scatter(x=list(cols), y=[r[c] for c in cols], mode="lines+markers",
                                 name=f"{r['run_id']} · {r['task']}", marker={"color": _color(i), "size": 8},
                                 line={"color": _color(i)}))
    fig.update_yaxes(type="log", title_text=f"{kind} tokens")
    return _layout(fig, f"Cross-run {kind} length quantiles")


def compare_variance_figure(variance: pl.DataFrame) -> go.Figure:
    """Cross-run: coefficient of variation per metric."""
    fig = go.Figure()
    for i, ((metric,), g) in enumerate(_groups(variance.sort("run_id"), ["metric"])):
        fig.add_trace(go.Bar(x=g["run_id"], y=g["cv"], name=metric, marker={"color": _color(i)}))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="CV (std / mean)")
    return _layout(fig, "Cross-run step-to-step variation")


def compare_imbalance_figure(imbalance: pl.DataFrame) -> go.Figure:
    """Cross-run: distribution of per-step max/mean for each run x phase x quantity (box)."""
    fig = go.Figure()
    # the view's rows have no order: sorted, the page is the same bytes every time
    for i, ((run,), g) in enumerate(_groups(imbalance.sort("phase", "quantity", "step"), ["run_id"])):
        labels = [f"{p} · {q}" for p, q in zip(g["phase"], g["quantity"], strict=True)]
        fig.add_trace(go.Box(x=labels, y=g["max_over_mean"], name=run, marker={"color": _color(i)}, boxpoints="all"))
    fig.update_layout(boxmode="group")
    fig.update_yaxes(type="log", title_text="max / mean per step")
    return _layout(fig, "Cross-run load imbalance")


def compare_curves_figure(curves: pl.DataFrame, alerts: pl.DataFrame, panels: tuple[tuple[str, str], ...],
                          axes: tuple[tuple[str, str], ...], title: str) -> go.Figure:
    """Per-step metrics of several runs (or step ranges) overlaid, one row per metric of ``panels``
    that some series has; ``curves`` holds a ``series`` label, the x columns of ``axes`` and the
    metric columns. Each series' alerts (``alerts``: series, kind, first_step, last_step, detail) are
    dashed lines in its colour at the alert's first step. Buttons switch the x axis between
    ``axes`` (aligned step, wall time, tokens seen, as the curves have them); the first is drawn."""
    rows = [(c, label) for c, label in panels if c in curves.columns and curves[c].drop_nulls().len()]
    have_axes = [(c, t) for c, t in axes if c in curves.columns and curves[c].drop_nulls().len()]
    fig = make_subplots(rows=max(len(rows), 1), cols=1, shared_xaxes=True, vertical_spacing=0.035,
                        subplot_titles=[label for _c, label in rows] or [""])
    if not rows or not have_axes:
        return fig
    series = list(dict.fromkeys(curves.sort("series", maintain_order=True)["series"].to_list()))
    xs: dict[str, list[list]] = {c: [] for c, _t in have_axes}  # per axis: the x of every trace, in order
    for i, name in enumerate(series):
        g = curves.filter(pl.col("series") == name).sort("step")
        al = alerts.filter(pl.col("series") == name) if alerts.height else alerts
        for r, (col, label) in enumerate(rows, start=1):
            d = g.filter(pl.col(col).is_not_null())
            fig.add_trace(go.Scatter(x=d[have_axes[0][0]], y=d[col], mode="lines+markers", marker={"size": 3},
                                     line={"color": _color(i), "width": 1.5}, name=name, legendgroup=name,
                                     showlegend=r == 1, customdata=d["step"],
                                     hovertemplate=f"{name}<br>step %{{customdata}}: %{{y:.4g}}<extra>{label}</extra>"),
                          row=r, col=1)
            for c, _t in have_axes:
                xs[c].append(d[c].to_list())
            if al.height and d.height:
                lo, hi = d[col].min(), d[col].max()
                cols = list(dict.fromkeys(["step", *[c for c, _t in have_axes]]))
                at = al.join(g.select(cols), left_on="first_step", right_on="step", suffix="_x")
                at = at.with_columns(step=pl.col("first_step")) if "step" not in at.columns else at
                if not at.height:
                    continue
                ys = [y for _ in range(at.height) for y in (lo, hi, None)]
                text = [f"{k}: {t}" for k, t in zip(at["kind"], at["detail"], strict=True) for _ in range(3)]
                fig.add_trace(go.Scatter(x=[x for v in at[have_axes[0][0]] for x in (v, v, None)], y=ys, mode="lines",
                                         line={"color": _color(i), "dash": "dash", "width": 1}, hovertext=text,
                                         hoverinfo="text", name=f"{name} alerts", legendgroup=name,
                                         showlegend=False), row=r, col=1)
                for c, _t in have_axes:
                    xs[c].append([x for v in at[c] for x in (v, v, None)])
    n = len(rows)
    bottom = f"xaxis{n if n > 1 else ''}"
    # integer ticks on a step axis of a short run (plotly would label 0.5 between two steps), none forced
    # on wall time or tokens
    few = curves["step"].n_unique() <= 15
    dtick = {c: 1 if few and c in ("step", "from_start") else None for c, _t in have_axes}
    fig.update_xaxes(title_text=have_axes[0][1], row=n, col=1)
    fig.update_xaxes(dtick=dtick[have_axes[0][0]])
    if len(have_axes) > 1:
        axes_ = [f"xaxis{i if i > 1 else ''}" for i in range(1, n + 1)]
        buttons = [{"label": f"x: {t}", "method": "update",
                    "args": [{"x": xs[c]}, {f"{bottom}.title.text": t, **{f"{a}.dtick": dtick[c] for a in axes_}}]}
                   for c, t in have_axes]
        # a dropdown at the right of the first row's (centred) title: it covers no curve and no title
        fig.update_layout(updatemenus=[{"type": "dropdown", "direction": "down", "buttons": buttons, "x": 1.0,
                                        "xanchor": "right", "y": 1.0, "yanchor": "bottom", "pad": {"b": 4},
                                        "showactive": True, "font": {"size": 11}}])
    fig = _layout(fig, title, height=max(300, 170 * n + 110))
    fig.update_layout(margin={"t": 110})
    return fig


def summary_check_figure(check: pl.DataFrame, run_id: str) -> go.Figure:
    """A run fitted from its per-step summaries: the fitted per-step quantiles (1-99% band, median,
    mean, expected min and max of the step's n; :func:`analyses.fit.summary_fit.summary_check`)
    against the min, mean and max each step logged."""
    fig = go.Figure()
    x = check["step"].to_list()
    fig.add_trace(go.Scatter(x=x, y=check["fitted_p99"].to_list(), mode="lines", line={"width": 0}, showlegend=False,
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=check["fitted_p01"].to_list(), mode="lines", line={"width": 0}, fill="tonexty",
                             fillcolor="rgba(31,119,180,0.18)", name="fitted 1-99%"))
    fig.add_trace(go.Scatter(x=x, y=check["fitted_p50"].to_list(), mode="lines", line={"color": "#1f77b4"}, name="fitted median"))
    fig.add_trace(go.Scatter(x=x, y=check["fitted_mean"].to_list(), mode="lines", line={"color": "#1f77b4", "dash": "dot"},
                             name="fitted mean"))
    for col, name in (("expected_min", "expected min of n"), ("expected_max", "expected max of n")):
        fig.add_trace(go.Scatter(x=x, y=check[col].to_list(), mode="lines", line={"color": "#7f7f7f", "dash": "dash"},
                                 name=name))
    for col, name, sym in (("logged_min", "logged min", "triangle-down"), ("logged_mean", "logged mean", "circle"),
                           ("logged_max", "logged max", "triangle-up")):
        fig.add_trace(go.Scatter(x=x, y=check[col].to_list(), mode="markers", marker={"color": "#d62728", "symbol": sym},
                                 name=name))
    fig.update_yaxes(type="log", title_text="response tokens")
    _step_ticks(fig, check["step"])
    return _layout(fig, f"{run_id}: fitted from per-step summaries vs what each step logged")
