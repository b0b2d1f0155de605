"""The project on the supervisor: its revision, ``project.verify``'s two ledger calls,
the one call other tools use to require a verification, and the final-reply gate.

Actor methods (the agent's tools ask them with the records of mailbox/protocol/project.py):

* ``project.verify.begin``: for an executing ``project.verify`` action of the
  caller's run: the current revision, the spec's verify commands, the command
  sandbox (as ``command.exec`` gets it), and the verification this action already
  recorded, if any (a tool that runs again returns it, it does not verify twice);
* ``project.verify.record``: records the verification once per action
  (supervisor/project/verification_store.py), then the failpoint
  ``verify.after-record``;
* ``project.verification``: ``{revision, verification, passed_on_current,
  passed_by_run}`` for any tool that needs a passed verification on the current
  revision (the gated git commit, which needs the caller's run's own:
  actors/tools/project_verify.py ``require_verification``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from corral.mailbox.protocol import (
    Ack,
    Preview,
    ProjectCommitMoved,
    ProjectPreview,
    ProjectRevisionAdvance,
    ProjectVerification,
    ProjectVerifyBegin,
    ProjectVerifyRecord,
    Revision,
    Verification,
    VerificationState,
    VerifyBegun,
)
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.project import preview_gate, revision_store, verification_store, verify_recovery
from corral.supervisor.runs import action_store
from corral.supervisor.runs.recovery import RecoveryReport
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.sessions import session_store
from corral.supervisor.spec.spec_models import ProjectTable

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot

#: The sandbox settings a command of a run gets (the spec's, narrowed by the run's intent).
SandboxOf = Callable[[Any], dict[str, Any]]

VERIFY_TOOL = "project.verify"
CHANGESET_TOOL = "project.changeset"
COMMIT_TOOL = "project.git_commit"


def project_settings(raw_spec: dict[str, Any]) -> ProjectTable:
    """The spec's ``[project]`` table (already checked when the spec was read)."""
    table = raw_spec.get("project", {})
    return TypeAdapter(ProjectTable).validate_python(table if isinstance(table, dict) else {})


class ProjectService:
    def __init__(self, ledger: Ledger, runs: RunService, settings: ProjectTable, sandbox_of: SandboxOf) -> None:
        self.ledger = ledger
        #: Which run a caller owns, and the action a call is for.
        self.runs = runs
        #: ``[project]``: the verify commands and whether a final reply needs them.
        self.settings = settings
        self.sandbox_of = sandbox_of

    async def preview(self, slot: ActorSlot, request: ProjectPreview) -> Preview:
        """The preview registry for ``preview.validate``: the spec's loopback page
        (checked at spec load) and the caller's run's running sessions, newest first."""
        self.runs.run_of(slot, request.run_id)  # the caller's own run, or refused
        sessions = [row["process_id"] for row in reversed(session_store.live_sessions(self.ledger, request.run_id))
                    if row["state"] == "running"]
        return Preview(url=self.settings.preview_url, sessions=sessions)

    def _verify_action(self, slot: ActorSlot, request: ProjectVerifyBegin | ProjectVerifyRecord) -> tuple[Any, Any]:
        action = self.runs.tool_action(slot, request.run_id, request.action_id, VERIFY_TOOL)
        if action["phase"] != "executing":
            raise BadRequest(f"action {action['action_id']} is {action['phase']}, not executing")
        return self.runs.run_of(slot, request.run_id), action

    async def revision_advance(self, slot: ActorSlot, request: ProjectRevisionAdvance) -> Revision:
        """The one revision of an executing ``project.changeset``, before its first
        write (seed 004 V1.3); kept whatever the apply comes to."""
        action = self.runs.tool_action(slot, request.run_id, request.action_id, CHANGESET_TOOL)
        if action["phase"] != "executing":
            raise BadRequest(f"action {action['action_id']} is {action['phase']}, not executing")
        return Revision(revision=revision_store.record(self.ledger, action))

    async def commit_moved(self, slot: ActorSlot, request: ProjectCommitMoved) -> Ack:
        """An executing ``project.git_commit`` moved its branch: its safe fields are kept
        in the action's record now, for whoever reconciles it after a crash (seed 004
        V1.12: the fallback receipt keeps the commit SHA)."""
        action = self.runs.tool_action(slot, request.run_id, request.action_id, COMMIT_TOOL)
        output = {"commit": request.commit, "parent": request.parent,
                  "branch": request.branch.removeprefix("refs/heads/")}
        action_store.keep_partial_result(
            self.ledger, action, output,
            f"committed {request.commit[:12]} on {output['branch']}; its result was not recorded yet")
        return Ack()

    async def verify_begin(self, slot: ActorSlot, request: ProjectVerifyBegin) -> VerifyBegun:
        run, action = self._verify_action(slot, request)
        workspace = json.loads(run["options"]).get("workspace")
        if not isinstance(workspace, str):
            raise BadRequest(f"run {run['run_id']} has no workspace")
        recorded = verification_store.get(self.ledger, action["action_id"])
        return VerifyBegun(
            revision=revision_store.current(self.ledger),
            commands=[list(argv) for argv in self.settings.verify],
            project_root=workspace,
            sandbox=self.sandbox_of(run),
            recorded=None if recorded is None else Verification(**recorded),
        )

    async def verify_record(self, slot: ActorSlot, request: ProjectVerifyRecord) -> Verification:
        run, action = self._verify_action(slot, request)
        recorded = verification_store.record(
            self.ledger,
            run["run_id"],
            action["action_id"],
            revision=request.revision,
            fingerprint=request.fingerprint,
            passed=request.passed,
            sources_changed=request.sources_changed,
            outputs=request.outputs,
        )
        self.ledger.failpoint("verify.after-record")
        return Verification(**recorded)

    async def verification(self, slot: ActorSlot, request: ProjectVerification) -> VerificationState:
        run = self.runs.run_of(slot, request.run_id)
        state = verification_store.state(self.ledger)
        by_run = verification_store.passed_by_run(self.ledger, run["run_id"], state["revision"])
        last = state["verification"]
        return VerificationState(
            revision=state["revision"],
            verification=None if last is None else Verification(**last),
            passed_on_current=state["passed_on_current"],
            passed_by_run=by_run,
        )

    def final_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        """A root run whose tree changed sources (its own writes, its children's,
        its delegations') finalizes only on a passed verification of the current
        revision. A child or a delegation delivers to its parent, which is gated:
        a child may not run commands at all (CHILD_TOOLS), so it could never pass."""
        if not self.settings.verification_required or revision_store.last_change_in_tree(ledger, run_id) is None:
            return []
        reason = verification_store.missing_reason(ledger)
        return [reason] if reason else []

    def show_section(self, run_id: str) -> dict[str, Any]:
        state = verification_store.state(self.ledger)
        changed = revision_store.last_change_in_tree(self.ledger, run_id)
        blocked = self.final_blockers(self.ledger, run_id)
        return {**state, "changed_at_revision": changed, "require_verification": self.settings.verification_required,
                "final_blocked": blocked[0] if blocked else None}


class ProjectFeature(RunFeature):
    """The project in runs: each receipt may move its revision; the final reply
    waits for its verification (and a preview, when the spec requires one);
    recovery settles a verification in flight; ``show`` shows it."""

    def __init__(self, service: ProjectService) -> None:
        self.service = service

    def on_receipt(self, ledger: Ledger, row: Any) -> None:
        revision_store.on_receipt(ledger, row)

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        reasons = self.service.final_blockers(ledger, run_id)
        if self.service.settings.require_preview:
            reasons = reasons + preview_gate.final_blockers(ledger, run_id)
        return reasons

    def recover(self, ledger: Ledger, report: RecoveryReport) -> None:
        verify_recovery.recover(ledger, report, self.service.runs.features)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"project": self.service.show_section(run_id)}


def install(sup: Supervisor) -> ProjectService:
    from corral.supervisor.sessions.session_service import sandbox_settings

    def sandbox_of(run: Any) -> dict[str, Any]:
        return sup.intent.scoped_sandbox(run, sandbox_settings(sup.spec.sandbox, sup.home))

    service = ProjectService(sup.ledger, sup.runs, project_settings(sup.spec.raw), sandbox_of)
    sup.methods.project = service
    return service
