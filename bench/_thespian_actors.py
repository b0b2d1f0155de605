"""Thespian actor classes for the peer baseline (imported by Thespian's processes)."""

from __future__ import annotations

import os
from typing import Any

from thespian.actors import Actor  # type: ignore[import-untyped]


class Echo(Actor):  # type: ignore[misc]
    """Answers ("ping", x) with x, ("pid",) with its pid, counts ("tell", x)."""

    count = 0

    def receiveMessage(self, message: Any, sender: Any) -> None:
        if not isinstance(message, tuple):
            return  # system messages (ActorExitRequest, ...)
        kind = message[0]
        if kind == "ping" or kind == "work":
            self.send(sender, message[1])
        elif kind == "tell":
            self.count += 1
        elif kind == "count":
            self.send(sender, self.count)
        elif kind == "pid":
            self.send(sender, os.getpid())
