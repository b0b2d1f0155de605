"""When a chat turn is over, and the one ``[turn.report]`` line that says so (seed 004 V1.15).

A turn opens with a line the conversation takes (a new run, a steer, an answer)
or an approval decision, and closes once it is settled: the supervisor's
``conversation.turn_report`` says the turn's runs, children and receipts are
done (or wait for a person), and that state holds across a quiet window of the
event stream: the chat waits for the next event after the cursor the report was
read at, up to ``QUIET_MS``; any event ends the window early and the report is
read again. No sleep decides anything: a change of state is an event, so a
report is never printed for a state that changed under it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from corral.client import Client

PREFIX = "[turn.report]"
#: How long the event stream must stay quiet after a settled report.
QUIET_MS = 300


class TurnWatch:
    """Whether a turn is open (shared by the input side and the follower)."""

    def __init__(self) -> None:
        self._open = False
        self._changed = threading.Condition()

    def open(self) -> None:
        with self._changed:
            self._open = True

    def is_open(self) -> bool:
        with self._changed:
            return self._open

    def close(self) -> None:
        with self._changed:
            self._open = False
            self._changed.notify_all()

    def wait_closed(self, timeout: float) -> bool:
        """True once no turn is open; False after ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._open, timeout)


def settled_report(client: Client, conversation_id: str, shown: int) -> dict[str, Any] | None:
    """The report of the conversation's turn if it is settled and stays so across
    a quiet window; None when it is not (yet): ask again after the next events.
    ``shown``: the cursor of the events the chat has shown; a report of a later
    state waits until they are shown (the report comes after the final reply)."""
    first = client.call("conversation.turn_report", conversation_id=conversation_id)
    if not first["settled"] or first["cursor"] > shown:
        return None
    later = client.call("events", timeout=10, since=first["cursor"], wait_ms=QUIET_MS, limit=1)
    if later["events"]:
        return None  # something happened in the window: judge it afresh
    report: dict[str, Any] = first["report"]
    return report


def report_line(report: dict[str, Any]) -> str:
    """The one line a terminal shows: the prefix and the report as one line of JSON."""
    return f"{PREFIX} {json.dumps(report, sort_keys=True, separators=(',', ':'))}"
