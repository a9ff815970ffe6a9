"""Vectorized JSON structure (simdjson's stage 1, in numpy): which bytes are inside strings, where
the brackets are and how deep. Used to split a Kineto trace into events while streaming, to cut a
PolyTrace v1 document into its step entries, and to find JSON records nested too deep for the
parsers (DuckDB's JSON functions stop at 128 levels, Python's ``json`` at ~1000 with a
RecursionError) so they are rejected on their own instead of failing their file.

No Python loop per byte or per bracket: a few byte-wide numpy passes; depth is kept only at the
brackets (sparse).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from analyses.readers import limits

if TYPE_CHECKING:  # numpy is imported where it is used: sniffing and the fast paths never need it
    import numpy as np

_Q, _BS, _LB, _RB = 34, 92, 123, 125

REASON_TOO_DEEP = "json_too_deep: nested deeper than {} levels"
REASON_TOO_MANY = "json_too_large: more than {} values in one record"
REASON_TOO_WIDE = "json_too_large: {} values in a record of {} bytes (over {} MiB flattened)"
# DuckDB's json_each carries the whole record along with each of its values: a 238 KB trainer-state
# entry of 8,208 keys took 1.9 GB. values x bytes bounds what flattening a record may hold.
FLATTEN_BUDGET_BYTES = 256 << 20


@dataclass(frozen=True)
class ScanState:
    """Where a scan stopped: inside a string, after an odd run of backslashes (the next byte is
    escaped; counted outside strings too, as the whole-buffer scan does), at this bracket depth. A stream scanned block by block with the state carried over
    gives the structure of the whole, each byte scanned once."""

    in_string: bool = False
    escape: bool = False
    depth: int = 0


@dataclass
class Structure:
    """Structural characters of a buffer."""

    outside: np.ndarray  # bool per byte: not inside a string literal (quotes themselves: False)
    brackets: np.ndarray  # positions of {}[] outside strings
    depth: np.ndarray  # bracket depth after each of those
    end: ScanState  # the state after the last byte

    def depth_before(self, pos: np.ndarray, start_depth: int = 0) -> np.ndarray:
        """Bracket depth in effect at each position (after the last bracket before it)."""
        import numpy as np

        if not self.brackets.size:
            return np.full(np.shape(pos), start_depth, dtype=np.int64)
        i = np.searchsorted(self.brackets, pos) - 1
        return np.where(i >= 0, self.depth[np.maximum(i, 0)], start_depth)


def structure(buf: np.ndarray, state: ScanState = ScanState()) -> Structure:
    """The structure of ``buf`` (uint8) scanned from ``state``."""
    import numpy as np

    quote = buf == _Q
    if state.escape and buf.size:
        quote[0] = False  # escaped by the backslash run that ended the previous block
    qpos = np.flatnonzero(quote)
    if qpos.size:
        # a quote preceded by an odd run of backslashes is escaped (sparse: only such quotes)
        cand = qpos[qpos > 0]
        cand = cand[buf[cand - 1] == _BS]
        if cand.size:
            bpos = np.flatnonzero(buf == _BS)
            brk = np.flatnonzero(np.diff(bpos) != 1)
            run_start = bpos[np.concatenate(([0], brk + 1))]
            run_end = bpos[np.concatenate((brk, [bpos.size - 1]))]
            i = np.searchsorted(run_end, cand - 1)
            run_len = (cand - 1) - run_start[i] + 1
            # a run starting the buffer continues the previous block's escape state
            run_len = run_len + ((run_start[i] == 0) & state.escape)
            quote[cand[run_len % 2 == 1]] = False
    parity = np.bitwise_xor.accumulate(quote.view(np.uint8)) if buf.size else np.zeros(0, np.uint8)
    if state.in_string:
        parity = parity ^ 1
    outside = (parity == 0) & ~quote
    # {=123 [=91 open, }=125 ]=93 close: (b | 0x20) maps [ ] to { } in one pass
    folded = buf | 0x20
    brackets = np.flatnonzero(((folded == _LB) | (folded == _RB)) & outside)
    steps = np.where(folded[brackets] == _LB, 1, -1).astype(np.int64)
    depth = np.cumsum(steps) + state.depth
    in_string = bool(parity[-1]) if buf.size else state.in_string
    escape = state.escape and not buf.size
    if buf.size and buf[-1] == _BS:
        nonbs = np.flatnonzero(buf != _BS)
        run = buf.size - (int(nonbs[-1]) + 1 if nonbs.size else 0)
        escape = (run + (state.escape if nonbs.size == 0 else 0)) % 2 == 1
    end = ScanState(in_string, escape, int(depth[-1]) if depth.size else state.depth)
    return Structure(outside, brackets, depth, end)


def max_depth(data: bytes) -> int:
    """Deepest bracket nesting of one JSON text (strings excluded)."""
    import numpy as np

    st = structure(np.frombuffer(data, dtype=np.uint8))
    return int(st.depth.max()) if st.depth.size else 0


def document_shape(data: bytes) -> tuple[int, int]:
    """(deepest nesting, values) of one JSON text, values counted as the separators outside
    strings plus one: what a parser will hold, known before any parser sees the text."""
    import numpy as np

    buf = np.frombuffer(data, dtype=np.uint8)
    st = structure(buf)
    commas = int(np.count_nonzero((buf == 44) & st.outside))
    return (int(st.depth.max()) if st.depth.size else 0), commas + 1


def too_complex(lines: pl.DataFrame, depth_limit: int, values_limit: int, col: str = "line") -> pl.Series:
    """Per row of ``lines``: the reason its JSON text must not be parsed (nested deeper than
    ``depth_limit``, or more than ``values_limit`` values: commas outside strings + 1), else null.

    Cheap upper bounds first (the count of ``{`` and ``[``, of commas, strings included); only
    the rare lines over them are scanned exactly."""
    import numpy as np

    text = lines.get_column(col)
    opens = text.str.count_matches(r"[\[{]").fill_null(0).to_numpy()
    commas = text.str.count_matches(",", literal=True).fill_null(0).to_numpy()
    size = text.str.len_bytes().fill_null(0).to_numpy().astype(np.int64)
    out: list[str | None] = [None] * lines.height
    suspects = np.flatnonzero((opens > depth_limit) | (commas >= values_limit) | ((commas + 1) * size > FLATTEN_BUDGET_BYTES))
    if suspects.size:
        for i, t in zip(suspects, text.gather(suspects).to_list(), strict=True):
            buf = np.frombuffer(t.encode("utf-8"), dtype=np.uint8)
            st = structure(buf)
            values = int(np.count_nonzero((buf == 44) & st.outside)) + 1
            if st.depth.size and int(st.depth.max()) > depth_limit:
                out[i] = REASON_TOO_DEEP.format(depth_limit)
            elif values > values_limit:
                out[i] = REASON_TOO_MANY.format(values_limit)
            elif values * buf.size > FLATTEN_BUDGET_BYTES:
                out[i] = REASON_TOO_WIDE.format(values, buf.size, FLATTEN_BUDGET_BYTES >> 20)
    return pl.Series("reason", out, dtype=pl.String)


def too_deep(lines: pl.DataFrame, limit: int, col: str = "line") -> pl.Series:
    """Per row of ``lines``: True when its JSON text nests deeper than ``limit``."""
    return (too_complex(lines, limit, 1 << 62, col) == REASON_TOO_DEEP.format(limit)).fill_null(False)


def split_too_deep(lines: pl.DataFrame, limit: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``lines`` (``line_no, line``) split into those the JSON functions may parse and the others
    (``line_no, reason, line``): nested deeper than ``limit``, or more values than
    ``limits.max_json_values`` (a parser's memory grows with both)."""
    reason = too_complex(lines, limit, limits.current().max_json_values)
    if reason.null_count() == lines.height:
        return lines, pl.DataFrame(schema={"line_no": pl.Int64, "reason": pl.String, "line": pl.String})
    flagged = lines.with_columns(reason=reason)
    bad = flagged.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "line")
    return flagged.filter(pl.col("reason").is_null()).drop("reason"), bad
