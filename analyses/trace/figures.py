"""The profiler-trace view group's figures (:mod:`analyses.views.profiler_trace`): kept out of the
view module so that the catalog, which imports every view group, never imports plotly."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from analyses import figures as F
from analyses.trace import idle


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    """The report's look (analyses.figures' template), for this group's figures."""
    fig.update_layout(title={"text": title, "x": 0.01, "xanchor": "left"}, **F.template_arg(), height=height,
                      margin={"l": 60, "r": 20, "t": 60, "b": 50}, legend={"orientation": "h", "y": -0.18})
    return fig


_IDLE_COLORS = {"busy": "#2ca02c", "host_wait": "#d62728", "kernel_wait": "#ff7f0e", "other": "#7f7f7f"}
MAX_TIMELINE_RANKS = 8


def timeline_figure(tl: pl.DataFrame, run_id: str, stragglers: pl.DataFrame | None = None) -> go.Figure:
    """Per rank (up to 8), GPU busy and idle-by-cause shares per time bin, stacked; the title names
    the potential stragglers."""
    d = tl.filter(pl.col("run_id") == run_id).sort("rank", "bin")
    late = [] if stragglers is None else sorted(
        stragglers.filter((pl.col("run_id") == run_id) & pl.col("is_potential_straggler"))["rank"].to_list())
    ranks = d["rank"].unique(maintain_order=True).to_list()[:MAX_TIMELINE_RANKS]
    fig = make_subplots(rows=max(len(ranks), 1), cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=[f"rank {r}" for r in ranks] or [""])
    for i, r in enumerate(ranks, start=1):
        g = d.filter(pl.col("rank") == r)
        for state, color in _IDLE_COLORS.items():
            fig.add_trace(go.Bar(x=g["t_s"], y=g[f"{state}_share"], width=g["width_s"], offset=0, name=state,
                                 marker={"color": color, "line": {"width": 0}}, legendgroup=state, showlegend=i == 1),
                          row=i, col=1)
        fig.update_yaxes(range=[0, 1], tickformat=".0%", row=i, col=1)
    fig.update_layout(barmode="stack", bargap=0)
    fig.update_xaxes(title_text="seconds since the run's first traced event", row=max(len(ranks), 1), col=1)
    more = f" (first {MAX_TIMELINE_RANKS} of {d['rank'].n_unique()} ranks)" if d["rank"].n_unique() > MAX_TIMELINE_RANKS else ""
    who = f" — potential stragglers: rank {', '.join(map(str, late))}" if late else ""
    return _layout(fig, f"GPU busy and idle by cause per rank, {run_id}{more}{who}",
                     height=160 + 110 * max(len(ranks), 1))


def kernel_types_figure(kt: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    for i, ((t,), g) in enumerate(kt.sort("kernel_type").group_by("kernel_type", maintain_order=True)):
        fig.add_trace(go.Bar(x=g["run_id"], y=g["share_pct"], name=t, marker={"color": F.PALETTE[i % len(F.PALETTE)]}))
    fig.update_layout(barmode="stack", yaxis_title="% of GPU kernel time")
    return _layout(fig, "Kernel time by type (HTA's kernel types, overlaps apart)")


def top_kernels_figure(top: pl.DataFrame, run_id: str) -> go.Figure:
    d = (top.filter((pl.col("run_id") == run_id) & ~pl.col("is_others"))
         .group_by("kernel_type", "name").agg(pl.col("sum_s").sum()).sort("sum_s", descending=True).head(15)
         .sort("sum_s"))
    labels = [n if len(n) <= 70 else n[:67] + "..." for n in d["name"].to_list()]
    fig = go.Figure(go.Bar(x=d["sum_s"], y=labels, orientation="h",
                           marker={"color": [F.PALETTE[("COMPUTATION", "COMMUNICATION", "MEMORY").index(t)]
                                             for t in d["kernel_type"].to_list()]},
                           text=d["kernel_type"], textposition="none", hovertext=d["name"]))
    fig.update_layout(xaxis_title="seconds (all ranks)", yaxis={"automargin": True})
    return _layout(fig, f"Top kernels, {run_id}", height=160 + 24 * max(d.height, 1))


def idle_by_stage_figure(idle_df: pl.DataFrame, run_id: str) -> go.Figure:
    d = (idle_df.filter(pl.col("run_id") == run_id)
         .with_columns(pl.col("stage").fill_null("(no stage)"))
         .group_by("stage", "idle_category").agg(pl.col("idle_time_s").sum()).sort("stage"))
    fig = go.Figure()
    for cat in idle.CATEGORIES:
        g = d.filter(pl.col("idle_category") == cat)
        fig.add_trace(go.Bar(x=g["stage"], y=g["idle_time_s"], name=cat, marker={"color": _IDLE_COLORS[cat]}))
    fig.update_layout(barmode="stack", yaxis_title="GPU stream idle seconds (all ranks and streams)")
    return _layout(fig, f"GPU idle time by cause and RL stage, {run_id}")
