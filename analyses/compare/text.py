"""Numbers and changes in plain words: ``+38% (2,412 → 3,330 tokens)``, ``+4.1 pts (0.2% → 4.3%)``."""

from __future__ import annotations

import math


def number(v: float | int | None, unit: str = "", scale: str = "ratio") -> str:
    """One value as a person reads it: shares as percentages, large numbers with separators,
    three significant digits otherwise, the unit after it."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if scale == "share":
        return f"{100 * v:.3g}%" if abs(v) >= 0.001 or v == 0 else f"{100 * v:.2g}%"
    if scale == "pct":
        return f"{v:.3g}%"
    a = abs(v)
    if a >= 1000:
        s = f"{v:,.0f}"
    elif a >= 100 or float(v).is_integer():
        s = f"{v:.0f}" if float(v).is_integer() or a >= 100 else f"{v:.3g}"
    elif a >= 0.001 or v == 0:
        s = f"{v:.3g}"
    else:
        s = f"{v:.2e}"
    return f"{s} {unit}".strip() if unit and unit != "x" else (f"{s}x" if unit == "x" else s)


def change(a: float, b: float, scale: str) -> str:
    """How ``b`` differs from ``a``: relative for amounts (+38%, x2.4), points for shares."""
    if scale in ("share", "pct"):
        pts = (b - a) * (100 if scale == "share" else 1)
        return f"{pts:+.3g} pts"
    if a == 0 or not math.isfinite(a) or not math.isfinite(b):
        return f"{b - a:+.3g}"
    if scale == "signed" and (a < 0) != (b < 0):
        return f"{b - a:+.3g}"
    r = b / a
    if r >= 2 or (0 < r <= 0.5):
        return f"x{r:.3g}"
    return f"{100 * (r - 1):+.3g}%"


def size(a: float | None, b: float | None, scale: str) -> float:
    """How big a change is, on one scale for the ranking: the relative difference
    ``|b - a| / max(|a|, |b|)`` (0..1) for amounts; for shares the difference itself (a change of x
    percentage points ranks like a relative change of x %)."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return 0.0
    if scale == "share":
        return min(1.0, abs(b - a))
    if scale == "pct":
        return min(1.0, abs(b - a) / 100)
    den = max(abs(a), abs(b))
    return 0.0 if den == 0 else min(1.0, abs(b - a) / den)


def p_text(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return ""
    return f"p={p:.2g}" if p >= 1e-4 else "p<1e-4"


def steps_text(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps)
