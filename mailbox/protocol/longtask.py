"""Long tasks' records (supervisor/longtask/ serves them): the agent's summary of
its older turns, its durable plan, its goal's verdict."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from corral.mailbox.protocol.base import Count, Id, Method, Request
from corral.mailbox.steps import Stepped

#: An observation's place in its run (``observations.seq``, from 1).
Seq = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


class Compacted(Stepped, kw_only=True):
    """``context.compacted``'s reply: the summary covers the observations to ``to_seq``."""

    to_seq: int


class ContextCompacted(Request[Compacted], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``context.compacted``: the agent's summary of the run's observations up to
    ``to_seq``, once per covered range; its reply carries the next step when
    ``want_next`` (supervisor/runs/step_piggyback.py)."""

    METHOD: ClassVar[Method] = Method.CONTEXT_COMPACTED
    run_id: Id
    to_seq: Seq
    #: Checked by the handler (1 to MAX_SUMMARY_CHARS once stripped).
    summary: str
    #: The summary request's lifecycle slot (``CompactStep.slot``): completed with the summary.
    slot: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    want_next: bool = False
    history_have: Count = 0


class Verdict(msgspec.Struct, kw_only=True):
    """``goal.verdict``'s reply: the verdict as recorded (the first, when the action
    asks again after a crash) and what it binds to (supervisor/longtask/goal_store.py
    ``record_verdict``); the tool hands it to the model as it is."""

    action_id: str
    met: bool
    evidence: str
    #: When it was recorded (Unix seconds).
    at: float
    #: The goal's and the durable plan's revisions, and the latest verification's
    #: action id, at the verdict (None on a verdict recorded before they were kept).
    goal_revision: int | None
    plan_revision: int | None
    verification_id: str | None


class GoalVerdict(Request[Verdict], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``goal.verdict``: whether the run's goal is met, with the evidence (checked
    by the handler: 1 to MAX_EVIDENCE_CHARS once stripped)."""

    METHOD: ClassVar[Method] = Method.GOAL_VERDICT
    run_id: Id
    action_id: Id
    met: bool
    evidence: str


#: Long tasks' requests (the package's ``TypedRequest`` includes them).
LongTaskRequest = ContextCompacted | GoalVerdict
