"""What a secret looks like: the rules redaction applies (corral/core/redact.py).

The patterns are detect-secrets' plugins (Yelp's maintained set: AWS, basic-auth
URLs, the keyword assignments, private keys, GitHub, GitLab, Slack, Stripe, JWT,
...), read from the installed package, plus the few corral needs that no plugin
has. Nothing here copies a plugin's regex: a new plugin or a fixed pattern
arrives with the package.

detect-secrets scans one line at a time, and most of its patterns start with an
alternation that Python's ``re`` tries at every position: run as they are over
every observation, they cost ~40x what redaction used to. So each rule carries
what its own parse tree proves about every match: literal strings one of which it
contains (``anchors``), and literal strings one of which it starts with
(``starts``). redact.py looks for those with ``str.find`` (a C loop) and runs a
rule only where they are, on that line.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: (needle, exact): an exact needle is looked for as it is; the others in the
#: lower-cased text (the rule ignores case there).
Anchor = tuple[str, bool]


@dataclass(frozen=True)
class Rule:
    source: str  # the plugin (or "corral") it comes from
    pattern: re.Pattern[str]
    #: The group that holds the secret; None: from the first group that took part
    #: (or the match's start) to the match's end, trimmed of separators.
    group: int | None
    #: Every match contains one of these; None: nothing certain (look everywhere).
    anchors: frozenset[Anchor] | None
    #: Every match starts with one of these (two characters or more), or None.
    starts: frozenset[Anchor] | None
    #: No match can hold a line break, and no assertion sees one differently from
    #: a line's end: searching the whole text finds what searching each line finds.
    line_safe: bool
    #: Matched on the whole text, not line by line (a PEM block spans lines).
    multiline: bool = False

    @property
    def gate(self) -> frozenset[str] | None:
        """Lower-case needles one of which the lower-cased text holds, or None."""
        return None if self.anchors is None else frozenset(needle.lower() for needle, _ in self.anchors)


#: A rule as a supervisor hands it to the fork server it starts (msgpack-able): its
#: source, the pattern's text and flags, its group, and what its parse tree proved.
WireRule = list[Any]


def _wire_anchors(anchors: frozenset[Anchor] | None) -> list[list[Any]] | None:
    return None if anchors is None else [[needle, exact] for needle, exact in sorted(anchors)]


def _anchors_of(wire: list[list[Any]] | None) -> frozenset[Anchor] | None:
    return None if wire is None else frozenset((str(needle), bool(exact)) for needle, exact in wire)


def to_wire(rules: Iterable[Rule]) -> list[WireRule]:
    return [
        [r.source, r.pattern.pattern, r.pattern.flags, r.group, _wire_anchors(r.anchors), _wire_anchors(r.starts),
         r.line_safe, r.multiline]
        for r in rules
    ]


def from_wire(wire: Iterable[WireRule]) -> list[Rule]:
    """The rules ``to_wire`` gave, as they were: each pattern compiled again from its
    text and flags, the proofs taken as the sender made them (no detect-secrets
    import, no parse tree walked)."""
    return [
        Rule(str(source), re.compile(str(pattern), int(flags)), None if group is None else int(group),
             _anchors_of(anchors), _anchors_of(starts), bool(line_safe), bool(multiline))
        for source, pattern, flags, group, anchors, starts, line_safe, multiline in wire
    ]


def rule(source: str, pattern: re.Pattern[str], group: int | None, multiline: bool = False) -> Rule:
    tree = _Tree.of(pattern)
    if tree is None:
        return Rule(source, pattern, group, None, None, False, multiline)
    starts = tree.starts()
    if starts is not None and min(len(needle) for needle, _ in starts) < 2:
        starts = None  # a single character is everywhere: searching costs less
    return Rule(source, pattern, group, tree.anchors(), starts, tree.line_safe(), multiline)


# -- corral's own -------------------------------------------------------------------

#: What no plugin covers and corral handles itself: provider keys of today's form
#: (the OpenAI plugin knows only the legacy ``T3BlbkFJ`` form), the bearer tokens
#: of its HTTP clients, whole PEM blocks (the plugin flags the header line only, and
#: the key is in the lines below it), and ``token`` assignments (not a keyword of
#: the plugin). Stop at quotes and brackets so that redacting inside JSON text
#: keeps it JSON; a quoted value (also escaped inside JSON text) counts too.
_CORRAL = (
    (r"sk-[A-Za-z0-9_\-]{16,}", False),
    (r"(?i:bearer\s+[A-Za-z0-9._\-]{12,})", False),
    (r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----", True),
    # A JSON or YAML key's own closing quote may stand before its colon (``"password": "..."``).
    (r"(?i:(api[_-]?key|secret|password|token|credential|private[_-]?key)\s*(?:\\?[\"'])?\s*[=:]\s*(?:\\?[\"'])?"
     r"[^\s\"',}\]\\]{6,})", False),
    # An annotated assignment of a literal (``password: str = "hunter2"``): the rule
    # above stops at the type, which left the literal itself in the text. A quoted
    # variable or placeholder (``"${DB_PASSWORD}"``, ``"<your-key>"``) is no value.
    (r"(?i:(api[_-]?key|secret|password|token)\s*:\s*[A-Za-z_][\w.\[\]|, ]{0,60}?\s*=\s*\\?[\"'](?![$<{])"
     r"[^\"'\s\\]{4,})", False),
)

#: corral's keyword assignment (the last of ``_CORRAL``): like the keyword plugin's,
#: it finds a name and what is assigned to it, which may be code, not a value.
KEYWORD_PATTERN = _CORRAL[3][0]
KEYWORD_SOURCES = frozenset({"KeywordDetector"})


def is_keyword_rule(found: Rule) -> bool:
    """A rule that finds ``name = value`` by the name (``password``, ``token``), not
    a value by its own shape (a provider key, a PEM block, a URL's password)."""
    return found.source in KEYWORD_SOURCES or found.pattern.pattern == KEYWORD_PATTERN


#: The password in a URL's userinfo, whatever the scheme (``redis://:pw@h``,
#: ``amqp://u:pw@h``, ``mongodb+srv://u:p@ss@h``, one made up): from the first ``:``
#: after ``://`` to the authority's last ``@`` (a raw ``@`` in a password is common),
#: any character the authority can hold. The plugin's basic-auth pattern wants a
#: user name and no sub-delimiter (``$ ! & ( ) * + , ; =``) in the password, and
#: leaves those whole. The user name stays readable. Matched only where ``://`` is.
_URL_PASSWORD = r"://[^\s/?#@:\"'`]*:([^\s/?#\"'`]+)@"


def corral_rules() -> list[Rule]:
    """Each replaces its whole match (``password: hunter2`` goes whole), but a URL's
    password, which goes alone."""
    return [*(rule("corral", re.compile(source), 0, multiline) for source, multiline in _CORRAL),
            rule("corral", re.compile(_URL_PASSWORD), 1)]


# -- detect-secrets' plugins ----------------------------------------------------------

#: Plugins left out, and why: public IP addresses are not credentials (redacting
#: them would blank every ``ping``); the high-entropy plugins are not patterns (and
#: would flag every hash and id corral writes).
_NOT_SECRETS = frozenset({"IPPublicDetector"})


def plugin_rules() -> list[Rule]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins import keyword
    from detect_secrets.plugins.base import RegexBasedDetector

    rules: list[Rule] = []
    plugins: Iterable[type] = get_mapping_from_secret_type_to_class().values()
    for plugin in plugins:
        if plugin.__name__ in _NOT_SECRETS or not issubclass(plugin, RegexBasedDetector):
            continue
        # ``denylist`` is a class attribute (declared as an abstract property).
        denylist: Iterable[re.Pattern[str]] = plugin.denylist  # type: ignore[assignment]
        rules.extend(rule(plugin.__name__, pattern, None) for pattern in denylist)
    # The keyword plugin chooses its regexes by file type; an observation may be any
    # of them, so all of them apply, each with the group its table names.
    by_pattern: dict[re.Pattern[str], int] = {}
    for table in keyword.REGEX_BY_FILETYPE.values():
        by_pattern.update(table)
    rules.extend(rule("KeywordDetector", pattern, group) for pattern, group in by_pattern.items())
    return rules


# -- what a parse tree proves ---------------------------------------------------------------


def _score(anchors: frozenset[Anchor]) -> tuple[int, int, bool]:
    """Longer needles first, then fewer of them, then exact ones (rarer)."""
    return (min(len(needle) for needle, _ in anchors), -len(anchors), all(exact for _, exact in anchors))


class _Tree:
    """A pattern's parse tree (``re._parser``, what ``re.compile`` itself uses).

    Sound by construction: only literals that every path must consume count, and
    whatever is not understood proves nothing (None)."""

    def __init__(self, c: Any, tree: Any, exact: bool) -> None:
        self.c, self.tree, self.exact = c, tree, exact

    @classmethod
    def of(cls, pattern: re.Pattern[str]) -> _Tree | None:
        try:
            parser: Any = importlib.import_module("re._parser")
            constants: Any = importlib.import_module("re._constants")
            return cls(constants, parser.parse(pattern.pattern, pattern.flags), not pattern.flags & re.IGNORECASE)
        except Exception:  # a future ``re`` without this parser: look everywhere
            return None

    def anchors(self) -> frozenset[Anchor] | None:
        try:
            return self._contains(list(self.tree), self.exact)
        except Exception:
            return None

    def starts(self) -> frozenset[Anchor] | None:
        try:
            return self._starts(list(self.tree), self.exact)
        except Exception:
            return None

    def line_safe(self) -> bool:
        try:
            return self._safe(list(self.tree), bool(self.tree.state.flags & re.DOTALL))
        except Exception:
            return False

    def _literal(self, value: int, exact: bool) -> str:
        return chr(value) if exact else chr(value).lower()

    def _contains(self, items: list[tuple[Any, Any]], exact: bool) -> frozenset[Anchor] | None:
        best: frozenset[Anchor] | None = None

        def consider(found: frozenset[Anchor] | None) -> None:
            nonlocal best
            if found and (best is None or _score(found) > _score(best)):
                best = found

        run = ""
        for op, av in items:
            if op is self.c.LITERAL:
                run += self._literal(av, exact)
                continue
            if run:
                consider(frozenset({(run, exact)}))
                run = ""
            consider(self._item(op, av, exact, self._contains))
        if run:
            consider(frozenset({(run, exact)}))
        return best

    def _starts(self, items: list[tuple[Any, Any]], exact: bool) -> frozenset[Anchor] | None:
        if not items:
            return None
        if items[0][0] is self.c.LITERAL:
            run, taken = "", 0
            for op, av in items:
                if op is not self.c.LITERAL:
                    break
                run += self._literal(av, exact)
                taken += 1
            # What follows the run right after it lengthens it (``A`` + ``KIA|ASIA``).
            after = self._starts(items[taken:], exact) if taken < len(items) else None
            if after is not None and all(same == exact for _, same in after):
                return frozenset((run + needle, exact) for needle, _ in after)
            return frozenset({(run, exact)})
        return self._item(*items[0], exact, self._starts)

    def _item(self, op: Any, av: Any, exact: bool, walk: Any) -> frozenset[Anchor] | None:
        c = self.c
        if op is c.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if add_flags & re.IGNORECASE:
                exact = False
            elif del_flags & re.IGNORECASE:
                exact = True
            found: frozenset[Anchor] | None = walk(list(sub), exact)
            return found
        if op is getattr(c, "ATOMIC_GROUP", None):
            atomic: frozenset[Anchor] | None = walk(list(av), exact)
            return atomic
        if op is c.BRANCH:
            branches = [walk(list(branch), exact) for branch in av[1]]
            if any(branch is None for branch in branches):
                return None
            return frozenset().union(*branches)
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            low, _high, sub = av
            repeated: frozenset[Anchor] | None = walk(list(sub), exact) if low >= 1 else None
            return repeated
        if op is c.IN:
            # A few characters (``[MNO]``, ``(?:r|s)``): one of them is there.
            chars = [chr(value) for kind, value in av if kind is c.LITERAL]
            if len(chars) != len(av) or not chars or len(chars) > 8:
                return None
            return frozenset((char if exact else char.lower(), exact) for char in chars)
        return None  # zero-width, a class, a back-reference: nothing certain

    #: Classes that hold a line break, and classes that do not.
    _BREAKING = frozenset({"CATEGORY_SPACE", "CATEGORY_UNI_SPACE", "CATEGORY_NOT_DIGIT", "CATEGORY_UNI_NOT_DIGIT",
                           "CATEGORY_NOT_WORD", "CATEGORY_UNI_NOT_WORD", "CATEGORY_LOC_NOT_WORD",
                           "CATEGORY_LINEBREAK", "CATEGORY_UNI_LINEBREAK"})
    _UNBROKEN = frozenset({"CATEGORY_DIGIT", "CATEGORY_UNI_DIGIT", "CATEGORY_WORD", "CATEGORY_UNI_WORD",
                           "CATEGORY_LOC_WORD", "CATEGORY_NOT_SPACE", "CATEGORY_UNI_NOT_SPACE",
                           "CATEGORY_NOT_LINEBREAK", "CATEGORY_UNI_NOT_LINEBREAK"})

    def _safe(self, items: list[tuple[Any, Any]], dotall: bool) -> bool:
        """No node consumes a line break; no anchor but a word boundary (which sees a
        line's end and a line break alike)."""
        c, newline = self.c, ord("\n")
        for op, av in items:
            if op is c.LITERAL:
                safe = av != newline
            elif op is c.NOT_LITERAL:
                safe = av == newline
            elif op is c.ANY:
                safe = not dotall
            elif op is c.IN:
                safe = not self._class_breaks(av)
            elif op is c.SUBPATTERN:
                _group, add_flags, del_flags, sub = av
                scoped = (dotall or bool(add_flags & re.DOTALL)) and not del_flags & re.DOTALL
                safe = self._safe(list(sub), scoped)
            elif op is c.BRANCH:
                safe = all(self._safe(list(branch), dotall) for branch in av[1])
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
                safe = self._safe(list(av[2]), dotall)
            elif op is getattr(c, "ATOMIC_GROUP", None):
                safe = self._safe(list(av), dotall)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                safe = self._safe(list(av[1]), dotall)
            elif op is c.AT:
                safe = av in (c.AT_BOUNDARY, c.AT_NON_BOUNDARY)
            elif op is c.GROUPREF:
                safe = True  # the group itself was checked
            else:
                safe = False
            if not safe:
                return False
        return True

    def _class_breaks(self, members: Any) -> bool:
        newline, holds, negate = ord("\n"), False, False
        for kind, value in members:
            if kind is self.c.NEGATE:
                negate = True
            elif kind is self.c.LITERAL:
                holds = holds or value == newline
            elif kind is self.c.RANGE:
                holds = holds or value[0] <= newline <= value[1]
            elif kind is self.c.CATEGORY and str(value) in self._BREAKING:
                holds = True
            elif not (kind is self.c.CATEGORY and str(value) in self._UNBROKEN):
                return True  # not understood: assume it may
        return holds != negate


# -- the secret in a match ---------------------------------------------------------------

#: Where a value found inside JSON text ends: at an escaped line break or quote
#: (``\\n``, ``\\"``); a real line break ends it too (lines are matched one by one).
_VALUE_END = re.compile(r'\\[nrt"]|[\r\n]')
#: Around a whole match: the separators some plugins include (``=AKC...``,
#: ``://user:password@``), which are not the secret and keep the text's shape.
_EDGES = " \t\r\n\"'`=:/@,"


def secret_span(found: Rule, match: re.Match[str]) -> tuple[int, int] | None:
    """Where in ``match.string`` the secret is (None: nothing left to hide)."""
    text = match.string
    if found.group is not None:
        start, end = match.span(found.group)
        if start < 0:
            return None
    else:
        groups = range(1, found.pattern.groups + 1)
        start = next((match.start(g) for g in groups if match.start(g) >= 0), match.start())
        end = match.end()
        while start < end and text[start] in _EDGES:
            start += 1
        while end > start and text[end - 1] in _EDGES:
            end -= 1
    if found.group != 0:  # corral's own rules stop at quotes and escapes themselves
        cut = _VALUE_END.search(text, start, end)
        if cut is not None:
            end = cut.start()
    while end > start and text[end - 1] == "\\":
        end -= 1  # an escape's backslash stays with what it escapes
    return (start, end) if end > start else None
