"""What a file tool's action would change, for the person asked to approve it: a
unified diff against the workspace file as it is now.

The current file is found and read exactly as the tool finds and reads it: the
same ToolContext, the same confinement (actors/tools/paths.py, through
``staging.confined`` and ``staging.open_to_read``): a path is judged after every
symlink is resolved, never by its spelling, and a file is opened without following
a symlink at any level. A path the tool would refuse (outside the workspace, a
symlink escape, a control or secrets file, outside the write scopes) shows the
refusal as an error line, never the other file's bytes.

Both sides are masked by the one redaction path (corral/core/redact.py) before
they are compared, so a secret in the file or in the new content is masked in
the diff, and a multi-line secret (a PEM block) is recognised whole. What is read
and diffed is bounded (``READ_BYTES``, ``MAX_LINES``, ``MAX_FILES``).

The diff is a preview: the approval binds the action's fingerprint (its tool and
input), not the file, and a file that changes after the approval is what
``fs.patch``'s ``expected_sha256`` and ``project.changeset``'s guard are for.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.fs import FsPatch, FsWrite
from corral.actors.tools.paths import check_write_scope
from corral.actors.tools.project import Changeset
from corral.actors.tools.staging import confined, open_to_read
from corral.core.redact import redact_text

#: A current file larger than this is not read for a diff (fs.write writes at most 512 KiB).
READ_BYTES = 1 << 20
#: Lines a side beyond which no diff is computed (difflib's time grows faster than linear).
MAX_LINES = 20_000
#: The files of one changeset diffed at most; the rest say so.
MAX_FILES = 20


@dataclass(frozen=True)
class Workspace:
    """Where an agent's file tools act: the run's workspace, write scopes and home."""

    root: Path
    write_scopes: tuple[str, ...]
    home: Path


@dataclass(frozen=True)
class FileChange:
    """One file an action would write: the masked diff, or why none is shown."""

    path: str
    diff: str = ""
    error: str = ""


class _NoDiff(Exception):
    """Why a file's diff is not shown (the tool would refuse, the file is too large)."""


#: The new bytes of one file, from its current bytes (None: no such file yet).
NewContent = Callable[[bytes | None], bytes]


def file_changes(tool: str, tool_input: Mapping[str, Any], where: Workspace | None) -> list[FileChange]:
    """The files ``tool`` would write with ``tool_input`` (the raw input, as the tool
    gets it), each as a masked diff against the file as it is now; [] for a tool
    that writes no file."""
    proposed = proposed_writes(tool, tool_input)
    if not proposed:
        return []
    if where is None:
        return [FileChange(_shown(path), error="the run names no workspace; no diff") for path, _ in proposed]
    changes = [_change(where, path, new) for path, new in proposed[:MAX_FILES]]
    changes += [
        FileChange(_shown(path), error=f"not diffed: only the first {MAX_FILES} files of a changeset are")
        for path, _ in proposed[MAX_FILES:]
    ]
    return changes


def proposed_writes(tool: str, tool_input: Mapping[str, Any]) -> list[tuple[str, NewContent]]:
    """Each file the built-in file tools would write, with how its new bytes follow
    from its current ones (the tools' own rules, checked here as they check them)."""
    path = tool_input.get("path")
    if tool == FsWrite.schema.name and isinstance(path, str) and isinstance(tool_input.get("content"), str):
        content = str(tool_input["content"]).encode()
        return [(path, lambda old: content)]
    if tool == FsPatch.schema.name and isinstance(path, str):
        return [(path, lambda old: _patched(old, tool_input))]
    if tool == Changeset.schema.name and isinstance(tool_input.get("changes"), list):
        return [
            (change["path"], _changeset_file(change))
            for change in tool_input["changes"]
            if isinstance(change, dict)
            and isinstance(change.get("path"), str)
            and isinstance(change.get("content"), str)
        ]
    return []


def write_targets(tool: str, tool_input: Mapping[str, Any]) -> list[str]:
    """Every path the built-in file tools would write, whatever the operation: a
    changeset's create, update (whole ``content`` or ``old_text``/``new_text``) and
    delete alike. The scope check (child_scope.py) judges these, not
    ``proposed_writes``, which lists only the files whose new bytes a diff can show."""
    path = tool_input.get("path")
    if tool in (FsWrite.schema.name, FsPatch.schema.name):
        return [path] if isinstance(path, str) else []
    if tool == Changeset.schema.name and isinstance(tool_input.get("changes"), list):
        return [
            change["path"]
            for change in tool_input["changes"]
            if isinstance(change, dict) and isinstance(change.get("path"), str)
        ]
    return []


def _patched(old: bytes | None, tool_input: Mapping[str, Any]) -> bytes:
    """fs.patch's result, or the reason it would refuse (it reads, checks the hash,
    then replaces exactly one occurrence)."""
    old_text, new_text = tool_input.get("old_text"), tool_input.get("new_text")
    if old is None:
        raise _NoDiff("no such file: the patch would be refused")
    if not isinstance(old_text, str) or not isinstance(new_text, str):
        raise _NoDiff("old_text and new_text must be strings: the patch would be refused")
    if hashlib.sha256(old).hexdigest() != tool_input.get("expected_sha256"):
        raise _NoDiff("the file changed since the agent read it (sha256 mismatch): the patch would be refused")
    text = old.decode(errors="replace")
    count = text.count(old_text)
    if count != 1:
        raise _NoDiff(f"old_text occurs {count} times in the file, not once: the patch would be refused")
    return text.replace(old_text, new_text).encode()


def _changeset_file(change: Mapping[str, Any]) -> NewContent:
    content = str(change["content"]).encode()
    expected = change.get("expected_sha256")

    def new(old: bytes | None) -> bytes:
        current = hashlib.sha256(old or b"").hexdigest()
        if expected and current != expected and current != hashlib.sha256(content).hexdigest():
            raise _NoDiff("the file changed since the agent read it (sha256 mismatch): the changeset would be refused")
        return content

    return new


def _change(where: Workspace, raw: str, new_content: NewContent) -> FileChange:
    shown = _shown(raw)
    try:
        old = _current(where, raw)
        new = new_content(old)
        return FileChange(shown, diff=unified_diff(shown, old, new))
    except ToolError as exc:
        return FileChange(shown, error=f"the tool would refuse this path: {redact_text(str(exc))}")
    except _NoDiff as exc:
        return FileChange(shown, error=str(exc))
    except OSError as exc:
        return FileChange(shown, error=f"the current file cannot be read: {exc.strerror or exc}")


def _current(where: Workspace, raw: str) -> bytes | None:
    """The file's bytes now, read as the tool reads them; None when there is none yet.
    Raises ToolError where the tool would refuse the path."""
    ctx = _read_context(where)
    target = confined(ctx, raw)
    check_write_scope(ctx.workspace, target, ctx.write_scopes, raw)
    if target.is_dir():
        raise _NoDiff("the path is a directory: the write would fail")
    try:
        fd = open_to_read(ctx, raw)
    except ToolError as exc:
        if exc.code == "not-found":
            return None
        raise
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(READ_BYTES + 1)
    if len(data) > READ_BYTES:
        raise _NoDiff(f"the current file is larger than {READ_BYTES} bytes: not diffed")
    return data


def _read_context(where: Workspace) -> ToolContext:
    """The context a file tool of this workspace runs with: its path rules follow from it."""
    return ToolContext(
        agent_id="",
        run_id="",
        action_id="",
        workspace=where.root,
        write_scopes=where.write_scopes,
        home=where.home,
    )


def unified_diff(path: str, old: bytes | None, new: bytes) -> str:
    """The masked unified diff of ``old`` (None: a new file) to ``new``; "" when equal."""
    if b"\x00" in new or (old is not None and b"\x00" in old):
        raise _NoDiff("binary content: not diffed")
    before = redact_text(old.decode(errors="replace")) if old is not None else ""
    after = redact_text(new.decode(errors="replace"))
    old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    if len(old_lines) > MAX_LINES or len(new_lines) > MAX_LINES:
        raise _NoDiff(f"more than {MAX_LINES} lines: not diffed")
    lines = difflib.unified_diff(
        old_lines, new_lines, "/dev/null" if old is None else f"a/{path}", f"b/{path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _shown(path: str) -> str:
    return redact_text(path)
