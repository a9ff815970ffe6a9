"""What is compared: two runs, or two step ranges (``run:1-100``), and the steps both have."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SIDE = re.compile(r"^(?P<run>[^:]+)(?::(?P<first>\d+)?-(?P<last>\d+)?)?$")


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a run, optionally only steps ``first..last`` (both included)."""

    run_id: str
    first: int | None = None
    last: int | None = None

    @property
    def label(self) -> str:
        if self.first is None and self.last is None:
            return self.run_id
        return f"{self.run_id}:{'' if self.first is None else self.first}-{'' if self.last is None else self.last}"

    @property
    def ranged(self) -> bool:
        return self.first is not None or self.last is not None

    def holds(self, step: int) -> bool:
        return (self.first is None or step >= self.first) and (self.last is None or step <= self.last)


def parse_side(text: str) -> Side:
    """``RUN``, ``RUN:FIRST-LAST``, ``RUN:FIRST-`` or ``RUN:-LAST`` (run ids never hold ``:``)."""
    m = _SIDE.match(text.strip())
    if not m or (m.group("first") is None and m.group("last") is None and ":" in text):
        raise ValueError(f"{text!r} is not RUN or RUN:FIRST-LAST (e.g. my-run:1-100)")
    first = int(m.group("first")) if m.group("first") is not None else None
    last = int(m.group("last")) if m.group("last") is not None else None
    if first is not None and last is not None and first > last:
        raise ValueError(f"{text!r}: the range's first step is after its last")
    return Side(m.group("run"), first, last)


@dataclass(frozen=True)
class Alignment:
    """The steps each side is compared on, and how they were chosen."""

    steps_a: tuple[int, ...]
    steps_b: tuple[int, ...]
    paired: bool  # both sides are compared on the same step numbers (per-step differences make sense)
    note: str


def _span(steps: tuple[int, ...] | list[int]) -> str:
    return f"{min(steps)}-{max(steps)}" if steps else "none"


def align(a: Side, b: Side, have_a: list[int], have_b: list[int]) -> Alignment:
    """The steps compared. Two step ranges of one run: each side's own range. Two runs: the steps
    both have (within their ranges); when they share none, every step of each, said so."""
    sa = tuple(sorted(s for s in set(have_a) if a.holds(s)))
    sb = tuple(sorted(s for s in set(have_b) if b.holds(s)))
    if a.run_id == b.run_id:
        overlap = set(sa) & set(sb)
        note = (f"two step ranges of run {a.run_id}: steps {_span(sa)} ({len(sa)}) against {_span(sb)} ({len(sb)})"
                + (f"; {len(overlap)} step(s) in both ranges" if overlap else ""))
        return Alignment(sa, sb, False, note)
    common = tuple(sorted(set(sa) & set(sb)))
    if common:
        left = (len(sa) - len(common), len(sb) - len(common))
        extra = "" if left == (0, 0) else f" (left out: {left[0]} step(s) only in A, {left[1]} only in B)"
        return Alignment(common, common, True, f"the {len(common)} step(s) both runs have, {_span(common)}{extra}")
    if not sa and not sb:
        return Alignment(sa, sb, False, "neither run has training steps: run-level quantities only")
    return Alignment(sa, sb, False, f"no step in common (A: {_span(sa)}, B: {_span(sb)}): every step of each run")
