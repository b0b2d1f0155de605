"""``project.verify`` (seed 004 V1.2, V1.3, V1.12): runs the project's verify
commands (the spec's ``[project] verify``, never the model's choice) and records a
verification bound to the project revision and the source fingerprint it started
on: ``passed``, ``failed`` (with each command's output tail) or ``stale`` (the
revision moved while it ran, or the commands changed the sources themselves).

Each command runs as ``command.exec`` runs one (process.run_sandboxed: the same
sandbox the supervisor grants, the same bounded, sanitized capture), in order,
stopping at the first that fails. Its effect class is ``external``, like
``command.exec``'s: a verify command is the project's own program and may write
(a formatter, a build), so a crash while it runs is left to a person
(needs-reconciliation), never re-run behind their back. The record is written once
per action: a tool run again after it returns it and runs nothing.

``require_verification`` is the one check other tools (the gated git commit) make.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
from typing_extensions import TypedDict

from corral.actors.session import private_dirs
from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.fs import SOURCES_CHANGED
from corral.actors.tools.process import command_transcript, run_sandboxed
from corral.actors.tools.source_fingerprint import fingerprint
from corral.mailbox.protocol import (
    ProjectVerification,
    ProjectVerifyBegin,
    ProjectVerifyRecord,
    Verification,
    VerificationState,
)

#: Seconds one verify command may take.
VERIFY_TIMEOUT_S = 600.0
#: Lines of each command's output kept in the verification (its tail: where a failure shows).
OUTPUT_LINES = 40


class VerifyArgs(TypedDict):
    pass


async def require_verification(ctx: ToolContext) -> VerificationState:
    """The project's verification state when this run has a passed verification of
    the current, non-zero revision (seed 004 V1.12: revision 0 is the user's own
    worktree, which corral never changed nor can vouch for); otherwise a ToolError
    (code ``verification-required``) that says why."""
    state = await ctx.ask(ProjectVerification(run_id=ctx.run_id))
    revision = state.revision
    if revision == 0:
        raise ToolError("the project is at revision 0: no change was made through corral, so there is no verified"
                        " change of this run to commit; change the sources, then run project.verify",
                        "verification-required")
    if state.passed_by_run:
        # "验证后再次修改…的工作树都不能提交": a write after the verification that made no
        # revision (a process session started before it, an editor outside corral)
        # shows only in the tree. The verification that speaks for this revision
        # passed on the sources whose fingerprint it kept; the tree must still be that.
        verified = state.verification
        now = await trio.to_thread.run_sync(fingerprint, ctx.workspace, ctx.home)
        if verified is None or not now.complete or now.digest != verified.fingerprint:
            raise ToolError(f"the sources changed since revision {revision} was verified (something wrote after"
                            " project.verify without a new revision: a process session, a program outside corral):"
                            " run project.verify again", "verification-required")
        return state
    if state.passed_on_current:
        raise ToolError(f"revision {revision} was verified by another run, not this one: run project.verify in"
                        " this run first", "verification-required")
    last = state.verification
    detail = f"; the last verification, at revision {last.revision}, is {last.status}" if last else ""
    raise ToolError(f"no passed verification on the current project revision {revision}{detail}:"
                    " run project.verify first", "verification-required")


def _tail(result: Any) -> str:
    lines = [*result.stdout.head, *result.stdout.tail, *result.stderr.head, *result.stderr.tail]
    return "\n".join(lines[-OUTPUT_LINES:])


def _outcome(recorded: Verification, changed: bool) -> ToolResult:
    status = recorded.status
    output: dict[str, Any] = {"verification": msgspec.to_builtins(recorded)}
    if changed:
        output[SOURCES_CHANGED] = True
    summary = f"verification {status} at revision {recorded.revision} ({recorded.commands} commands)"
    return ToolResult(status == "passed", output, summary)


class ProjectVerify:
    schema = schema(
        "project.verify",
        "Run the project's verify commands (from its spec) in the sandbox and record the result against the"
        " current project revision. A final reply after changing sources needs a passed verification.",
        VerifyArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        begun = await ctx.ask(ProjectVerifyBegin(run_id=ctx.run_id, action_id=ctx.action_id))
        if begun.recorded is not None:
            return _outcome(begun.recorded, False)  # recorded already: nothing runs twice
        commands = begun.commands
        if not commands:
            raise ToolError("this project has no verify commands: list them in the spec's [project] verify",
                            "no-verify-commands")
        before = await trio.to_thread.run_sync(fingerprint, ctx.workspace, ctx.home)
        outputs: list[dict[str, Any]] = []
        passed = before.complete
        for index, argv in enumerate(commands):
            transcript = command_transcript(ctx, f"{ctx.action_id}-{index}")
            private_dirs(transcript.parent)
            if transcript.exists():
                raise ToolError(f"action {ctx.action_id} already ran its verify command {index} once", "conflict")
            result = await run_sandboxed(argv, ctx.workspace, VERIFY_TIMEOUT_S, begun, transcript)
            outputs.append({"argv": argv, "status": result.state.value, "exit_code": result.exit_code,
                            "output": _tail(result)})
            if not (result.state.value == "exited" and result.exit_code == 0):
                passed = False
                break
        after = await trio.to_thread.run_sync(fingerprint, ctx.workspace, ctx.home)
        changed = not before.same_as(after)
        if not before.complete:
            outputs.append({"argv": [], "status": "not-verified", "exit_code": None,
                            "output": "the source tree is over the fingerprint's bound: it cannot be verified whole"})
        recorded = await ctx.ask(
            ProjectVerifyRecord(
                run_id=ctx.run_id,
                action_id=ctx.action_id,
                revision=begun.revision,
                fingerprint=before.digest,
                passed=passed,
                sources_changed=changed,
                outputs=outputs,
            )
        )
        return _outcome(recorded, changed)
