"""Readable log-axis ticks (issue 13): 1-2-5 or decades with short labels, plotly's own within a decade."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analyses.figures import log_ticks, readable_log_axes, short_number


def test_short_labels() -> None:
    assert [short_number(v) for v in (0.001, 5, 1000, 20000, 1_500_000, 2e9)] == ["0.001", "5", "1k", "20k", "1.5M", "2B"]


def test_many_decades_keep_powers_of_ten_only() -> None:
    # 1-2-5 between 3 and 16000: 5, 10, ..., 10000 = 11 ticks, over the limit of 10: the powers of ten
    assert log_ticks(3, 16000) == ([10.0, 100.0, 1000.0, 10000.0], ["10", "100", "1k", "10k"])


def test_three_decades_get_one_two_five() -> None:
    vals, labels = log_ticks(0.001, 1)
    assert labels == ["0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1"]


def test_within_one_decade_plotly_ticks_are_kept() -> None:
    assert log_ticks(1.02, 1.44) == ([], []) and log_ticks(0, 10) == ([], [])


def test_each_log_axis_of_a_figure_gets_ticks_from_its_own_traces() -> None:
    fig = make_subplots(rows=1, cols=2)
    fig.add_trace(go.Scatter(x=[1, 2, 3], y=[5, 50, 5000]), row=1, col=1)  # y1: 5..5000
    fig.add_trace(go.Scatter(x=[1, 2], y=[1.1, 1.3]), row=1, col=2)  # y2: within a decade
    fig.update_yaxes(type="log")
    readable_log_axes(fig)
    assert list(fig.layout.yaxis.ticktext) == ["5", "10", "20", "50", "100", "200", "500", "1k", "2k", "5k"]
    assert fig.layout.yaxis2.tickvals is None and fig.layout.xaxis.tickvals is None  # linear x untouched
