"""The traceback of a user's tool that raised, as its action's record keeps it.

A person debugging a tool needs where it raised, not only "raised
FileNotFoundError: …". The frames kept are the user's: from their tool function
down to the raise, without corral's and trio's machinery above it (the thread a
sync tool ran in, the timeout). The text goes through the one redaction path and
is bounded (corral/core/redact.py ``bounded_traceback``): a secret in a message or
in a source line is redacted, and 10,000 frames of recursion stay a few KB.
"""

from __future__ import annotations

import inspect
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.core.redact import bounded_traceback

#: Frames under these directories are the runtime's, never the user's (the
#: fallback when the tool function's own frame is not on the traceback, e.g. a
#: decorator that wraps it without ``functools.wraps``).
_RUNTIME_ROOTS: tuple[Path, ...] = tuple(
    Path(module.__file__).resolve().parent
    for module in (__import__("corral"), __import__("trio"), __import__("outcome"))
    if module.__file__
)


def user_traceback(exc: BaseException, func: Callable[..., Any]) -> str:
    """``exc``'s traceback from the frame of ``func`` (the user's tool) inward,
    with its chained causes, redacted and bounded."""
    start = _user_start(exc.__traceback__, func)
    text = "".join(traceback.TracebackException(type(exc), exc, start).format())
    return bounded_traceback(text)


def _user_start(tb: types.TracebackType | None, func: Callable[..., Any]) -> types.TracebackType | None:
    code = getattr(inspect.unwrap(func), "__code__", None)
    node = tb
    while node is not None:
        if node.tb_frame.f_code is code:
            return node
        node = node.tb_next
    node = tb
    while node is not None and _is_runtime(node.tb_frame.f_code.co_filename):
        node = node.tb_next
    return node if node is not None else tb


def _is_runtime(filename: str) -> bool:
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return any(path.is_relative_to(root) for root in _RUNTIME_ROOTS)
