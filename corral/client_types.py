"""What the Python client returns: typed, read-only views of control replies.

Standard library only, so ``import corral`` stays cheap. Each view keeps the full
reply in ``raw`` for fields it does not name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
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
    #: The agent's typed output (its spec's ``output``), validated: an instance of the
    #: pydantic model when the output is one (and this process can import it), else
    #: the JSON value (a dict). None: no typed output, or no final reply yet.
    output: Any = None
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
            output=typed_output(shown.get("output"), shown.get("output_model")),
            raw=shown,
        )


def typed_output(value: Any, model: Any) -> Any:
    """``value`` as an instance of the pydantic model ``module:Class`` names, when
    this process has imported that module already (the caller's own class,
    ``output=Forecast``: nothing is imported on a ledger's word); otherwise the JSON
    value as it is. The supervisor validated it already."""
    if value is None or not isinstance(model, str) or ":" not in model:
        return value
    module_name, _, qualname = model.partition(":")
    target: Any = sys.modules.get(module_name)
    main = sys.modules.get("__main__")
    if target is None and main is not None and Path(str(getattr(main, "__file__", "") or "")).stem == module_name:
        target = main  # the running script, which the supervisor imports by its file's stem
    for part in qualname.split("."):
        target = getattr(target, part, None)
    validate = getattr(target, "model_validate", None)
    if validate is None:
        return value
    try:
        return validate(value)
    except Exception:  # another version of the class than the supervisor's: the dict stands
        return value


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
    requests and process sessions to reconcile, provider retries scheduled, and
    structured questions to answer (each with its ``request_id``, ``run_id`` and
    ``questions``: id, header, question, options with label and description;
    ``corral.question_text.render_question`` lays one out for a terminal)."""

    actions: tuple[dict[str, Any], ...]
    provider_requests: tuple[dict[str, Any], ...]
    provider_retries: tuple[dict[str, Any], ...]
    sessions: tuple[dict[str, Any], ...]
    questions: tuple[dict[str, Any], ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __bool__(self) -> bool:
        return any((self.actions, self.provider_requests, self.provider_retries, self.sessions, self.questions))

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> Pending:
        return cls(
            tuple(reply.get("actions", ())),
            tuple(reply.get("provider_requests", ())),
            tuple(reply.get("provider_retries", ())),
            tuple(reply.get("sessions", ())),
            tuple(reply.get("questions", ())),
            raw=reply,
        )


@dataclass(frozen=True)
class ApprovalView:
    """What a person approves (``Client.approval``): the tool, every argument with its
    real value (only substrings that look like secrets masked; sealed fields as
    their digest), the effect class, policy, reason, and the fingerprint the
    approval is bound to: pass it to ``approve`` to approve exactly this. A file
    tool's action carries the diff against the current file in ``files``.

    ``arguments`` and ``files`` are maps with ``text`` (one page of the value, or
    all of it when read with ``all_pages``), ``chars`` (its whole length), ``page``
    and ``pages``."""

    action_id: str
    run_id: str
    agent_id: str
    tool: str
    phase: str
    effect: str
    policy: str
    reason: str
    fingerprint: str
    arguments: tuple[dict[str, Any], ...]
    files: tuple[dict[str, Any], ...]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def pages(self) -> int:
        """The most pages any value has (1: everything is in this view)."""
        return max((int(value["pages"]) for value in (*self.arguments, *self.files)), default=1)

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> ApprovalView:
        return cls(
            action_id=str(reply["action_id"]),
            run_id=str(reply.get("run_id", "")),
            agent_id=str(reply.get("agent_id", "")),
            tool=str(reply.get("tool", "")),
            phase=str(reply.get("phase", "")),
            effect=str(reply.get("effect", "")),
            policy=str(reply.get("policy", "")),
            reason=str(reply.get("reason") or ""),
            fingerprint=str(reply.get("fingerprint", "")),
            arguments=tuple(reply.get("arguments", ())),
            files=tuple(reply.get("files", ())),
            raw=reply,
        )


class ViewChanged(Exception):
    """The pages of one approval view do not belong together (a file changed while
    they were read): read it again."""


def joined_pages(pages: list[dict[str, Any]]) -> dict[str, Any]:
    """One approval view with every value whole, from its pages 1..N in order."""
    whole = {**pages[0], "page": 1, "pages": 1}
    for key in ("arguments", "files"):
        values = [dict(value) for value in pages[0][key]]
        for later in pages[1:]:
            if len(later[key]) != len(values):
                raise ViewChanged("the approval view changed while its pages were read")
            for value, part in zip(values, later[key], strict=True):
                if part["digest"] != value["digest"]:
                    raise ViewChanged("the approval view changed while its pages were read")
                value["text"] += part["text"]
        for value in values:
            value.update(page=1, pages=1)
        whole[key] = values
    whole["page_chars"] = max([len(v["text"]) for v in (*whole["arguments"], *whole["files"])] or [0])
    return whole
