"""Which secret *values* a text holds: what fails a provider response closed (seed
004, V1.43: "命中 API Key、Token、password/client secret/private key/credential 等
敏感 key ... 时，handoff 写入失败并进入 reconciliation").

Redaction (corral/core/redact.py) errs towards hiding: it hides ``token =
get_token()`` as readily as ``token = "ghp_..."``. Only the second holds a secret.
A response holding a secret value is never stored; one in which redaction would
hide only code that names a secret (an assignment of a call, a subscript, an
attribute or an environment variable) is ordinary code, which the tool must write
as the model wrote it (issue 14). So every rule that finds a value by its own
shape (a provider key, a PEM block, a URL's password, an exact value registered as
secret) counts, and a keyword rule (``password = ...``) counts unless what it
assigns is code. A quoted or bare literal counts: ``password: hunter2`` is one.
"""

from __future__ import annotations

import re

from corral.core import redact, secret_rules

#: Where a keyword rule's span holds the name too (corral's own rule), the value
#: starts after the first ``=`` or ``:``.
_ASSIGNED = re.compile(r"[=:]\s*")
_QUOTES = frozenset("\"'`")
#: A name, maybe dotted (``os.environ``, ``self.token``), then maybe a call or a
#: subscript; or an environment variable (``$TOKEN``, ``${TOKEN}``).
_NAME = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*")
_ENV_REFERENCE = re.compile(r"\$\{?[A-Za-z_]\w*\}?")
#: What may follow code on its line inside a rule's span (``user.password:``).
_TRAILING = ":;,)}]"

KNOWN_VALUE = "known secret value"


def secret_values_in(text: str) -> tuple[str, ...]:
    """The kinds of secret value ``text`` holds (the rules' sources, sorted), or ()."""
    kinds: set[str] = {KNOWN_VALUE} if redact.known_value_in(text) else set()
    view = redact.json_view(text)
    for rule, start, end in redact.rule_spans(text):
        if secret_rules.is_keyword_rule(rule) and names_code(view, start, end, rule.source == "corral"):
            continue
        kinds.add(rule.source)
    return tuple(sorted(kinds))


def names_code(view: str, start: int, end: int, with_name: bool) -> bool:
    """Whether the keyword rule's span ``view[start:end]`` assigns code, not a value.
    ``with_name``: the span holds the name too (corral's rule), else the value alone."""
    span = view[start:end]
    assigned = _ASSIGNED.search(span) if with_name else None
    if assigned is not None:
        value = span[assigned.end() :]
        quoted = value[:1] in _QUOTES
    else:  # the plugin's span is the value alone: a quote before it makes it a literal
        value = span
        quoted = start > 0 and view[start - 1] in _QUOTES
    value = value.strip().rstrip(_TRAILING)
    if quoted or not value:
        return False
    if _ENV_REFERENCE.fullmatch(value):
        return True
    name = _NAME.match(value)
    if name is None:
        return False
    rest = value[name.end() :]
    if rest[:1] in ("(", "["):
        return True  # a call or a subscript: get_token(), os.environ[
    return not rest and "." in name.group()  # an attribute: self.token, settings.SECRET_KEY
