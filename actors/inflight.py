"""Which actions an agent is running right now, kept in a small file of the home
that the supervisor reads when the agent dies unexpectedly.

The supervisor charges such a crash to exactly these actions (see
supervisor/runs/poison.py: an action that keeps crashing its agent is stopped as
poison), not to the other actions of a read batch, which are ``executing`` in the
ledger from the start but may not have run yet, nor to finished ones.

The file outlives the process (it is in the page cache), so no fsync: a power
loss ends the supervisor that would read it too. Its content is one line, the ids
separated by spaces, rewritten in place; a reader takes the first line only. A
shorter line is padded with spaces to the length written last, so each change is
one ``pwrite`` and never an ``ftruncate`` (which made the agent's system time per
durable action three times the old figure).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("corral.agent")

DIRECTORY = "inflight"
#: More than the ids of a whole parallel batch.
MAX_BYTES = 4096
ACTION_ID = re.compile(r"^act-[0-9a-f]{24}$")


def path(home: Path, actor_id: str) -> Path:
    return home / DIRECTORY / actor_id


class InFlight:
    """The running actions of one actor process (one lane, or a parallel batch)."""

    def __init__(self, home: Path, actor_id: str) -> None:
        self._path = path(home, actor_id)
        self._ids: list[str] = []
        self._fd: int | None = None
        self._written = 0  # the longest line written: a shorter one is padded to it
        # A new incarnation starts with nothing in flight, whatever its predecessor left.
        self._write()

    def add(self, action_id: str) -> None:
        self._ids.append(action_id)
        self._write()

    def remove(self, action_id: str) -> None:
        with contextlib.suppress(ValueError):
            self._ids.remove(action_id)
        self._write()

    def _write(self) -> None:
        line = " ".join(self._ids)
        data = (line.ljust(self._written - 1) + "\n").encode()
        try:
            if self._fd is None:
                # O_TRUNC: whatever a predecessor left is gone before the first line.
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
                self._fd = os.open(self._path, flags, 0o600)
            os.pwrite(self._fd, data, 0)
            self._written = max(self._written, len(data))
        except OSError as exc:
            # Best effort: a crash nobody can charge to an action still counts
            # against the agent's restart intensity.
            log.warning("cannot record the actions in flight in %s: %s", self._path, exc.strerror)


def take(home: Path, actor_id: str) -> list[str]:
    """The action ids a dead actor had in flight (well-formed ones only), and the
    file removed, so that nothing is charged twice."""
    target = path(home, actor_id)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        data = os.read(fd, MAX_BYTES)
    except OSError:
        data = b""
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            target.unlink()
    line = data.split(b"\n", 1)[0].decode("ascii", "replace")
    return [word for word in line.split() if ACTION_ID.match(word)]


def reset(home: Path) -> None:
    """At boot: the directory, empty (what an earlier boot's actors had in flight
    when the supervisor stopped is no crash of theirs)."""
    directory = home / DIRECTORY
    directory.mkdir(mode=0o700, exist_ok=True)
    for entry in directory.iterdir():
        with contextlib.suppress(OSError):
            entry.unlink()
