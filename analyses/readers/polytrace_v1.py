"""PolyTrace v1 workload files: one JSON document keyed by step, lengths only.

Three layouts (PolyTrace README and its replay reader):

* flat: ``{"<step>": {"input": [prompt lens], "output": [response lens]}}``. When ``output`` has
  n entries per ``input`` (verl repeats each prompt n times, consecutively) sample i belongs to
  prompt i // n; when the lists are equally long they pair one to one; any other ratio (the
  README warns inputs and outputs may not correspond) leaves prompt_tokens and group_id null.
* grouped: ``{"<step>": {"input": [...], "output_groups": [[...], ...]}}`` — one list of
  response lengths per prompt.
* multi-turn: ``{"<step>": [{"input": [per-turn prompt lens], "output": [per-turn completion
  lens]}, ...]}`` — one trajectory per element: a ``samples`` row (prompt = first turn's
  input, response_tokens = generated_tokens = the sum of its completions, n_turns) and one
  ``turns`` row per turn. Tool calls and tool-output tokens are not recorded in v1, so
  n_tool_calls and truncated stay null there.

The file is one document, so a *record* is one step entry: ``source_files.lines`` counts step
entries and a malformed entry (bad step key, wrong types, negative or over-limit lengths,
mismatched per-turn lists) is rejected whole, with its reason; so is a repeated step key (the
first entry wins; ``json.loads`` would silently keep only the last). Lists become columns through
Polars' strict constructors; the only Python loop is over steps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from analyses.readers import limits
from analyses.readers.base import Chunk, FileContext, ReaderBase, UnreadableFile, rejects_frame
from analyses.readers.json_scan import ScanState, structure

RECORDED = "recorded"
_HEAD = re.compile(r'\A\s*\{\s*"\d+"\s*:\s*[\[{]')
_TRAJ = {"input": pl.List(pl.Int64), "output": pl.List(pl.Int64)}


class BadStep(ValueError):
    """A step entry that cannot be used; its message is the reject reason."""


def _ints(value: object, what: str) -> pl.Series:
    if not isinstance(value, list):
        raise BadStep(f"{what} is not a list")
    try:
        s = pl.Series(what, value, dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError) as exc:
        raise BadStep(f"non-integer value in {what}") from exc
    if s.null_count():
        raise BadStep(f"null value in {what}")
    if s.len() and s.min() < 0:
        raise BadStep(f"negative value in {what}")
    return s


def _check_limit(lengths: pl.Series, limit: int | None, what: str) -> None:
    if limit is not None and lengths.len() and lengths.max() > limit:
        raise BadStep(f"{what} {lengths.max()} exceeds max_response_length {limit}")


def _flat(step: int, entry: dict, limit: int | None) -> dict[str, pl.DataFrame]:
    inputs = _ints(entry.get("input"), "input")
    if "output_groups" in entry:
        groups = entry["output_groups"]
        if not isinstance(groups, list):
            raise BadStep("output_groups is not a list")
        try:
            g = pl.Series("output", groups, dtype=pl.List(pl.Int64), strict=True)
        except (TypeError, OverflowError, pl.exceptions.PolarsError) as exc:
            raise BadStep("output_groups is not a list of integer lists") from exc
        if g.null_count() or g.list.eval(pl.element().is_null().any()).list.first().any():
            raise BadStep("null value in output_groups")
        df = pl.DataFrame({"output": g}).with_row_index("g").with_columns(k=pl.int_ranges(pl.col("output").list.len()))
        df = df.explode("output", "k").drop_nulls("output")
        _check_limit(df["output"], limit, "response length")
        prompt = pl.lit(inputs).gather(pl.col("g")) if inputs.len() == g.len() else pl.lit(None, dtype=pl.Int64)
        samples = df.select(
            sample_id=pl.format("{}-{}", "g", "k"), group_id=pl.col("g").cast(pl.String),
            prompt_tokens=prompt, response_tokens="output",
        )
    else:
        if "output" not in entry:
            raise BadStep("missing output (or output_groups)")
        out = _ints(entry["output"], "output")
        _check_limit(out, limit, "response length")
        n_in, n_out = inputs.len(), out.len()
        i = pl.int_range(n_out, dtype=pl.Int64)
        if n_in and n_out % n_in == 0:
            per = n_out // n_in
            prompt = pl.lit(inputs).gather(i // per)
            group = (i // per).cast(pl.String)
        else:
            prompt, group = pl.lit(None, dtype=pl.Int64), pl.lit(None, dtype=pl.String)
        samples = pl.DataFrame({"response_tokens": out}).select(
            sample_id=i.cast(pl.String), group_id=group, prompt_tokens=prompt, response_tokens="response_tokens",
        )
    lim = pl.lit(limit, dtype=pl.Int64)
    samples = samples.with_columns(
        step=pl.lit(step, dtype=pl.Int64),
        truncated=pl.when(lim.is_null()).then(None).otherwise(pl.col("response_tokens") >= lim),
    )
    return {"samples": samples}


def _multiturn(step: int, entry: list) -> dict[str, pl.DataFrame]:
    try:
        traj = pl.DataFrame(entry, schema=_TRAJ, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError) as exc:
        raise BadStep("trajectories are not objects of integer lists input/output") from exc
    if traj.height and traj.select(pl.any_horizontal(pl.all().is_null()).any()).item():
        raise BadStep("a trajectory lacks input or output (or has the wrong type)")
    flat = traj.select(pl.concat_list("input", "output").alias("v")).explode("v")["v"]
    if flat.null_count():
        raise BadStep("null value in a trajectory")
    if flat.len() and flat.min() < 0:
        raise BadStep("negative value in a trajectory")
    if (traj["input"].list.len() != traj["output"].list.len()).any():
        raise BadStep("a trajectory has different numbers of input and output turns")
    traj = traj.with_row_index("i").with_columns(sample_id=pl.col("i").cast(pl.String), step=pl.lit(step, dtype=pl.Int64))
    samples = traj.select(
        "step", "sample_id",
        prompt_tokens=pl.col("input").list.first(),
        response_tokens=pl.col("output").list.sum().cast(pl.Int64),
        generated_tokens=pl.col("output").list.sum().cast(pl.Int64),
        n_turns=pl.col("output").list.len().cast(pl.Int64),
    )
    turns = (
        traj.select("step", "sample_id", "input", "output", turn=pl.int_ranges(pl.col("output").list.len()))
        .explode("input", "output", "turn")
        .drop_nulls("turn")
        .select("step", "sample_id", "turn", prompt_tokens="input", completion_tokens="output")
    )
    return {"samples": samples, "turns": turns}


class PolyTraceV1Reader(ReaderBase):
    name = "polytrace_v1"

    def sniff(self, head: str, path: Path) -> bool:
        return bool(_HEAD.match(head)) and '"input"' in head and ('"output"' in head or '"output_groups"' in head)

    def read(self, ctx: FileContext) -> Iterator[Chunk]:
        size, cap = ctx.path.stat().st_size, limits.current().max_document_bytes
        if size > cap:
            raise UnreadableFile(f"JSON document of {size} bytes, over the {cap}-byte document limit")
        try:
            text = ctx.path.read_text(encoding="utf-8")
        except ValueError as exc:  # UnicodeDecodeError
            raise UnreadableFile(f"not a JSON document: {exc}") from exc
        limit = ctx.manifest.max_response_length
        parts: dict[str, list[pl.DataFrame]] = {"samples": [], "turns": []}
        bad: list[tuple[int, str, str]] = []
        seen: set[str] = set()
        n_items = 0
        try:
            for ordinal, (key, entry) in enumerate(_top_level_items(text), start=1):  # one per step
                n_items = ordinal
                self._entry(ordinal, key, entry, limit, seen, parts, bad)
        except ValueError as exc:  # JSONDecodeError
            raise UnreadableFile(f"not a JSON document: {exc}") from exc
        except _NotAnObject as exc:
            raise UnreadableFile("top level is not an object keyed by step") from exc
        tables = {t: pl.concat(v, how="diagonal_relaxed") for t, v in parts.items() if v}
        if "samples" in tables:
            tables["samples"] = tables["samples"].with_columns(
                task=pl.lit(ctx.manifest.task, dtype=pl.String), token_source=pl.lit(RECORDED),
            )
        if "turns" in tables:
            tables["turns"] = tables["turns"].drop("line_no")
        rejects = rejects_frame([b[0] for b in bad], [b[1] for b in bad], [b[2] for b in bad])
        yield Chunk(tables=tables, rejects=rejects, lines=n_items, rows_ok=n_items - len(bad),
                    rows_rejected=len(bad), rows_skipped=0)

    @staticmethod
    def _entry(ordinal: int, key: str, entry: object, limit: int | None, seen: set[str],
               parts: dict[str, list[pl.DataFrame]], bad: list[tuple[int, str, str]]) -> None:
        """One step entry into ``parts``, or its reason into ``bad``."""
        try:
            if isinstance(entry, _TooDeep):
                raise BadStep(str(entry))
            if key in seen:
                raise BadStep(f"duplicate step key {key!r}: the first entry for it is kept")
            seen.add(key)
            if not re.fullmatch(r"\d+", key):
                raise BadStep(f"step key {key!r} is not a non-negative integer")
            if int(key) >= 2**63:
                raise BadStep(f"step key {key[:40]!r} is out of range")
            if isinstance(entry, dict):
                frames = _flat(int(key), entry, limit)
            elif isinstance(entry, list):
                frames = _multiturn(int(key), entry)
            else:
                raise BadStep("step entry is neither an object nor a list of trajectories")
        except BadStep as exc:
            raw = entry.raw if isinstance(entry, _TooDeep) else json.dumps({key: entry})
            bad.append((ordinal, str(exc), raw))
            return
        for table, df in frames.items():
            parts[table].append(df.with_columns(line_no=pl.lit(ordinal, dtype=pl.Int64)))


class _NotAnObject(Exception):
    """The document's top level is valid JSON but no object."""


class _TooDeep:
    """A step entry nested past Python's JSON recursion limit (its value was skipped)."""

    def __init__(self, raw: str) -> None:
        self.raw = raw

    def __str__(self) -> str:
        return "step entry nested too deep to decode"


_WS = re.compile(r"[ \t\n\r]*")


def _top_level_items(text: str) -> Iterator[tuple[str, object]]:
    """``(key, value)`` of the document's top-level object in order, one at a time, duplicate
    keys kept (where ``json.loads`` would silently keep only the last). Each value is decoded by
    ``json``'s own scanner; raises ValueError on malformed JSON, :class:`_NotAnObject` when the
    top level is valid JSON but no object. A value nested past Python's recursion limit comes
    as a :class:`_TooDeep` (skipped by its structure) so that it is rejected on its own."""
    dec = json.JSONDecoder()
    ws = lambda at: _WS.match(text, at).end()  # noqa: E731
    i = ws(0)
    if text[i : i + 1] != "{":
        try:
            dec.raw_decode(text, i)  # malformed JSON raises here; a valid non-object below
        except RecursionError as exc:
            raise json.JSONDecodeError("nested too deep", text, i) from exc
        raise _NotAnObject()
    i = ws(i + 1)
    if text[i : i + 1] == "}":
        i += 1
    else:
        while True:
            if text[i : i + 1] != '"':
                raise json.JSONDecodeError("expected a step key", text, i)
            key, i = json.decoder.scanstring(text, i + 1)
            i = ws(i)
            if text[i : i + 1] != ":":
                raise json.JSONDecodeError("expected ':'", text, i)
            start = ws(i + 1)
            try:
                value, i = dec.raw_decode(text, start)
            except RecursionError:
                i = _value_end(text, start)
                value = _TooDeep(text[start : min(i, start + 500)])
            yield key, value
            i = ws(i)
            sep, i = text[i : i + 1], i + 1
            if sep == "}":
                break
            if sep != ",":
                raise json.JSONDecodeError("expected ',' or '}'", text, i - 1)
            i = ws(i)
    if text[ws(i) :]:
        raise json.JSONDecodeError("extra data after the document", text, ws(i))


def _value_end(text: str, start: int, window: int = 1 << 16) -> int:
    """End (exclusive, in characters) of the JSON container starting at ``text[start]``, found by
    its bracket structure, scanned window by window (so each skipped value costs its own length);
    raises ValueError when it never closes."""
    import numpy as np

    state, at = ScanState(), start
    while at < len(text):
        data = text[at : at + window].encode("utf-8")
        st = structure(np.frombuffer(data, dtype=np.uint8), state)
        closes = st.brackets[st.depth == 0]
        if closes.size:
            return at + len(data[: int(closes[0]) + 1].decode("utf-8"))
        state, at = st.end, at + window
    raise json.JSONDecodeError("unterminated value", text, start)
