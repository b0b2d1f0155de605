"""An isolated child's file write outside its write scopes, refused before its
policy may ask a person (seed 004, V1.34: "拒绝结果不进入 waiting-for-confirmation").

The tool itself refuses such a write when it runs (actors/tools/paths.py); this is
the same judgement made earlier, at the action boundary, so a person is never asked
to approve a write that cannot happen. Paths are judged as the tool judges them:
after every symlink is resolved, never by their spelling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.actors.tools.base import ToolError
from corral.actors.tools.fs import FsPatch, FsWrite
from corral.actors.tools.paths import check_write_scope, resolve_in_workspace
from corral.actors.tools.project import Changeset
from corral.core.redact import REDACTED
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import tool_boundary
from corral.supervisor.runs.approval_diff import write_targets
from corral.supervisor.runs.loop_plan_store import get_plan

#: The tools whose input names the files they write (approval_diff.write_targets).
_WRITING_TOOLS = frozenset({FsWrite.schema.name, FsPatch.schema.name, Changeset.schema.name})


def writes_files(tool: str) -> bool:
    return tool in _WRITING_TOOLS


def refused_write(tool: str, tool_input: dict[str, Any], workspace: Path, scopes: tuple[str, ...]) -> str | None:
    """Why the tool would refuse one of the files it would write (every target of
    every operation: a delete or an edit as much as a create); None when it would not."""
    for raw in write_targets(tool, tool_input):
        try:
            check_write_scope(workspace, resolve_in_workspace(workspace, raw), scopes, raw)
        except ToolError as exc:
            return str(exc)
    return None


def plan_refusal(ledger: Ledger, run: Any, loop: int, index: int, tool: str, tool_input: dict[str, Any]) -> str | None:
    """For action ``index`` of a ``child`` run's plan ``loop``, as it is prepared (its
    raw input in hand): why it may not run. Its own files first; then every other
    write planned with it, and every tool planned with it (tool_boundary.py), so one
    member out of bounds refuses the whole plan before any confirmation
    ("任一成员被拒绝时 ... 不创建 confirmation，也不执行同批其它成员")."""
    scoped = _scoped(run)
    if scoped is None:
        return None
    own = _refusal(tool, tool_input, *scoped)
    if own is not None:
        return own
    plan = get_plan(ledger, run["run_id"], loop)
    for other, call in enumerate((plan or {}).get("actions") or []):
        if other == index or not isinstance(call, dict):
            continue
        other_tool = str(call.get("tool"))
        # A member the child may not use at all (an MCP call) refuses the plan too.
        why = tool_boundary.refusal(run, other_tool)
        if why is None and writes_files(other_tool):
            why = _refusal(other_tool, call.get("input"), *scoped)
        if why is not None:
            return f"action {other} of the same plan may not run ({why}): nothing of that plan runs"
    return None


def child_scope_refusal(action: Any, run: Any) -> str | None:
    """For a write of a ``child`` run about to start (prepared, or approved: an
    approval never passes the check, "approval 不能穿透"): why it may not. Judged on
    the paths, which are no secret: the ledger's input is enough even when it holds
    the body redacted (``raw_sha256``)."""
    scoped = _scoped(run)
    if scoped is None:
        return None
    return _refusal(str(action["tool"]), json.loads(action["input"]), *scoped)


def _scoped(run: Any) -> tuple[Path, tuple[str, ...]] | None:
    """A child run's workspace and write scopes; None for any other run."""
    if run["kind"] != "child":
        return None
    options = json.loads(run["options"])
    if not options.get("workspace"):
        return None
    return Path(options["workspace"]), tuple(str(scope) for scope in options.get("write_scopes", ["."]))


def _refusal(tool: str, tool_input: object, workspace: Path, scopes: tuple[str, ...]) -> str | None:
    if not isinstance(tool_input, dict):
        return None
    for raw in write_targets(tool, tool_input):
        if REDACTED in raw:  # a path redaction changed cannot be judged: refused
            return f"the path {raw!r} holds redacted text: it cannot be checked against this agent's write scopes"
    return refused_write(tool, tool_input, workspace, scopes)
