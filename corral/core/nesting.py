"""How deep a JSON or TOML text nests, found before any parser sees it.

``json`` and ``tomllib`` recurse once per level: a body 1,000 levels deep (2 KB)
raised RecursionError from inside them, which callers took for a crash (a 500, a
traceback). The depth is bounded here first, by a scan that counts brackets
outside strings (and, for TOML, comments), in C loops only: strings are cut out
by one regex, the brackets kept by another, and the running depth is
``itertools.accumulate``. A text with no more opening brackets than the limit is
not scanned at all.
"""

from __future__ import annotations

import itertools
import re

#: A JSON string, escapes included (the unrolled form: no backtracking per char).
_JSON_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_JSON_OTHER = re.compile(rb"[^\[\]{}]+")
#: TOML strings (multi-line and one-line, basic and literal) and comments.
_TOML_SKIPPED = re.compile(
    r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|\'[^\'\n]*\'|#[^\n]*'
)
_TOML_OTHER = re.compile(r"[^\[\]{}]+")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class TooDeep(ValueError):
    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"nested {depth} levels deep (at most {limit})")
        self.depth = depth
        self.limit = limit


def check_json(text: str | bytes, limit: int) -> None:
    """TooDeep when the arrays and objects of ``text`` nest deeper than ``limit``."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return  # it cannot nest deeper than it has brackets
    _check(_JSON_OTHER.sub(b"", _JSON_STRINGS.sub(b"", data)), limit)


def check_toml(text: str, limit: int) -> None:
    """TooDeep when the arrays and inline tables of ``text`` nest deeper than
    ``limit`` (a table header's brackets are a level or two, closed on its line)."""
    if text.count("[") + text.count("{") <= limit:
        return
    _check(_TOML_OTHER.sub("", _TOML_SKIPPED.sub("", text)).encode(), limit)


def _check(brackets: bytes, limit: int) -> None:
    depth = max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)
    if depth > limit:
        raise TooDeep(depth, limit)
