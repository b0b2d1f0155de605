"""What the Python client returns: typed, read-only views of control replies.

Standard library only, so ``import corral`` stays cheap. Each view keeps the full
reply in ``raw`` for fields it does not name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.core.errors import RunFailed

#: A run in one of these states will not move again by itself.
DONE = frozenset({"completed", "failed", "cancelled"})
#: A run in one of these states waits for a person (approve/deny, reconcile, answer).
PARKED = frozenset({"waiting-confirmation", "needs-reconciliation", "needs-input"})


@dataclass(frozen=True)
class Action:
    """One action a run planned: a tool call and where it is in its lifecycle."""

    action_id: str
    tool: str
    phase: str
    loop_index: int
    policy: str
    fingerprint: str = ""
    #: Why it failed or was refused (redacted), when it did.
    error: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Action:
        return cls(
            action_id=str(row["action_id"]),
            tool=str(row.get("tool", "")),
            phase=str(row.get("phase", "")),
            loop_index=int(row.get("loop_index") or 0),
            policy=str(row.get("policy") or ""),
            fingerprint=str(row.get("fingerprint") or ""),
            error=str(row.get("error") or ""),
            raw=dict(row),
        )


@dataclass(frozen=True)
class RunResult:
    """A run as the ledger holds it: status, the single final reply (once written)
    and its actions."""

    run_id: str
    agent_id: str
    status: str
    final_reply: str | None
    reason: str | None
    actions: tuple[Action, ...]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def done(self) -> bool:
        """Completed, failed or cancelled: it will not move again."""
        return self.status in DONE

    @property
    def parked(self) -> bool:
        """Waiting for a person: see ``Client.pending()``."""
        return self.status in PARKED

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def check(self) -> RunResult:
        """Return self if completed; raise ``RunFailed`` if it failed or was cancelled."""
        if self.status in ("failed", "cancelled"):
            raise RunFailed(self.run_id, self.status, self.reason)
        return self

    @classmethod
    def from_show(cls, shown: dict[str, Any]) -> RunResult:
        run = shown["run"]
        return cls(
            run_id=str(run["run_id"]),
            agent_id=str(run.get("agent_id", "")),
            status=str(run["status"]),
            final_reply=shown.get("final_reply"),
            reason=run.get("reason"),
            actions=tuple(Action.from_row(row) for row in shown.get("actions", [])),
            raw=shown,
        )


@dataclass(frozen=True)
class Event:
    """One entry of the append-only event stream. Events are refresh hints: after
    a reconnect, re-read the state you care about (``show``, ``status``)."""

    cursor: int
    kind: str
    subject: str
    at: float
    data: dict[str, Any]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Event:
        return cls(
            int(row["cursor"]), str(row["kind"]), str(row["subject"]), float(row["at"]), dict(row["data"]), dict(row)
        )


@dataclass(frozen=True)
class Pending:
    """What waits for a person: actions to approve/deny or reconcile, provider
    requests and process sessions to reconcile, and provider retries scheduled."""

    actions: tuple[dict[str, Any], ...]
    provider_requests: tuple[dict[str, Any], ...]
    provider_retries: tuple[dict[str, Any], ...]
    sessions: tuple[dict[str, Any], ...]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __bool__(self) -> bool:
        return any((self.actions, self.provider_requests, self.provider_retries, self.sessions))

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> Pending:
        return cls(
            tuple(reply.get("actions", ())),
            tuple(reply.get("provider_requests", ())),
            tuple(reply.get("provider_retries", ())),
            tuple(reply.get("sessions", ())),
            raw=reply,
        )
