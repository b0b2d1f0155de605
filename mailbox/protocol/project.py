"""The project (supervisor/project/project_service.py): ``project.verify``'s two
ledger calls, the verification other tools require, and the spec's preview page.

Bounds are the ones the handlers checked by hand before these records: the verify
calls name a run and an action of at most 64 characters (a ledger tool's), a
revision is a non-negative integer, a fingerprint a digest of at most 128.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from corral.mailbox.protocol.base import Ack, Id, Method, Request
from corral.mailbox.protocol.sessions import SandboxGrant

#: A ledger tool's run and action ids: at most 64 characters, as its handler checked them before.
ToolId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
#: At most this many verify commands' outputs are recorded.
MAX_OUTPUTS = 64

# -- replies ------------------------------------------------------------------------


class Verification(msgspec.Struct, kw_only=True):
    """A recorded verification (supervisor/project/verification_store.py)."""

    action_id: str
    run_id: str
    revision: int
    fingerprint: str
    status: str
    commands: int
    #: Each command's argv, status, exit code and output tail, as recorded.
    output: list[dict[str, Any]]
    created_at: float


class VerifyBegun(SandboxGrant, kw_only=True):
    """``project.verify.begin``'s reply: the revision, the verify commands and their
    sandbox; ``recorded``: the action's verification when it has one already."""

    revision: int
    commands: list[list[str]]
    recorded: Verification | None


class VerificationState(msgspec.Struct, kw_only=True):
    """``project.verification``'s reply: the current revision, the verification that
    speaks for it (or the latest), whether it passed on the current revision, and
    whether it passed in the caller's run."""

    revision: int
    verification: Verification | None
    passed_on_current: bool
    passed_by_run: bool


class Preview(msgspec.Struct, kw_only=True):
    """``project.preview``'s reply: the spec's loopback preview page (or None), and
    the process ids of the run's running sessions, newest first (the preview a run
    started is one of them: ``session.poll`` names the ports each listens on)."""

    url: str | None
    sessions: list[str] = msgspec.field(default_factory=list)


class Revision(msgspec.Struct, kw_only=True):
    """``project.revision.advance``'s reply: the changeset's one project revision."""

    revision: int


# -- requests -----------------------------------------------------------------------


class ProjectVerifyBegin(Request[VerifyBegun], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``project.verify.begin``: the revision, the verify commands and their sandbox
    for an executing ``project.verify`` action (and its record, if it has one)."""

    METHOD: ClassVar[Method] = Method.PROJECT_VERIFY_BEGIN
    run_id: ToolId
    action_id: ToolId


class ProjectVerifyRecord(Request[Verification], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``project.verify.record``: the verification, recorded once per action."""

    METHOD: ClassVar[Method] = Method.PROJECT_VERIFY_RECORD
    run_id: ToolId
    action_id: ToolId
    revision: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    fingerprint: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    #: Each command's argv, status, exit code and output tail (bounded and redacted there).
    outputs: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=MAX_OUTPUTS)]
    passed: bool = False
    sources_changed: bool = True


class ProjectVerification(Request[VerificationState], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``project.verification``: the project's verification state for the caller's run."""

    METHOD: ClassVar[Method] = Method.PROJECT_VERIFICATION
    run_id: Id


class ProjectPreview(Request[Preview], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``project.preview``: the preview registry of ``run_id`` (seed 004 V1.1 §3's
    PreviewRegistry): the spec's loopback preview page and the run's running process
    sessions, which may serve one."""

    METHOD: ClassVar[Method] = Method.PROJECT_PREVIEW
    run_id: ToolId


class ProjectRevisionAdvance(Request[Revision], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``project.revision.advance``: the one revision of an executing
    ``project.changeset``, made after its checkpoint and before its first write
    (seed 004 V1.3); asked again, the same revision."""

    METHOD: ClassVar[Method] = Method.PROJECT_REVISION_ADVANCE
    run_id: ToolId
    action_id: ToolId


#: A full git object id (SHA-1 or SHA-256).
ObjectId = Annotated[str, msgspec.Meta(pattern=r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")]


class ProjectCommitMoved(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``project.commit.moved``: an executing ``project.git_commit`` moved its branch;
    the commit, its parent and the branch are kept in the action's record before
    anything else happens, so a crash from here on leaves them to the person who
    reconciles it (seed 004 V1.12's fallback receipt)."""

    METHOD: ClassVar[Method] = Method.PROJECT_COMMIT_MOVED
    run_id: ToolId
    action_id: ToolId
    commit: ObjectId
    parent: ObjectId
    branch: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]


#: The project's requests (the package's ``TypedRequest`` includes them).
ProjectRequest = (
    ProjectVerifyBegin | ProjectVerifyRecord | ProjectVerification | ProjectPreview | ProjectRevisionAdvance
    | ProjectCommitMoved
)
