"""A comparison for people: a ranked table (terminal), markdown (Dagster metadata) and a frame
(the report's table); the HTML page is the report's comparison section (:mod:`analyses.report`)."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import polars as pl

from analyses.compare import text as T
from analyses.compare.core import Comparison, Difference


def _cell(v: Any, d: Difference) -> str:
    if isinstance(v, float | int) and not isinstance(v, bool):
        scale = d.scale if d.scale in ("share", "pct") else "ratio"
        return T.number(v, "" if d.kind == "distribution" else d.unit, scale)
    if isinstance(v, list | dict):
        return json.dumps(v)
    return "" if v is None else str(v)


def differences_frame(cmp: Comparison, top: int | None = None, credible_only: bool = False) -> pl.DataFrame:
    """Rank, quantity, A, B, change, credible, verdict and the sentence, best first."""
    rows = [d for d in cmp.differences if d.credible or not credible_only][:top]
    return pl.DataFrame(
        {
            "rank": list(range(1, len(rows) + 1)),
            "quantity": [d.quantity for d in rows],
            "a": [_cell(d.a, d) for d in rows],
            "b": [_cell(d.b, d) for d in rows],
            "change": [d.change or ("" if d.kind != "distribution" else f"KS {d.extra['ks']:.3g}") for d in rows],
            "credible": [d.credible for d in rows],
            "verdict": [d.verdict for d in rows],
            "text": [d.text for d in rows],
        },
        schema={"rank": pl.Int64, "quantity": pl.String, "a": pl.String, "b": pl.String, "change": pl.String,
                "credible": pl.Boolean, "verdict": pl.String, "text": pl.String},
    )


def not_compared_lines(cmp: Comparison) -> list[str]:
    """What was not compared, for people: what only one side has in one line per side (its
    quantities' names), every other reason on its own line."""
    only: dict[str, list[str]] = {}
    rest = []
    for n in cmp.not_compared:
        reason = n["reason"]
        if reason.startswith(("only A has", "only B has")):
            only.setdefault(reason[5], []).append(n["quantity"])
        else:
            rest.append(f"{n['quantity']}: {reason}")
    return [f"only {who} has: {', '.join(qs)}" for who, qs in sorted(only.items())] + rest


def header_lines(cmp: Comparison) -> list[str]:
    d = cmp.to_dict()

    def side(s: dict[str, Any]) -> str:
        span = f"steps {s['first_step']}-{s['last_step']}, {s['steps']}" if s["steps"] else "no steps"
        return f"{s['label']} ({span})"

    return [f"A: {side(d['a'])}", f"B: {side(d['b'])}", f"compared on {cmp.alignment.note}",
            f"{len(cmp.credible)} credible difference(s) of {len(cmp.differences)} compared"]


def text_table(cmp: Comparison, top: int | None = None, width: int = 110) -> str:
    """The ranked differences as aligned text lines for a terminal, then what was not compared."""
    lines = header_lines(cmp) + [""]
    shown = cmp.differences[:top]
    qw = min(44, max([len("quantity"), *(len(d.quantity) for d in shown)]))
    lines.append(f"{'#':>3}  {'credible':8}  {'quantity':<{qw}}  difference")
    indent = 3 + 2 + 8 + 2 + qw + 2
    for i, d in enumerate(shown, start=1):
        wrapped = textwrap.wrap(d.text, max(40, width - indent)) or [""]
        q = d.quantity if len(d.quantity) <= qw else d.quantity[: qw - 1] + "…"
        lines.append(f"{i:>3}  {'yes' if d.credible else 'no':8}  {q:<{qw}}  {wrapped[0]}")
        lines.extend(" " * indent + w for w in wrapped[1:])
    if top is not None and len(cmp.differences) > top:
        lines.append(f"     ... {len(cmp.differences) - top} more (--top 0 shows all)")
    if cmp.not_compared:
        lines += ["", "not compared:"] + [f"  - {n}" for n in not_compared_lines(cmp)]
    if cmp.notes[1:]:
        lines += ["", "notes:"] + [f"  - {n}" for n in cmp.notes[1:]]
    lines += ["", "test: " + cmp.test]
    return "\n".join(lines)


def markdown(cmp: Comparison, top: int = 15) -> str:
    """Header, the ranked differences (top ``top``) as a markdown table, and what was not compared."""
    from analyses.markdown import markdown_table

    parts = ["  \n".join(header_lines(cmp)), "",
             markdown_table(differences_frame(cmp).select("rank", "quantity", "a", "b", "credible", "text"), n=top,
                            max_chars=200)]
    if cmp.not_compared:
        parts += ["", "**Not compared:** " + "; ".join(not_compared_lines(cmp))]
    return "\n".join(parts)
