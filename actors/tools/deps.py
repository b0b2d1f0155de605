"""Dependencies for tools, as Pydantic AI passes ``RunContext[Deps]``: a ``deps``
factory (``"module:function"``, per agent or ``[tools] deps`` for all) is called
once in each agent's process at start, before any tool runs and before the actor
says hello to its supervisor; its value reaches every tool as ``ctx.deps``.

- The factory takes no argument; it may be a plain or an ``async`` function.
- A value that is an async context manager (``@contextlib.asynccontextmanager``, an
  ``httpx.AsyncClient``, a connection pool) is entered there and exited when the
  actor stops, so connections close; ``ctx.deps`` is what it entered as.
- A factory that raises (or a manager whose entry raises) ends the actor's start
  with ``EXIT_DEPS``; the traceback, redacted and bounded, is written beside its
  log (``DEPS_FAILURE``), where ``corral up`` reads it to stop and show it.

The reference is loaded through ``corral.actors.user_code.load``, like every user
reference: pinned at ``corral up`` (supervisor/spec/spec_deps.py loads it there).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import traceback
from pathlib import Path
from typing import Any

from corral.core.redact import bounded_traceback

#: The actor parameter carrying the agent's factory reference.
PARAM = "deps"
#: The exit code of an actor whose deps factory failed (docs/extending.md).
EXIT_DEPS = 5
#: Beside the actor's log: its last deps failure, for ``corral up`` to show.
DEPS_FAILURE = "{actor}.deps-failure.txt"


class DepsFailed(Exception):
    """The factory (or its manager's entry) raised; ``trace`` is its traceback."""

    def __init__(self, reference: str, trace: str) -> None:
        super().__init__(f"the deps factory {reference} failed")
        self.reference = reference
        self.trace = trace


async def open_deps(reference: str | None, resources: contextlib.AsyncExitStack) -> Any:
    """The deps value of ``reference`` (None: no factory, no deps); a context
    manager it returns is entered on ``resources``, so it is exited with them."""
    if reference is None:
        return None
    from corral.actors.user_code import load

    try:
        factory = load(reference)
        value = factory()
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, contextlib.AbstractAsyncContextManager) or _is_async_manager(value):
            value = await resources.enter_async_context(value)
    except Exception as exc:
        # From the user's frames down (the first frame is this function's call).
        frames = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        text = "".join(traceback.TracebackException(type(exc), exc, frames or exc.__traceback__).format())
        raise DepsFailed(reference, bounded_traceback(text)) from None
    return value


def _is_async_manager(value: Any) -> bool:
    return callable(getattr(value, "__aenter__", None)) and callable(getattr(value, "__aexit__", None))


def failure_path(home: Path, actor_id: str) -> Path:
    return home / "logs" / DEPS_FAILURE.format(actor=actor_id)


def record_failure(home: Path, actor_id: str, failed: DepsFailed) -> None:
    """Write the failure beside the actor's log (private: a traceback may name paths)."""
    path = failure_path(home, actor_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(f"{failed}\n{failed.trace}\n")


def read_failure(home: Path, actor_id: str) -> str | None:
    """What ``record_failure`` wrote for ``actor_id``, or None."""
    try:
        return failure_path(home, actor_id).read_text(encoding="utf-8", errors="replace")[:20_000]
    except OSError:
        return None
