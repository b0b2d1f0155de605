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
assigns is code. A quoted or bare literal counts: ``password: hunter2`` is one;
a variable, quoted or not (``"${API_KEY}"``), a placeholder (``<your-api-key>``), a
parameter's type (``password: str``) and an empty default (``password=None``) do not.
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
#: A placeholder for a value (``api_key=<your-api-key>``): a template, no value.
_PLACEHOLDER = re.compile(r"<[A-Za-z][\w.-]*>")
#: Words that stand where a value would and are none: a parameter's type
#: (``password: str``) or an empty default (``password=None``).
_NO_VALUE = frozenset({"str", "bytes", "string", "SecretStr", "None", "null", "nil", "undefined"})
#: What may follow such a word in code: the rest of a signature or an annotation.
_AFTER_NO_VALUE = " |=),]"
#: A string literal assigned after such a word (``password: str = "pw"``), which a
#: rule's span may leave out: a value after all.
_LITERAL_ASSIGNED = re.compile(r"=\s*[\"'`]")
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
    # A variable or a placeholder names a value even quoted: the shell or the config
    # loader fills it in (``API_KEY="$OPENAI_API_KEY"``, ``api_key: "${KEY}"``).
    literal = value[1:] if quoted and assigned is not None else value
    if _ENV_REFERENCE.fullmatch(literal) or _PLACEHOLDER.fullmatch(literal):
        return True
    if quoted or not value:
        return False
    name = _NAME.match(value)
    if name is None:
        return False
    rest = value[name.end() :]
    if rest[:1] in ("(", "["):
        return True  # a call or a subscript: get_token(), os.environ[
    if name.group() in _NO_VALUE and (not rest or rest[0] in _AFTER_NO_VALUE):
        line_end = view.find("\n", end)
        line_rest = view[end : len(view) if line_end < 0 else line_end]
        return not _LITERAL_ASSIGNED.search(rest + line_rest)  # a type or an empty default
    return not rest and "." in name.group()  # an attribute: self.token, settings.SECRET_KEY
