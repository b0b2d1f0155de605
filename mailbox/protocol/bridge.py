"""An agent-task bridge's jobs (supervisor/bridge/bridge_service.py), driven by the
``bridge_worker`` actor (actors/bridge_worker.py).

Bounds are the ones the handler checked by hand before these records: ids of at
most 40 characters, a reply of at most 20,000, a reason of at most 500, a
revision between 1 and 2**53 - 1, a wait of at most 600 s.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from corral.mailbox.protocol.base import Ack, Method, Request

BridgeId = Annotated[str, msgspec.Meta(min_length=1, max_length=40)]
Revision = Annotated[int, msgspec.Meta(ge=1, le=2**53 - 1)]


class BridgeJobList(msgspec.Struct, kw_only=True):
    """``bridge.jobs``' reply: the worker's unfinished jobs, as their rows."""

    jobs: list[dict[str, Any]]


class BridgeJob(msgspec.Struct, kw_only=True):
    """``bridge.job_open``'s and ``bridge.job_advance``'s reply: the job, as its row."""

    job: dict[str, Any]


class BridgeRunState(msgspec.Struct, kw_only=True):
    """``bridge.run_status``'s reply: the job's corral run, ended (``done``) or not;
    its final reply once it completed."""

    done: bool
    status: str
    final_reply: str | None


class BridgeJobs(Request[BridgeJobList], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bridge.jobs``: the unfinished jobs (a restarted worker drives them on)."""

    METHOD: ClassVar[Method] = Method.BRIDGE_JOBS


class BridgeJobOpen(Request[BridgeJob], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bridge.job_open``: a job for a task the worker is about to claim."""

    METHOD: ClassVar[Method] = Method.BRIDGE_JOB_OPEN
    task_id: BridgeId
    title: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    revision: Revision
    #: Which attempt at the task this is (its submissions so far); None: not said.
    attempt: Annotated[int, msgspec.Meta(ge=0, le=10_000)] | None = None


class BridgeJobAdvance(Request[BridgeJob], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bridge.job_advance``: a job's next phase, committed before the bridge call it
    leads to, with the facts that call will send (None: unchanged)."""

    METHOD: ClassVar[Method] = Method.BRIDGE_JOB_ADVANCE
    job_id: BridgeId
    phase: Annotated[str, msgspec.Meta(min_length=1, max_length=20)]
    assignment_id: BridgeId | None = None
    binding_id: BridgeId | None = None
    bridge_run_id: BridgeId | None = None
    submission_id: BridgeId | None = None
    reply: Annotated[str, msgspec.Meta(max_length=20_000)] | None = None
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=500)] | None = None
    revision: Revision | None = None

    def facts(self) -> dict[str, str | int]:
        """The facts this change records, by column."""
        named = {
            "assignment_id": self.assignment_id,
            "binding_id": self.binding_id,
            "bridge_run_id": self.bridge_run_id,
            "submission_id": self.submission_id,
            "reply": self.reply,
            "reason": self.reason,
            "revision": self.revision,
        }
        return {name: value for name, value in named.items() if value is not None}


class BridgeRunStatus(Request[BridgeRunState], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bridge.run_status``: the job's corral run, waiting up to ``wait_s`` for its end."""

    METHOD: ClassVar[Method] = Method.BRIDGE_RUN_STATUS
    job_id: BridgeId
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 0.0


class BridgeReport(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``bridge.report``: a problem the worker cannot solve itself (no token)."""

    METHOD: ClassVar[Method] = Method.BRIDGE_REPORT
    problem: Annotated[str, msgspec.Meta(max_length=500)]


#: The bridge worker's requests (the package's ``TypedRequest`` includes them).
BridgeRequest = BridgeJobs | BridgeJobOpen | BridgeJobAdvance | BridgeRunStatus | BridgeReport
