"""The characterization report: one self-contained HTML file (plotly.js embedded, opens offline)
with a section per view group, a cross-run comparison when several runs are selected, and
static PNGs of the key figures (analyses.png_render: a system Chrome/Chromium) when a browser is available.

Data come from the views (:mod:`analyses.views`), pictures from :mod:`analyses.figures`; this
module only arranges them.
"""

from __future__ import annotations

import html
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import plotly.io as pio
import polars as pl

from analyses import figures as F
from analyses.atomic_output import staged_dir, write_text
from analyses.figures import FigureSpec
from analyses.markdown import format_value
from analyses.views import View, ViewGroup, all_views, headline_frame, view_frame, view_groups

if TYPE_CHECKING:
    from analyses.png_render import PngRenderer, PngResult

# (event, data): the events analyses.cli.work_progress shows, as fit and fidelity send them
WorkEvents = Callable[[str, dict[str, Any]], None]

DEFAULT_NAME = "polytrace_report.html"
# a report over more runs than this exports PNGs of the cross-run figures only (per-run ones with
# --all-png): 100 runs would otherwise write hundreds of pictures nobody asked for, minutes of Chromium
PNG_MAX_RUNS = 8


@dataclass
class Section:
    group: str
    title: str
    question: str
    needs: str
    headline: pl.DataFrame
    figures: list[FigureSpec] = field(default_factory=list)
    views: tuple[View, ...] = ()
    notes: list[str] = field(default_factory=list)  # lines shown under the headline table
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)  # (caption, frame) after the notes

    @property
    def empty(self) -> bool:
        return self.headline.height == 0 and not self.figures


@dataclass
class ReportResult:
    path: Path
    sections: list[Section]
    pngs: dict[str, Path] = field(default_factory=dict)  # figure key -> PNG
    png_note: str | None = None  # why PNGs are missing, when they are

    @property
    def n_figures(self) -> int:
        return sum(len(s.figures) for s in self.sections)


ViewReader = Callable[[str], pl.DataFrame]

# views that most others read: the report computes each once for its runs, into a temp table that
# shadows the view on the report's connection only, as it does every view a headline reads (the
# group's figures read it again). sample_lengths is not one of them, though three length views read
# it: at 51 M samples its temp table held 57 M rows (2-4 GB of a bounded report's memory, pushing the
# later sections to spill) and took as long to build as the three views take each reading it.
# trajectories (multiturn and multiturn_pmf read it) is: 14 M rows at 51 M samples, ~1 GB, but a
# full join that takes a minute to compute
SHARED_VIEWS = ("training_health", "trajectories")


def report_views() -> list[str]:
    """:data:`SHARED_VIEWS` and the views the headlines read, in catalog order (a view is computed
    from the temp tables of those before it)."""
    names = {v.name for v in all_views()}
    wanted = set(SHARED_VIEWS) | {n for g in view_groups() for n in names if re.search(rf"\b{n}\b", g.headline_sql)}
    return [v.name for v in all_views() if v.name in wanted]


def view_reader(con: duckdb.DuckDBPyConnection, runs: list[str]) -> ViewReader:
    """``view_frame`` for ``runs``, each view read once (sections and the comparison share frames)."""
    frames: dict[str, pl.DataFrame] = {}

    def read(name: str) -> pl.DataFrame:
        if name not in frames:
            frames[name] = view_frame(con, name, runs)
        return frames[name]
    return read


@contextmanager
def shared_views_once(con: duckdb.DuckDBPyConnection, runs: list[str]) -> Iterator[None]:
    """Within the block, :func:`report_views` are temp tables of their rows for ``runs`` (every view
    is per run, so the views built on them give the same rows for those runs); dropped on exit."""
    made = []
    # a view's rows have no order (none sorts): keeping the scan's order while materializing made
    # sample_lengths 2.6x slower at 51 M samples. Only the materializing goes without it: a
    # headline's ORDER BY sits in a subquery under a filter, and holds there only with it
    keep_order = con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()[0]
    try:
        con.execute("SET preserve_insertion_order = false")
        try:
            for name in report_views():
                con.execute(f'CREATE TEMP TABLE "{name}" AS SELECT * FROM main."{name}" '
                            "WHERE run_id IN (SELECT unnest($1))", [runs])
                made.append(name)
        finally:
            con.execute(f"SET preserve_insertion_order = {bool(keep_order)}")
        yield
    finally:
        for name in reversed(made):
            con.execute(f'DROP TABLE IF EXISTS temp."{name}"')


@F.house_template()
def group_section(con: duckdb.DuckDBPyConnection, group: ViewGroup, runs: list[str],
                  read: ViewReader | None = None) -> Section:
    """The headline table and figures of one view group for ``runs`` (``read``: a shared :func:`view_reader`)."""
    read = read or view_reader(con, runs)
    head = headline_frame(con, group.name, runs)
    figs = [f for f in group.figures(read, runs) if f.drawn] if head.height else []
    return Section(group.name, group.title, group.question, group.needs, head, figs, group.views)


# the comparison section ranks each run's differences from the first chosen run up to this many runs
# (a comparison is a second or two), and overlays the curves of at most this many runs (readable lines)
PAIRWISE_MAX_RUNS = 8
CURVES_MAX_RUNS = 12
PAIR_TOP = 12  # ranked differences shown per pair


@F.house_template()
def comparison_section(con: duckdb.DuckDBPyConnection, runs: list[str], read: ViewReader | None = None) -> Section:
    """Cross-run comparison: per-step curves overlaid on an aligned axis with the alerts marked, the
    ranked credible differences of each run from the first (:mod:`analyses.compare`), then length
    quantiles, step-time variation and imbalance side by side."""
    from analyses.compare import Side, compare_data
    from analyses.compare.collect import load_run
    from analyses.compare.curves import AXES, PANELS, run_curves
    from analyses.compare.render import differences_frame, not_compared_lines

    read = read or view_reader(con, runs)
    curves, alerts = run_curves(con, runs[:CURVES_MAX_RUNS])
    q = read("length_quantiles")
    head = q.filter(pl.col("kind") == "response").select(
        "run_id", "task", "n", pl.col("mean").round(1), "p50", "p90", "p99", "p999", "max",
        pl.col("max_over_mean").round(2), pl.col("p99_over_p50").round(2)).sort("run_id", "task")
    cdf = read("length_cdf")
    figs = [
        FigureSpec("compare__curves", F.compare_curves_figure(curves, alerts, PANELS, AXES,
                                                              "Per-step metrics, runs overlaid (dashed: alerts)"), True),
        FigureSpec("compare__cdf_response", F.length_cdf_figure(cdf, q, "response"), True),
        FigureSpec("compare__quantiles", F.compare_quantiles_figure(q), True),
        FigureSpec("compare__variance", F.compare_variance_figure(read("step_variance"))),
        FigureSpec("compare__imbalance", F.compare_imbalance_figure(read("rank_imbalance"))),
    ]
    tables, notes = [], []
    if len(runs) > CURVES_MAX_RUNS:
        notes.append(f"the per-step curves are those of the first {CURVES_MAX_RUNS} runs chosen (--runs picks them)")
    if len(runs) <= PAIRWISE_MAX_RUNS:
        base = runs[0]
        base_data = load_run(con, base)
        for other in runs[1:]:
            cmp = compare_data(Side(base), Side(other), base_data, load_run(con, other))
            top = PAIR_TOP if len(runs) == 2 else max(3, PAIR_TOP // (len(runs) - 1))
            caption = (f"{other} against {base}: {len(cmp.credible)} credible difference(s) "
                       f"(top {top}{', credible only' if len(runs) > 2 else ''}), on {cmp.alignment.note}")
            tables.append((caption, differences_frame(cmp, top=top, credible_only=len(runs) > 2).drop("verdict")))
            notes += [f"{other} against {base}, not compared: {n}" for n in not_compared_lines(cmp)]
        notes.append("credible: beyond the step-to-step spread of both runs (a moving-block bootstrap over steps, "
                     "Holm-adjusted); `polytrace compare A B` gives every difference and the test")
    else:
        notes.append(f"more than {PAIRWISE_MAX_RUNS} runs: no pairwise ranking (`polytrace compare A B` ranks any two)")
    return Section("compare", "Cross-run comparison", f"How do the {len(runs)} selected runs differ, and is it real?",
                   COMPARISON_NEEDS, head, [f for f in figs if f.drawn], notes=notes, tables=tables)


@F.house_template()
def pair_section(con: duckdb.DuckDBPyConnection, cmp: Any) -> Section:
    """The section of one :class:`~analyses.compare.Comparison` (``polytrace compare --format html``):
    every ranked difference, the two sides' per-step curves overlaid, what was not compared."""
    from analyses.compare.curves import AXES, PANELS, side_curves
    from analyses.compare.render import differences_frame, not_compared_lines

    a, b = f"A: {cmp.a.label}", f"B: {cmp.b.label}"
    curves, alerts = side_curves(con, [(a, cmp.a, cmp.alignment.steps_a), (b, cmp.b, cmp.alignment.steps_b)])
    axes = AXES if cmp.alignment.paired else (AXES[1], AXES[0], *AXES[2:])  # step ranges: aligned at their start
    fig = F.compare_curves_figure(curves, alerts, PANELS, axes, f"{cmp.b.label} against {cmp.a.label}, per step")
    notes = [f"compared on {cmp.alignment.note}", *cmp.notes[1:]]
    notes += [f"not compared: {n}" for n in not_compared_lines(cmp)]
    notes.append("test: " + cmp.test)
    return Section("compare", f"{cmp.b.label} against {cmp.a.label}",
                   f"What changed from A to B, and by how much? {len(cmp.credible)} credible difference(s).",
                   "two runs or step ranges", differences_frame(cmp).drop("verdict"),
                   [f for f in [FigureSpec("compare__curves", fig, True)] if f.drawn], notes=notes)


# what the comparison reads (its curves and ranked differences: per-step metrics; its table and CDF:
# length_quantiles; its other figures: step_variance and rank_imbalance), said when the selected runs have none of it
COMPARISON_NEEDS = ("per-step metrics (steps / training_health: response length, step and generation time, "
                    "throughput, reward, entropy) for its curves and ranked differences; per-sample response lengths "
                    "(samples.response_tokens: PolyTrace logs, rollout dumps) for its table and length CDF; "
                    "per-rank times (rank_times) for its imbalance figure")


def selected_runs(con: duckdb.DuckDBPyConnection, runs: Iterable[str] | None) -> list[str]:
    have = [r[0] for r in con.sql("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    if runs is None:
        return have
    wanted = list(dict.fromkeys(runs))
    missing = [r for r in wanted if r not in have]
    if missing:
        raise KeyError(f"run(s) not in the warehouse: {', '.join(missing)} (have: {', '.join(have) or 'none'})")
    return wanted


@F.house_template()  # once for all its sections (the setter validates a whole template)
def build_sections(con: duckdb.DuckDBPyConnection, runs: list[str], progress: WorkEvents | None = None,
                   on_section: Callable[[Section], None] | None = None) -> list[Section]:
    """A section per view group (and a comparison when several runs are chosen); ``progress``
    hears ``run_start``/``run_done`` per section (the events :mod:`analyses.cli.work_progress` shows);
    ``on_section`` is handed each section as soon as it is built (its PNGs start meanwhile)."""
    emit = progress or (lambda _e, _d: None)
    built = on_section or (lambda _s: None)
    out = []
    read = view_reader(con, runs)
    with shared_views_once(con, runs):
        for g in view_groups():
            emit("run_start", {"run_id": g.title, "origins": 0})
            out.append(group_section(con, g, runs, read))
            built(out[-1])
            emit("run_done", {"run_id": g.title})
        if len(runs) > 1:
            emit("run_start", {"run_id": "comparison", "origins": 0})
            out.append(comparison_section(con, runs, read))
            built(out[-1])
            emit("run_done", {"run_id": "comparison"})
    return out


@F.house_template()  # once for all its sections (the setter validates a whole template)
def group_sections(con: duckdb.DuckDBPyConnection, names: list[str], runs: list[str]) -> dict[str, Section]:
    """The sections of the view groups ``names`` (every view read once, the shared views
    materialized once when there are several), by group name."""
    read = view_reader(con, runs)
    chosen = [g for g in view_groups() if g.name in names]
    if len(chosen) < 2:
        return {g.name: group_section(con, g, runs, read) for g in chosen}
    with shared_views_once(con, runs):
        return {g.name: group_section(con, g, runs, read) for g in chosen}


def report_steps(runs: list[str], png: bool) -> int:
    """How many progress steps :func:`build_report` reports: sections, the comparison, the PNGs."""
    return len(view_groups()) + (len(runs) > 1) + bool(png)


# ---------------------------------------------------------------- PNG export (analyses.png_render)


def find_browser() -> str | None:
    """The Chrome/Chromium the PNG export uses: $BROWSER_PATH, else the first on PATH."""
    import os

    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if Path(env).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _renderer() -> tuple[Any, str | None]:
    """(the process's :class:`~analyses.png_render.PngRenderer`, None), or (None, why PNGs cannot
    be written)."""
    try:
        import choreographer  # noqa: F401 - the browser driver (a dependency; an install without it still writes the HTML)
    except ImportError:
        return None, "PNG export skipped: the choreographer package is not installed (pip install choreographer)"
    browser = find_browser()
    if browser is None:
        return None, ("PNG export skipped: no Chrome/Chromium found (apt-get install chromium, or set BROWSER_PATH); "
                      "the HTML report is complete without it")
    from analyses import png_render

    return png_render.start(browser, png_render.cpu_tabs()), None


def start_png_browser() -> None:
    """Start the browser :class:`PngBatch` uses, now and without waiting: it starts on a thread of
    its own, so its start-up (seconds) overlaps the caller's work until the first PNG is asked
    for. Nothing happens without a browser."""
    _renderer()


PLOTLY_RENDERER = "polytrace_png"


def register_png_renderer() -> str:
    """Register plotly renderer ``polytrace_png`` (a figure shown as a PNG drawn in this process's
    browser, started now) and return its name: a notebook shows figures with
    ``pio.renderers.default = "plotly_mimetype+polytrace_png"``, one Chromium for all of them."""
    import plotly.io as pio

    from analyses.png_render import plotly_renderer

    pio.renderers[PLOTLY_RENDERER] = plotly_renderer(find_browser())
    start_png_browser()
    return PLOTLY_RENDERER


class PngBatch:
    """Figures sent to the process's browser (:mod:`analyses.png_render`, started on the first
    figure and kept until exit) as soon as they are built, and written as PNG files at the end:
    the browser draws on the other core while the caller builds the next section."""

    def __init__(self, width: int = 1100) -> None:
        self.width = width
        self._specs: list[FigureSpec] = []
        self._pending: list[Future[list[PngResult]]] = []
        self._renderer: PngRenderer | None = None
        self._missing: str | None = None

    def submit(self, specs: Sequence[FigureSpec]) -> None:
        if not specs:
            return
        if self._renderer is None and self._missing is None:
            self._renderer, self._missing = _renderer()
        if self._renderer is None:
            return
        from analyses.png_render import PngJob

        self._specs += specs
        self._pending.append(self._renderer.submit(
            [PngJob(s.fig.to_json(validate=False), self.width, s.fig.layout.height or 420) for s in specs]))

    def write(self, out_dir: Path) -> tuple[dict[str, Path], str | None]:
        """Wait for every figure submitted and write its PNG under ``out_dir``: (key -> path, note
        on what is missing and why)."""
        if self._missing is not None:
            return {}, self._missing
        if not self._specs:
            return {}, None
        try:
            results = [r for fut in self._pending for r in fut.result()]
        except Exception as exc:  # a browser that cannot start must not cost the HTML report
            return {}, f"PNG export failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {s.key: out_dir / f"{s.key}.png" for s in self._specs}
        done: dict[str, Path] = {}
        for (key, path), res in zip(paths.items(), results, strict=True):
            if res.png:
                path.write_bytes(res.png)
                done[key] = path
        if len(done) == len(paths):
            return done, None
        first = next((f"{k}: {r.error}" for k, r in zip(paths, results, strict=True) if r.error), "")
        return done, f"PNG export wrote {len(done)} of {len(paths)} figures" + (f" (first failure {first})" if first else "")


def write_pngs(specs: list[FigureSpec], out_dir: Path, width: int = 1100) -> tuple[dict[str, Path], str | None]:
    """Render figures to PNG in the process's browser (:class:`PngBatch` of them all); returns
    (key -> path, note)."""
    batch = PngBatch(width)
    batch.submit(specs)
    return batch.write(out_dir)


# ---------------------------------------------------------------- HTML

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2d3d;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;font-size:13px;color:#cfd8e3}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 24px;z-index:10;font-size:13px}
nav a{margin-right:14px;color:#1f77b4;text-decoration:none}nav a.empty{color:#aaa}
section{background:#fff;margin:18px 24px;padding:12px 20px;border:1px solid #e3e3e3;border-radius:6px}
section h2{margin:4px 0;font-size:18px}.q{color:#555;margin:2px 0 10px;font-style:italic}
table{border-collapse:collapse;font-size:12px;margin:8px 0;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}th{background:#f0f3f6}
td:first-child,th:first-child{text-align:left}.empty-note{color:#888}
details{font-size:12px;color:#444;margin:6px 0}details code{white-space:pre-wrap}
.figure{margin:10px 0;min-height:200px}footer{font-size:12px;color:#666;margin:18px 24px}
#compare td:last-child{white-space:normal;text-align:left;min-width:34em}.notes{font-size:12px;color:#444}
h3.table-caption{font-size:13px;margin:14px 0 2px;font-weight:600}
"""


def _fmt(v: object) -> str:
    return format_value(v, max_items=12)


def frame_html(df: pl.DataFrame, max_rows: int = 60) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in df.head(max_rows).iter_rows()
    )
    more = f"<p class='empty-note'>{df.height - max_rows} more rows</p>" if df.height > max_rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _section_html(s: Section) -> str:
    parts = [f"<section id='{s.group}' data-group='{s.group}'><h2>{html.escape(s.title)}</h2>",
             f"<p class='q'>{html.escape(s.question)}</p>"]
    if s.empty:
        parts.append(f"<p class='empty-note'>No data in the selected runs: this view needs {html.escape(s.needs)}.</p>")
    else:
        if s.headline.height:
            parts.append(frame_html(s.headline))
        for caption, frame in s.tables:
            parts.append(f"<h3 class='table-caption'>{html.escape(caption)}</h3>{frame_html(frame)}")
        if s.notes:
            parts.append("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in s.notes) + "</ul>")
        for spec in s.figures:
            div = pio.to_html(spec.fig, full_html=False, include_plotlyjs=False, div_id=f"fig-{spec.key}",
                              config={"displaylogo": False, "responsive": True})
            parts.append(f"<div class='figure' data-figure='{spec.key}'>{div}</div>")
    if s.views:
        docs = "".join(f"<li><code>{v.name}</code>: {html.escape(v.doc)}</li>" for v in s.views)
        parts.append(f"<details><summary>Views and definitions</summary><ul>{docs}</ul></details>")
    parts.append("</section>")
    return "\n".join(parts)


def render_html(sections: list[Section], runs: list[str], warehouse: str, png_note: str | None,
                title: str = "PolyTrace workload characterization") -> str:
    from plotly.offline import get_plotlyjs

    nav = "".join(f"<a href='#{s.group}' class='{'empty' if s.empty else ''}'>{html.escape(s.title)}</a>" for s in sections)
    n_fig = sum(len(s.figures) for s in sections)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    foot = html.escape(png_note) if png_note else "Static PNGs of the key figures were written next to this file."
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body data-figures="{n_fig}">
<header><h1>{html.escape(title)}</h1>
<p>{len(runs)} run(s): {html.escape(", ".join(runs))} · warehouse {html.escape(warehouse)} · generated {generated}</p></header>
<nav>{nav}</nav>
{"".join(_section_html(s) for s in sections)}
<footer>{foot}</footer>
</body></html>
"""


def png_specs(figs: list[FigureSpec], runs: list[str], all_pngs: bool = False) -> tuple[list[FigureSpec], int]:
    """The figures to export as PNG and how many key figures were left out: every figure with
    ``all_pngs``; else the key figures, per-run ones (key ``group__figure__<run>``) only when at
    most :data:`PNG_MAX_RUNS` runs are chosen."""
    if all_pngs:
        return figs, 0
    keys = [f for f in figs if f.key_figure]
    if len(runs) <= PNG_MAX_RUNS:
        return keys, 0
    suffixes = tuple(f"__{F.safe_key(r)}" for r in runs)
    kept = [f for f in keys if not f.key.endswith(suffixes)]
    return kept, len(keys) - len(kept)


def _write_png_dir(batch: PngBatch, png_dir: Path, default_dir: bool) -> tuple[dict[str, Path], str | None]:
    """The figures of ``batch`` (drawing since they were submitted) written into a staged
    directory that replaces ``png_dir`` whole, in one rename
    (:func:`analyses.atomic_output.staged_dir`); when no PNG could be written (no browser), the
    previous directory stays as it was. The default ``<stem>_png`` directory of an older report
    (PNG files only, no marker) is replaced too; a ``--png-dir`` holding other files is refused."""
    owned = default_dir and png_dir.is_dir() and all(p.is_file() and p.suffix == ".png" for p in png_dir.iterdir())
    with staged_dir(png_dir, "report PNGs", owned=owned) as stage:
        written, note = batch.write(stage.path)
        stage.keep = bool(written)
    return {k: png_dir / p.name for k, p in written.items()}, note


@F.house_template()  # once for all its sections (the setter validates a whole template)
def build_report(
    con: duckdb.DuckDBPyConnection,
    out: Path,
    runs: Iterable[str] | None = None,
    png: bool = True,
    png_dir: Path | None = None,
    all_pngs: bool = False,
    source: str = "",
    progress: WorkEvents | None = None,
    extra: Iterable[Section] = (),
    on_section: Callable[[Section], None] | None = None,
) -> ReportResult:
    """Write the HTML report for ``runs`` (default: all) of the catalog ``con`` to ``out``.

    PNGs of the key figures (every figure with ``all_pngs``) go to ``png_dir`` (default: a
    ``<out stem>_png`` directory beside the HTML) when ``png`` and a browser is available.
    ``source`` names the warehouse in the report's header. ``progress`` hears ``start`` (the
    steps, :func:`report_steps`) and ``run_start``/``run_done`` per section and for the PNGs.
    ``extra``: sections built from outside the catalog (the fitted workloads), after the views'.
    ``on_section`` is handed each section as soon as it is built (``extra`` first): the PNGs of
    one are drawn while the next is built, here and in the Dagster asset.
    """
    emit = progress or (lambda _e, _d: None)
    chosen = selected_runs(con, runs)
    emit("start", {"runs": report_steps(chosen, png)})
    batch = PngBatch() if png else None

    def built(section: Section) -> None:
        if batch is not None:
            batch.submit(png_specs(section.figures, chosen, all_pngs)[0])
        if on_section is not None:
            on_section(section)

    extra = list(extra)
    for s in extra:
        built(s)
    sections = build_sections(con, chosen, progress, built) + extra
    pngs: dict[str, Path] = {}
    note: str | None = "PNG export not requested"
    if batch is not None:
        specs, skipped = png_specs([f for s in sections for f in s.figures], chosen, all_pngs)
        emit("run_start", {"run_id": f"{len(specs)} PNGs", "origins": 0})
        pngs, note = _write_png_dir(batch, png_dir if png_dir is not None else out.with_name(out.stem + "_png"),
                                    default_dir=png_dir is None)
        pngs = {f.key: pngs[f.key] for f in specs if f.key in pngs}  # in the sections' order
        if skipped and note is None:
            note = (f"PNGs of the cross-run figures only: {skipped} per-run figures of {len(chosen)} runs "
                    f"(more than {PNG_MAX_RUNS}) are in the HTML; --all-png exports them too")
        emit("run_done", {"run_id": "PNGs"})
    # the HTML last: a report file is never older than the PNG directory beside it
    write_text(out, render_html(sections, chosen, source, note))
    return ReportResult(out, sections, pngs, note)


def build_comparison_report(con: duckdb.DuckDBPyConnection, cmp: Any, out: Path, png: bool = True,
                            png_dir: Path | None = None, source: str = "") -> ReportResult:
    """One self-contained HTML page for a :class:`~analyses.compare.Comparison` (its
    :func:`pair_section`), with a PNG of its overlaid curves beside it when a browser is available."""
    section = pair_section(con, cmp)
    pngs: dict[str, Path] = {}
    note: str | None = "PNG export not requested"
    if png:
        batch = PngBatch()
        batch.submit(section.figures)
        pngs, note = _write_png_dir(batch, png_dir if png_dir is not None else out.with_name(out.stem + "_png"),
                                    default_dir=png_dir is None)
    # the page last, whole or not at all (analyses.atomic_output), as the report's
    write_text(out, render_html([section], [cmp.a.label, cmp.b.label], source, note,
                                title=f"PolyTrace comparison: {cmp.b.label} against {cmp.a.label}"))
    return ReportResult(out, [section], pngs, note)
