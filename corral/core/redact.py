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
from typing import Any

REDACTED = "[redacted]"
#: Shorter values are not treated as secrets, and every pattern matches more.
MIN_SECRET_CHARS = 6

# Names of environment variables whose values are secrets wherever they appear.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)

_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{16,}"),  # OpenAI-style keys
    re.compile(r"(?i:bearer\s+[A-Za-z0-9._\-]{12,})"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}"),
    # Stop at quotes and brackets so that redacting inside JSON text keeps it JSON.
    # A quoted value (``api_key = "..."``, also escaped inside JSON text) counts too.
    re.compile(r"(?i:(api[_-]?key|secret|password|token)\s*[=:]\s*(?:\\?[\"'])?[^\s\"',}\]\\]{6,})"),
]

#: Whether any pattern can match: one search instead of a substitution per
#: pattern, on the ledger's every write (most strings are ids and names).
_ANY_PATTERN = re.compile("|".join(f"(?:{pattern.pattern})" for pattern in _PATTERNS))

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
    if _ANY_PATTERN.search(text):
        for pattern in _PATTERNS:
            text = pattern.sub(REDACTED, text)
    return text


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
    if isinstance(value, str):
        return _redact_text(value, values)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and isinstance(item, str) and _secret_key(key):
                out[key] = REDACTED
            else:
                out[key] = _redact(item, values)
        return out
    if isinstance(value, list | tuple):
        return [_redact(item, values) for item in value]
    return value


def summarize(text: str, limit: int = 200) -> str:
    """A redacted, bounded one-line summary safe for receipts and events."""
    flat = " ".join(redact_text(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
