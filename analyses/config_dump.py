"""The whole config a verl console log prints at start, as flat ``key = value`` pairs.

verl's trainer prints its resolved config as a pretty-printed Python dict before the first step
(``{'actor_rollout_ref': {'actor': {'clip_ratio': 0.2, ...``), each line behind the Ray actor's
prefix (``(main_task pid=54569)``, ``(TaskRunner pid=38606)``, with ANSI colours). Older logs also
carry the launch command (``command:`` / ``python3 -m verl.trainer.main_ppo data.train_batch_size=512
...``), whose Hydra overrides are the only config a log has when it prints no dump.

:func:`config_entries` returns ``(key, value, source)`` rows: ``key`` dotted
(``data.max_response_length``), ``value`` the JSON text of the value (``512``, ``"vllm"``, ``null``,
``["model", "optimizer"]``), ``source`` ``config_dump`` or ``command_line``. The dump is *parsed*,
never evaluated: a small recursive-descent reader of the literal syntax pprint writes (dicts, lists,
tuples, strings with implicit concatenation, numbers, ``True``/``False``/``None``); anything else
(an object repr such as ``<class ...>``) is kept as its text. A dump that cannot be read gives no
rows, never an error. :func:`analyses.run_facts.config_dump_facts` reads the cap, GPUs and model
from the same text with its own narrower rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# a Ray actor's prefix on every line it prints: "(main_task pid=54569) ", "(TaskRunner pid=1, ip=...) "
_PREFIX = re.compile(r"^(\([^()]*pid=\d+[^()]*\)\s?)")
# another actor's output written into the middle of a dump line (no newline between them):
# gemma-2-2b's log has "'experiment_name': 'gemma2b_function_rm',(WorkerDict pid=65860) Flash ..."
_INLINE_PREFIX = re.compile(r"\([^()]*pid=\d+[^()]*\)")
# a Hydra override on a command line: dotted key (at least one dot) = value
_OVERRIDE = re.compile(r"(?:^|\s)['\"]?\+{0,2}([A-Za-z_][\w-]*(?:\.[\w-]+)+)=(\S+)")
_COMMAND_HINT = re.compile(r"(^command:|main_ppo|main_dapo|main_grpo|verl\.trainer|run_\w+\.sh)")
MAX_DEPTH = 64  # nesting deeper than any config: a corrupt dump, not a config
MAX_DUMP_CHARS = 2 * 1024 * 1024
MAX_VALUE_CHARS = 2000  # a value longer than this (a chat template) is cut, with a marker

SOURCES = ("config_dump", "command_line")


class _Unreadable(Exception):
    pass


def find_dump(text: str) -> str | None:
    """The dict literal the log's first ``{'`` line opens, prefixes removed, or None.

    The dump's lines are those that follow under the same Ray prefix while they are indented
    continuations (pprint indents every line after the first) and its brackets are open; lines of
    other actors interleaved with it are passed over, and another actor's output glued to the end of
    a dump line is cut off. Brackets such a glued line swallowed are closed by :func:`parse_dump`.
    """
    lines = _ANSI.sub("", text).splitlines()
    for i, line in enumerate(lines):
        m = _PREFIX.match(line)
        prefix = m.group(1) if m else ""
        if not line[len(prefix):].startswith("{'"):
            continue
        parts, depth, size = [], 0, 0
        for nxt in lines[i:]:
            if prefix and not nxt.startswith(prefix):
                continue
            body = nxt[len(prefix):] if prefix else nxt
            if parts and not body[:1].isspace():  # a new statement: the dump ended (a cut one, if still open)
                break
            cut = _INLINE_PREFIX.search(body)
            if cut:
                body = body[:cut.start()]
            parts.append(body)
            size += len(body)
            depth += _bracket_delta(body)
            if depth <= 0 or size > MAX_DUMP_CHARS:
                break
        return "\n".join(parts)
    return None


def _bracket_delta(s: str) -> int:
    """Opening minus closing brackets of ``s`` outside string literals."""
    delta, quote, esc = 0, "", False
    for ch in s:
        if quote:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            delta += 1
        elif ch in "}])":
            delta -= 1
    return delta


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<num>[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan)(?![\w.]))
  | (?P<name>True|False|None)(?!\w)
  | (?P<punct>[{}\[\](),:])
  | (?P<other>[^\s{}\[\](),:'"]+)
)""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "0": "\0"}


def _unquote(tok: str) -> str:
    body, out, i = tok[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            width = {"x": 2, "u": 4, "U": 8}.get(nxt)
            code = body[i + 2:i + 2 + width] if width else ""
            if width and len(code) == width and all(c in "0123456789abcdefABCDEF" for c in code):
                out.append(chr(int(code, 16)) if int(code, 16) < 0x110000 else "\ufffd")
                i += 2 + width
                continue
        out.append(ch)
        i += 1
    return "".join(out)


class _Parser:
    """Recursive descent over the literal's tokens. Lenient where a glued line cut the dump: a
    dict ends where a key starts left of its keys' column (pprint aligns a dict's keys one column
    right of its ``{``), and the end of the text closes whatever is still open."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[tuple[str, str]] = []
        self.cols: list[int] = []
        self.spans: list[tuple[int, int]] = []
        for m in _TOKEN.finditer(text):
            if not m.lastgroup:
                continue
            start = m.start(m.lastgroup)
            self.toks.append((m.lastgroup, m.group(m.lastgroup)))
            self.cols.append(start - (text.rfind("\n", 0, start) + 1))
            self.spans.append((start, m.end(m.lastgroup)))
        self.i = 0
        self.cut = False  # the last container ended without its bracket (its comma went with it)

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        t = self.peek()
        if t is None:
            raise _Unreadable("unexpected end")
        self.i += 1
        return t

    def _closes(self, close: str) -> bool:
        """The container ends here: its closing bracket, or the end of the (cut) text."""
        t = self.peek()
        if t is None:
            return True
        if t == ("punct", close):
            self.i += 1
            return True
        return False

    def expect(self, p: str) -> None:
        kind, v = self.take()
        if (kind, v) != ("punct", p):
            raise _Unreadable(f"expected {p!r}, found {v!r}")

    def value(self, depth: int = 0) -> object:
        if depth > MAX_DEPTH:
            raise _Unreadable("nested too deeply")
        kind, v = self.take()
        if kind == "str":
            s = _unquote(v)
            while (t := self.peek()) is not None and t[0] == "str":  # implicit concatenation
                s += _unquote(self.take()[1])
            return s
        if kind == "num":
            return _number(v)
        if kind == "name":
            return {"True": True, "False": False, "None": None}[v]
        if kind == "other":  # an object repr or a call: kept as its text up to the next delimiter
            first = self.i - 1
            while (t := self.peek()) is not None and t[0] in ("other", "num", "name", "str"):
                self.take()
            if (t := self.peek()) is not None and t == ("punct", "("):
                self._raw_group(depth)
            return self.text[self.spans[first][0]:self.spans[self.i - 1][1]]
        if v == "{":
            out: dict[str, object] = {}
            key_col = self.cols[self.i] if self.i < len(self.toks) else 0
            while not self._closes("}"):
                if self.cols[self.i] < key_col:  # a key of an enclosing dict: this one's "}" was lost
                    self.cut = True
                    return out
                key = self.value(depth + 1)
                self.expect(":")
                self.cut = False
                out[str(key)] = self.value(depth + 1)
                if self.peek() == ("punct", ","):
                    self.take()
                elif self.peek() not in (("punct", "}"), None) and self.cols[self.i] >= key_col and not self.cut:
                    raise _Unreadable("expected ',' or '}'")
            self.cut = False
            return out
        if v in "[(":
            close = "]" if v == "[" else ")"
            items = []
            while not self._closes(close):
                items.append(self.value(depth + 1))
                if self.peek() == ("punct", ","):
                    self.take()
                elif self.peek() not in (("punct", close), None):
                    raise _Unreadable(f"expected ',' or {close!r}")
            # pprint wraps a long string as ('part' 'part'): one string, not a tuple
            return items[0] if v == "(" and len(items) == 1 and isinstance(items[0], str) else items
        raise _Unreadable(f"unexpected {v!r}")

    def _raw_group(self, depth: int) -> None:
        """Skip ``( ... )`` after an object name (``np.float64(0.3)``: kept as text by the caller)."""
        level = 0
        while True:
            kind, v = self.take()
            if (kind, v) == ("punct", "("):
                level += 1
            elif (kind, v) == ("punct", ")"):
                level -= 1
                if level == 0:
                    return
            if level > MAX_DEPTH:
                raise _Unreadable("nested too deeply")


def _number(v: str) -> int | float | str:
    s = v.replace("_", "")
    try:
        return int(s)
    except ValueError:
        pass
    try:
        f = float(s)
    except ValueError:
        return v
    return f if f == f and f not in (float("inf"), float("-inf")) else v


def parse_dump(dump: str) -> dict[str, object] | None:
    """The dict of a dump's text, or None when it is not a readable dict literal."""
    try:
        p = _Parser(dump)
        out = p.value()
    except (_Unreadable, RecursionError):
        return None
    return out if isinstance(out, dict) else None


def flatten(d: dict[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    """``(dotted key, leaf value)`` of a nested dict; lists are leaves."""
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from flatten(v, key + ".")
        else:
            yield key, v


def value_text(v: object) -> str:
    """A value as canonical JSON text (so ``1e-06`` in a dump and ``1e-6`` on a command line agree)."""
    s = json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)
    return s if len(s) <= MAX_VALUE_CHARS else s[: MAX_VALUE_CHARS - 1] + "…"


def _override_value(raw: str) -> object:
    s = raw.strip("'\"")
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    n = _number(s)
    return n if not isinstance(n, str) else s


def command_line_overrides(text: str) -> dict[str, object]:
    """Hydra overrides on the launch command lines of a log head (a later one wins)."""
    out: dict[str, object] = {}
    for line in _ANSI.sub("", text).splitlines():
        if not _COMMAND_HINT.search(line):
            continue
        for m in _OVERRIDE.finditer(line):
            out[m.group(1)] = _override_value(m.group(2))
    return out


def config_entries(text: str) -> list[tuple[str, str, str]]:
    """``(key, value JSON, source)`` of the config the log head ``text`` states: its dump when it
    prints one (the resolved config, overrides included), else its command-line overrides."""
    dump = find_dump(text)
    parsed = parse_dump(dump) if dump else None
    if parsed:
        return [(k, value_text(v), "config_dump") for k, v in flatten(parsed)]
    return [(k, value_text(v), "command_line") for k, v in command_line_overrides(text).items()]
