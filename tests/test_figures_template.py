"""The house template: figures built inside :func:`analyses.figures.house_template` start from
plotly_white, the caller's default comes back afterwards, and a nested use does not switch (and so
does not re-validate) the default again."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from analyses import figures as F


@pytest.fixture
def ggplot_default():
    before = pio.templates.default
    pio.templates.default = "ggplot2"
    yield
    pio.templates.default = before


def test_figures_inside_get_the_house_template_and_the_callers_default_returns(ggplot_default: None) -> None:
    with F.house_template():
        fig = go.Figure()
        assert F.template_arg() == {}
    assert fig.layout.template == pio.templates[F.TEMPLATE]
    assert pio.templates.default == "ggplot2"
    assert F.template_arg() == {"template": F.TEMPLATE}


def test_a_nested_use_leaves_the_default_alone(ggplot_default: None, monkeypatch: pytest.MonkeyPatch) -> None:
    switches: list[object] = []
    real = type(pio.templates).default

    class Counting(type(pio.templates)):  # type: ignore[misc]
        @real.setter
        def default(self, value: object) -> None:
            switches.append(value)
            real.fset(self, value)

    monkeypatch.setattr(pio.templates, "__class__", Counting)
    with F.house_template():
        with F.house_template():
            inner = go.Figure()
        assert pio.templates.default == F.TEMPLATE
    assert inner.layout.template == pio.templates[F.TEMPLATE]
    assert switches == [F.TEMPLATE, "ggplot2"]
    assert pio.templates.default == "ggplot2"


def test_the_default_returns_after_an_error(ggplot_default: None) -> None:
    with pytest.raises(RuntimeError), F.house_template():
        raise RuntimeError("a builder failed")
    assert pio.templates.default == "ggplot2"
