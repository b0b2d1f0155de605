"""Strict JSON, one path for every wire format that hashes what it receives
(intent contracts, the task bridge): duplicate keys, invalid Unicode (lone
surrogates), non-finite numbers, floats and integers past 2^53 - 1 are refused,
and so is nesting deeper than MAX_DEPTH (found before parsing: the parser, the
schema checks and the canonical form all recurse once per level). The canonical
form is RFC 8785 (JCS), hashed with SHA-256."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import rfc8785

from corral.core import nesting

MAX_SAFE_INTEGER = 2**53 - 1
#: Arrays and objects nest at most this deep (far past any real request).
MAX_DEPTH = 64


class StrictJsonError(ValueError):
    """``code``: "bad-json", "too-deep", "duplicate-key", "invalid-unicode" or "unsafe-number"."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def loads(text: str | bytes) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        if len(keys) != len(set(keys)):
            twice = sorted({key for key in keys if keys.count(key) > 1})
            raise StrictJsonError("duplicate-key", f"duplicate key(s) {', '.join(twice)}")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise StrictJsonError("unsafe-number", f"{name} is not a JSON number")

    try:
        nesting.check_json(text, MAX_DEPTH)
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except nesting.TooDeep as exc:
        raise StrictJsonError("too-deep", f"not accepted: {exc}") from None
    except RecursionError:  # the scan above should make this unreachable
        raise StrictJsonError("too-deep", "not accepted: nested too deeply") from None
    except UnicodeError as exc:
        raise StrictJsonError("invalid-unicode", f"not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise StrictJsonError("bad-json", f"not valid JSON: {exc}") from None
    check_unicode(value)
    return value


def check_unicode(value: Any, where: str = "$") -> None:
    """No lone surrogate (``"\\ud800"`` parses, but is not Unicode text)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise StrictJsonError("invalid-unicode", f"{where}: a string holds a lone surrogate") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key, f"{where} (a key)")
            check_unicode(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_unicode(item, f"{where}[{index}]")


def leaves(value: Any, where: str = "$") -> Iterator[tuple[Any, str]]:
    """Every value of a JSON document that is not a map or a list, with its path
    (``$.a[0].b``): one walk for the checks that judge leaves alone."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, f"{where}[{index}]")
    else:
        yield value, where


def check_numbers(value: Any, where: str = "$") -> None:
    """JSON numbers are safe integers only (no floats, nothing past 2^53 - 1)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, float) or (isinstance(value, int) and abs(value) > MAX_SAFE_INTEGER):
        raise StrictJsonError("unsafe-number", f"{where}: {value!r} is not a safe integer")
    if isinstance(value, dict):
        for key, item in value.items():
            check_numbers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_numbers(item, f"{where}[{index}]")


def canonical(value: Any) -> bytes:
    """RFC 8785 bytes of a value in the safe-integer subset."""
    check_numbers(value)
    return bytes(rfc8785.dumps(value))


def sha256(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()
