"""The records of an agent's part with people (supervisor/interactive/ serves them):
a question for a person, its own history, its reply as it is generated."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from corral.mailbox.protocol.base import Ack, Id, Method, Request

#: A filter's or a name's text (the lookups bound it further).
Name = Annotated[str, msgspec.Meta(max_length=300)]


class InputRequest(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``input.request``: ``user.input_request``'s questions, its action executing;
    the run parks for the answer (supervisor/interactive/question_store.py checks
    the questions' shape)."""

    METHOD: ClassVar[Method] = Method.INPUT_REQUEST
    run_id: Id
    action_id: Id
    questions: list[dict[str, Any]]


class SafeDetail(msgspec.Struct, kw_only=True):
    """A ``project.changeset`` receipt's structured detail, whitelisted field by field
    (seed 004 V1.6: "checkpointId / revision / changeCount / revisionAdvanced";
    supervisor/interactive/receipt_read.py ``safe_detail``)."""

    checkpoint_id: str
    revision: int
    change_count: int
    revision_advanced: bool


class OwnReceipt(msgspec.Struct, kw_only=True):
    """One receipt of the agent's own, as the model reads it: checked again against
    its action and its run, redacted, no absolute path
    (supervisor/interactive/own_history.py ``_cleaned``). The optional fields are
    absent (``UNSET``), not null, once the detail budget left them out; ``detail``
    only for a tool with a safe detail, ``detail_unavailable`` when its result does
    not parse as one."""

    action_id: str
    run_id: str
    session_id: str
    tool: str
    status: str
    execution_mode: str
    fingerprint: str
    input_summary: str | UnsetType = UNSET
    result_summary: str | UnsetType = UNSET
    note: str | UnsetType | None = UNSET
    started_at: float | UnsetType | None = UNSET
    finished_at: float | None
    detail: SafeDetail | UnsetType = UNSET
    detail_unavailable: bool | UnsetType = UNSET


class ActionReceipts(msgspec.Struct, kw_only=True):
    """``history.actions``' reply: the agent's receipts, newest first; ``more`` when
    older ones matched past the limit, ``truncated`` when the detail budget left
    fields or receipts out (supervisor/interactive/own_history.py ``action_history``)."""

    agent_id: str
    receipts: list[OwnReceipt]
    more: bool
    truncated: bool


class HistoryActions(Request[ActionReceipts], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``history.actions``: ``agent.action_history``'s lookup of the calling agent's
    own actions (supervisor/interactive/own_history.py bounds each filter)."""

    METHOD: ClassVar[Method] = Method.HISTORY_ACTIONS
    run_id: Id
    action_id: Id
    #: A run of this agent's, or "all"; None: the calling run.
    of_run: Name | None = None
    of_action: Name | None = None
    tool: Name | None = None
    status: Name | None = None
    limit: int | None = None


class CommandSource(msgspec.Struct, kw_only=True):
    """``history.command``'s reply: the run and the end of the agent's own finished
    ``command.exec`` (supervisor/interactive/own_history.py ``command_source``)."""

    run_id: str
    exit_code: int | None
    status: str | None
    output_sha256: str | None
    capture_truncated: bool
    timed_out: bool
    source_changed: bool


class HistoryCommand(Request[CommandSource], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``history.command``: ``command.output_read``'s lookup of the command action
    ``source`` of the calling agent's."""

    METHOD: ClassVar[Method] = Method.HISTORY_COMMAND
    run_id: Id
    source: Id


class ReplyDelta(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``reply.delta`` (best effort): final-reply text as it is generated, or, with
    ``tokens``, a progress report (the tokens generated so far, never stored)."""

    METHOD: ClassVar[Method] = Method.REPLY_DELTA
    run_id: Name
    slot: Name
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    #: Checked by the handler (at most its MAX_DELTA_CHARS).
    text: str
    tokens: Annotated[int, msgspec.Meta(ge=0, le=10**9)] | None = None


#: The people family's requests (the package's ``TypedRequest`` includes them).
PeopleRequest = InputRequest | HistoryActions | HistoryCommand | ReplyDelta
