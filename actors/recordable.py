"""Values an actor hands to the supervisor to send and record: tool results, plans,
user actors' replies.

They cross the wire as msgpack and are stored as JSON, so they must be JSON-shaped
(maps with string keys, lists, strings, finite numbers, booleans, null) and bounded.
A value that is not (a ``set``, a ``datetime``, an ``object()``, a cycle, bytes, an
integer msgpack cannot hold) is found here, before anything is sent, with the path
to the offending part; the caller turns it into a failed action or an error reply.
Left to the encoder it would raise deep inside a send and crash the actor.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

#: Deeper than any result a model reads; msgpack itself refuses past 512.
MAX_DEPTH = 64
#: What msgpack can encode as an integer.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_SCALARS = (str, int, float, bool, type(None))


class NotRecordable(ValueError):
    """A value that cannot be sent and recorded; the message names where and why
    (itself sendable: a key quoted in it may be the part that is not)."""

    def __init__(self, message: str) -> None:
        super().__init__(text(message))


def check(value: Any, where: str = "value") -> None:
    """Raise NotRecordable naming the first part of ``value`` that is not JSON-shaped."""
    if _fine(value, 0, set()):
        return
    # Only now the walk that names where: building every part's path up front was
    # a tenth of an agent's CPU per durable read action.
    _walk(value, where, 0, set())


def encoded_size(value: Any) -> int:
    """The bytes ``value`` takes on the wire (after ``check``)."""
    return len(msgpack.packb(value, use_bin_type=True))


def check_bounded(value: Any, limit: int, where: str = "value") -> None:
    """``check``, then refuse a value larger than ``limit`` bytes on the wire."""
    check(value, where)
    size = encoded_size(value)
    if size > limit:
        raise NotRecordable(f"{where} is {size} bytes encoded; at most {limit} fit in a message")


def text(value: str) -> str:
    """A message made sendable: what is not valid Unicode (lone surrogates, as
    in an exception's text) is written as a backslash escape."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _walk(value: Any, where: str, depth: int, path: set[int]) -> None:
    if isinstance(value, _SCALARS):
        _scalar(value, where)
        return
    if depth >= MAX_DEPTH:
        raise NotRecordable(f"{where} nests deeper than {MAX_DEPTH} levels")
    if not isinstance(value, dict | list | tuple):
        raise NotRecordable(f"{where} is a {type(value).__name__}, which cannot be recorded ({_WHAT})")
    if id(value) in path:
        raise NotRecordable(f"{where} contains itself (a cycle), which cannot be recorded")
    path.add(id(value))
    try:
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise NotRecordable(
                        f"{where} has a key of type {type(key).__name__} ({key!r:.40}); map keys must be strings"
                    )
                _scalar(key, f"{where} key {key!r:.40}")
                _walk(item, f"{where}.{key:.40}", depth + 1, path)
        else:
            for index, item in enumerate(value):
                _walk(item, f"{where}[{index}]", depth + 1, path)
    finally:
        path.discard(id(value))


def _fine(value: Any, depth: int, path: set[int]) -> bool:
    """Whether ``_walk`` would find nothing wrong with ``value`` (the same checks,
    without naming where; a False is explained by ``_walk``)."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _fine_scalar(value)
    if kind is bool or value is None:
        return True
    if isinstance(value, _SCALARS):
        return _fine_scalar(value)
    if depth >= MAX_DEPTH or not isinstance(value, dict | list | tuple) or id(value) in path:
        return False
    path.add(id(value))
    try:
        if isinstance(value, dict):
            return all(
                type(key) is str and (key.isascii() or _fine_scalar(key)) and _fine(item, depth + 1, path)
                for key, item in value.items()
            )
        return all(_fine(item, depth + 1, path) for item in value)
    finally:
        path.discard(id(value))


def _fine_scalar(value: Any) -> bool:
    try:
        _scalar(value, "")
    except NotRecordable:
        return False
    return True


def _scalar(value: Any, where: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise NotRecordable(f"{where} is a string that is not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise NotRecordable(f"{where} is {value}, which JSON cannot hold")
    elif isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX:
        raise NotRecordable(f"{where} is an integer of {value.bit_length()} bits; at most 64 fit")


_WHAT = "only maps with string keys, lists, strings, finite numbers, booleans and null"
