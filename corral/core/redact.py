"""Redaction of sensitive values before anything is persisted or shown.

One place decides what a secret looks like, so the ledger, the event stream, logs,
receipts and reports all apply the same rules.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.core import secret_rules
from corral.core.secret_rules import Anchor, Rule

REDACTED = "[redacted]"
#: Shorter values are not treated as secrets, and every pattern matches more.
MIN_SECRET_CHARS = 6

# Names of environment variables whose values are secrets wherever they appear.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)



@dataclass(frozen=True)
class _Family:
    """Rules that share their gate (the keyword plugin's dozen regexes do)."""

    gate: frozenset[str] | None
    rules: tuple[Rule, ...]


def _families(rules: list[Rule]) -> tuple[_Family, ...]:
    """Rules grouped by gate, each needle replaced by a shorter one inside it that
    another gate looks for anyway (``begin rsa private key`` -> ``private``): a
    gate may open a little more often, but each text is searched for fewer needles
    (a text's search for needles was half of redaction's time)."""
    needles = {needle for rule in rules for needle in rule.gate or ()}

    def shared(needle: str) -> str:
        inside = [other for other in needles if len(other) >= 3 and other != needle and other in needle]
        return min(inside, key=len) if inside else needle

    grouped: dict[frozenset[str] | None, list[Rule]] = {}
    for rule in rules:
        gate = None if rule.gate is None else frozenset(shared(needle) for needle in rule.gate)
        grouped.setdefault(gate, []).append(rule)
    return tuple(_Family(gate, tuple(members)) for gate, members in grouped.items())


@dataclass(frozen=True)
class _Plan:
    families: tuple[_Family, ...]
    #: Every gate's needles once: most texts hold few, and then few regexes run at all.
    needles: tuple[str, ...]


def _plan_of(rules: list[Rule]) -> _Plan:
    families = _families(rules)
    return _Plan(families, tuple(sorted({needle for family in families for needle in family.gate or ()})))


#: This process's pattern set, once it is built (``_plan``) or handed over (``adopt``).
_built: _Plan | None = None


def _plan() -> _Plan:
    """Built on first use, once per process: importing detect-secrets and reading its
    patterns costs ~0.15 s, which a CLI command that never redacts should not pay.
    A fork server gets the set from the supervisor that started it (``adopt``), and
    its actors share it."""
    global _built
    if _built is None:
        # corral's own first: a whole PEM block is one span, whatever a plugin finds inside.
        _built = _plan_of([*secret_rules.corral_rules(), *secret_rules.plugin_rules()])
    return _built


def prepare() -> None:
    """Build the pattern set now."""
    _plan()


def exported() -> list[secret_rules.WireRule]:
    """This process's rules, in their order, as a fork server it starts takes them
    (``adopt``); built now if they were not yet."""
    return secret_rules.to_wire(rule for family in _plan().families for rule in family.rules)


def adopt(wire: list[secret_rules.WireRule] | None) -> None:
    """Take the rules the supervisor built (``exported``), not build them again: the
    same set, without importing detect-secrets (0.15 s of a fork server's start-up
    CPU, measured). None: build them here."""
    global _built
    if _built is None:
        _built = _plan() if wire is None else _plan_of(secret_rules.from_wire(wire))

_extra_values: set[str] = set()


def register_secret(value: str) -> None:
    """Mark an exact value (an API key, a boot token) as secret for this process."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _extra_values.add(value)


def _env_secret_values(environ: Mapping[str, str]) -> Iterable[str]:
    for name, value in environ.items():
        if _SECRET_NAME.search(name) and len(value) >= MIN_SECRET_CHARS:
            yield value


#: The exact secret values, longest first, and what they were computed from. The
#: environment is walked again when its size or the registered secrets change, and
#: at least once a second, not on every call: that walk was a tenth of the
#: supervisor's time on the durable path.
_known: tuple[tuple[int, int], float, tuple[str, ...]] = ((-1, -1), 0.0, ())
REFRESH_S = 1.0


def _secret_values() -> tuple[str, ...]:
    global _known
    key = (len(os.environ), len(_extra_values))
    now = time.monotonic()
    if _known[0] != key or now - _known[1] > REFRESH_S:
        values = sorted({*_extra_values, *_env_secret_values(os.environ)}, key=len, reverse=True)
        _known = (key, now, tuple(values))
    return _known[2]


def redact_text(text: str) -> str:
    return _redact_text(text, _secret_values())


def _redact_text(text: str, values: tuple[str, ...]) -> str:
    if len(text) < MIN_SECRET_CHARS:
        return text  # shorter than any secret value and any pattern's match
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    spans = _recurring_spans(text) if len(text) <= RECURRING_MAX_CHARS else _secret_spans(_json_view(text))
    if not spans:
        return text
    parts, last = [], 0
    for start, end in spans:
        start, end = _whole_escapes(text, start, end)
        parts += [text[last:start], REDACTED]
        last = end
    return "".join([*parts, text[last:]])


def _json_view(text: str) -> str:
    """``text`` as the patterns should see it when it is JSON text (a model's reply,
    a transcript): an escaped quote or line break (``\\"``, ``\\n``) reads as the
    quote or the line break, its backslash as a space. Same length, so a span
    found in the view is the same span of the text."""
    if "\\" not in text:
        return text
    return text.replace('\\"', ' "').replace("\\n", " \n").replace("\\r", " \r").replace("\\t", " \t")


def _whole_escapes(text: str, start: int, end: int) -> tuple[int, int]:
    """A span that splits no escape sequence: redacting ``\\n``'s ``n`` alone would
    leave a backslash escaping ``[`` (invalid JSON)."""
    while start > 0 and _escaping(text, start - 1):
        start -= 1
    while end > start and _escaping(text, end - 1):
        end -= 1
    return start, end


def _escaping(text: str, at: int) -> bool:
    """Whether the backslash at ``at`` escapes the next character (an odd run)."""
    run = 0
    while at - run >= 0 and text[at - run] == "\\":
        run += 1
    return run % 2 == 1


#: Short texts recur: a tool's name, its usual result line, the run's id in every
#: event of the run. Their spans are remembered (the rules are fixed once loaded),
#: so a durable action pays the pattern search for what is new in it only (the
#: supervisor's CPU per durable read action: 1.4-1.6 ms before, 1.25-1.3 after).
#: Long texts are searched every time and never held.
RECURRING_MAX_CHARS = 256


@functools.lru_cache(maxsize=4096)
def _recurring_spans(text: str) -> tuple[tuple[int, int], ...]:
    return tuple(_secret_spans(_json_view(text)))


def _secret_spans(text: str) -> list[tuple[int, int]]:
    """Every rule's secrets in ``text``, merged where they overlap, in order."""
    plan = _plan()
    found = _Finder(text)
    held = {needle for needle in plan.needles if needle in found.lowered}
    spans: list[tuple[int, int]] = []
    for family in plan.families:
        if family.gate is not None and family.gate.isdisjoint(held):
            continue
        for rule in family.rules:
            _find(rule, found, spans)
    if len(spans) <= 1:
        return spans
    spans.sort()
    merged = [spans[0]]
    for start, end in spans[1:]:
        if start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def rule_spans(text: str) -> list[tuple[Rule, int, int]]:
    """Each rule's secret spans in ``text``'s JSON view (same length, same offsets),
    unmerged and with the rule that found them: for a caller that asks what was
    found, not only where (corral/core/secret_values.py). Exact known values are
    ``known_value_in``'s."""
    plan = _plan()
    found = _Finder(_json_view(text))
    held = {needle for needle in plan.needles if needle in found.lowered}
    out: list[tuple[Rule, int, int]] = []
    for family in plan.families:
        if family.gate is not None and family.gate.isdisjoint(held):
            continue
        for rule in family.rules:
            spans: list[tuple[int, int]] = []
            _find(rule, found, spans)
            out.extend((rule, start, end) for start, end in spans)
    return out


def json_view(text: str) -> str:
    """``text`` as the rules see it (``rule_spans``' offsets are offsets in it)."""
    return _json_view(text)


def known_value_in(text: str) -> bool:
    """Whether ``text`` holds an exact value registered as secret, or a secret
    environment variable's value."""
    return any(value in text for value in _secret_values())


def _find(rule: Rule, found: _Finder, spans: list[tuple[int, int]]) -> None:
    text = found.text
    if rule.starts is not None:
        # Only where a match can start, on that line (a multi-line rule: to the end).
        for pos in found.positions(rule.starts):
            start, end = (0, len(text)) if rule.multiline else found.line_of(pos)
            match = rule.pattern.match(found.slice(start, end), pos - start)
            if match is not None:
                _add(spans, rule, match, start)
    elif rule.line_safe or rule.multiline:
        for match in rule.pattern.finditer(text):  # one search finds what each line's would
            _add(spans, rule, match, 0)
    else:
        for start, end in found.lines_with(rule.anchors):
            for match in rule.pattern.finditer(found.slice(start, end)):
                _add(spans, rule, match, start)


def _add(spans: list[tuple[int, int]], rule: Rule, match: re.Match[str], offset: int) -> None:
    span = secret_rules.secret_span(rule, match)
    if span is not None:
        spans.append((span[0] + offset, span[1] + offset))


class _Finder:
    """Where a text holds anchors, each looked for once (``str.find``, a C loop),
    and its lines (detect-secrets' patterns are written for one line at a time)."""

    def __init__(self, text: str) -> None:
        self.text = text
        lowered = text.lower()
        if len(lowered) != len(text):
            lowered = text.replace("\u0130", "i").lower()  # the one longer lower-case form
        self.lowered = lowered
        self._positions: dict[Anchor, list[int]] = {}
        self._first_at: dict[Anchor, int] = {}
        self._slices: dict[tuple[int, int], str] = {}

    def _first(self, anchor: Anchor) -> int:
        at = self._first_at.get(anchor)
        if at is None:
            needle, exact = anchor
            at = self._first_at[anchor] = (self.text if exact else self.lowered).find(needle)
        return at

    def positions(self, anchors: frozenset[Anchor]) -> list[int]:
        found: set[int] = set()
        for anchor in anchors:
            known = self._positions.get(anchor)
            if known is None:
                needle, exact = anchor
                haystack = self.text if exact else self.lowered
                known = []
                at = self._first(anchor)
                while at >= 0:
                    known.append(at)
                    at = haystack.find(needle, at + 1)
                self._positions[anchor] = known
            found.update(known)
        return sorted(found)

    def line_of(self, pos: int) -> tuple[int, int]:
        end = self.text.find("\n", pos)
        return self.text.rfind("\n", 0, pos) + 1, len(self.text) if end < 0 else end

    def lines_with(self, anchors: frozenset[Anchor] | None) -> list[tuple[int, int]]:
        if anchors is None:
            starts = [0, *(at + 1 for at, char in enumerate(self.text) if char == "\n")]
            return sorted({self.line_of(start) for start in starts})
        return sorted({self.line_of(pos) for pos in self.positions(anchors)})

    def slice(self, start: int, end: int) -> str:
        key = (start, end)
        line = self._slices.get(key)
        if line is None:
            line = self._slices[key] = self.text[start:end]
        return line


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    """A key named like a secret (the same few keys recur on every write)."""
    return _SECRET_NAME.search(key) is not None


def redact(value: Any) -> Any:
    """Redact strings anywhere inside a JSON-like value; keys named like secrets too."""
    return _redact(value, _secret_values())


def _redact(value: Any, values: tuple[str, ...]) -> Any:
    kind = type(value)
    # The exact types first: almost everything the ledger writes is made of these,
    # and an ABC check (Mapping) costs several times more.
    if kind is str:
        return _redact_text(value, values)
    if kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        return _redact_map(value, values)
    if kind is list:
        return [_redact(item, values) for item in value]
    if isinstance(value, str):
        return _redact_text(value, values)
    if isinstance(value, Mapping):
        return _redact_map(value, values)
    if isinstance(value, list | tuple):
        return [_redact(item, values) for item in value]
    return value


def _redact_map(value: Mapping[Any, Any], values: tuple[str, ...]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, item in value.items():
        kind = type(item)
        if kind is int or kind is float or kind is bool or item is None:
            out[key] = item  # nothing to redact, and no call for it
        elif isinstance(key, str) and isinstance(item, str) and _secret_key(key):
            out[key] = REDACTED
        else:
            out[key] = _redact(item, values)
    return out


def summarize(text: str, limit: int = 200) -> str:
    """A redacted, bounded one-line summary safe for receipts and events."""
    flat = " ".join(redact_text(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


#: What one traceback may take in an action's record: the head line and the
#: innermost frames (where it raised) are kept, the middle of a deep one is cut.
TRACEBACK_MAX_CHARS = 6000
#: One line of it (an exception's message may be megabytes on one line).
TRACEBACK_LINE_MAX_CHARS = 600


def bounded_traceback(text: str, limit: int = TRACEBACK_MAX_CHARS) -> str:
    """A traceback as it may be recorded and shown: redacted as a whole (before
    anything is cut, so no cut leaves half a secret unrecognised), each line cut to
    ``TRACEBACK_LINE_MAX_CHARS`` and the whole to ``limit``: its first line and its
    tail (the innermost frames and the exception) kept, one marker line between.
    Unlike ``summarize``, line breaks stay."""
    lines = [
        line if len(line) <= TRACEBACK_LINE_MAX_CHARS else line[: TRACEBACK_LINE_MAX_CHARS - 1] + "…"
        for line in redact_text(text).splitlines()
    ]
    if sum(len(line) + 1 for line in lines) <= limit:
        return "\n".join(lines)
    marker = "  … (frames cut: the traceback is longer than a record keeps) …"
    kept: list[str] = []
    room = limit - len(lines[0]) - len(marker) - 2
    for line in reversed(lines[1:]):
        if len(line) + 1 > room:
            break
        kept.append(line)
        room -= len(line) + 1
    return "\n".join([lines[0], marker, *reversed(kept)])
