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
from corral.supervisor.runs.approval_diff import proposed_writes

#: The tools whose input names the files they write (approval_diff.proposed_writes).
_WRITING_TOOLS = frozenset({FsWrite.schema.name, FsPatch.schema.name, Changeset.schema.name})


def writes_files(tool: str) -> bool:
    return tool in _WRITING_TOOLS


def refused_write(tool: str, tool_input: dict[str, Any], workspace: Path, scopes: tuple[str, ...]) -> str | None:
    """Why the tool would refuse one of the files it would write; None when it would not."""
    for raw, _new_content in proposed_writes(tool, tool_input):
        try:
            check_write_scope(workspace, resolve_in_workspace(workspace, raw), scopes, raw)
        except ToolError as exc:
            return str(exc)
    return None


def child_scope_refusal(action: Any, run: Any) -> str | None:
    """For a prepared action of a ``child`` run: why its write is out of bounds.
    An input the ledger holds redacted (``raw_sha256``) is left to the tool, which
    judges the raw one."""
    if run["kind"] != "child" or action["raw_sha256"] is not None:
        return None
    options = json.loads(run["options"])
    if not options.get("workspace"):
        return None
    tool_input = json.loads(action["input"])
    if not isinstance(tool_input, dict):
        return None
    scopes = tuple(str(scope) for scope in options.get("write_scopes", ["."]))
    return refused_write(str(action["tool"]), tool_input, Path(options["workspace"]), scopes)
