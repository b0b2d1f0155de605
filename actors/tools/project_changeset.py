"""``project.changeset`` (seed 004 V1.3): several file changes, atomically.

Each change is an operation on one file:

* ``create``: ``content``; the file must not exist;
* ``update``: either the whole ``content`` with ``expected_sha256``, or
  ``old_text``/``new_text`` with ``expected_replacements`` (the number of
  occurrences of ``old_text`` must be exactly that; 1 when not given;
  ``expected_sha256`` is checked when given);
* ``delete``: ``expected_sha256``;
* no ``operation`` (the first form): ``content``, with ``expected_sha256`` to insist
  on the current content; it creates or replaces the file.

Every change is checked before anything is written (paths, write scopes, the
expected content, the counts, at most 12 distinct files and 256 KiB of text in
all). Then a checkpoint of the prior content is taken and the files are changed
together, or not at all (project_apply.py). The output is the review: per file
the operation, the SHA-256 before and after and a diff; the receipt's summary
holds counts and the checkpoint id, never a file's content. A crash while it is
executing is never replayed: the action waits for a person's reconciliation,
with the checkpoint to check against (seed 004 V1.3).
"""

from __future__ import annotations

import difflib
import unicodedata
from collections import Counter
from typing import Any, Literal, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.tools import project_apply as apply
from corral.actors.tools import project_checkpoints as checkpoints
from corral.actors.tools.base import ASKS_A_PERSON, ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.fs import SOURCES_CHANGED
from corral.actors.tools.project_common import MAX_DIFF_CHARS, MAX_FILE_BYTES, sha256, target
from corral.core.path_scrub import scrub_paths
from corral.core.redact import redact_text
from corral.mailbox.protocol import ProjectRevisionAdvance

#: The seed's bounds of one changeset: distinct files, and text given in all.
MAX_CHANGES = 12
MAX_INPUT_BYTES = 256 * 1024


class Change(TypedDict):
    path: str
    operation: NotRequired[Literal["create", "update", "delete"]]
    content: NotRequired[str]
    expected_sha256: NotRequired[str]
    old_text: NotRequired[str]
    new_text: NotRequired[str]
    expected_replacements: NotRequired[int]


class ChangesetArgs(TypedDict):
    changes: list[Change]


def _bad(name: str, message: str, code: str = "bad-changeset") -> ToolError:
    return ToolError(f"{name}: {message}", code)


def _check_expected(name: str, data: bytes, expected: str) -> None:
    if sha256(data) != expected:
        raise _bad(name, f"its content changed since you read it (sha256 {sha256(data)})", "stale-content")


def _replaced(name: str, old: bytes, change: Change) -> bytes:
    old_text, new_text = change.get("old_text"), change.get("new_text")
    if not old_text or new_text is None:
        raise _bad(name, "an edit gives a non-empty old_text and a new_text")
    wanted = change.get("expected_replacements", 1)
    if wanted < 1:
        raise _bad(name, "expected_replacements is at least 1")
    try:
        text = old.decode()
    except UnicodeDecodeError:
        raise _bad(name, "not a UTF-8 text file; give its whole content instead") from None
    found = text.count(old_text)
    if found != wanted:
        raise _bad(name, f"old_text occurs {found} times, expected_replacements is {wanted}; nothing was changed",
                   "replacements-mismatch")
    return text.replace(old_text, new_text).encode()


def new_content(change: Change, old: bytes | None) -> tuple[str, bytes | None]:
    """The operation's name and the file's new content (None: deleted), from its
    content ``old`` (None: absent); a ToolError if the change does not apply."""
    name, operation = change["path"], change.get("operation")
    has_content = "content" in change
    has_edit = any(key in change for key in ("old_text", "new_text", "expected_replacements"))
    expected = change.get("expected_sha256")
    if operation == "delete":
        if has_content or has_edit or not expected:
            raise _bad(name, "a delete takes expected_sha256 and nothing else")
        if old is None:
            raise _bad(name, "no such file to delete", "not-found")
        _check_expected(name, old, expected)
        return "delete", None
    if operation == "create":
        if not has_content or has_edit or expected:
            raise _bad(name, "a create takes content and nothing else")
        if old is not None:
            raise _bad(name, "the file exists already; update it with its expected_sha256", "exists")
        return "create", change["content"].encode()
    if operation == "update":
        if old is None:
            raise _bad(name, "no such file to update (create it)", "not-found")
        if has_content == has_edit:
            raise _bad(name, "an update gives either content or old_text/new_text")
        if has_content and not expected:
            raise _bad(name, "an update of the whole content needs expected_sha256")
        if expected:
            _check_expected(name, old, expected)
        return "update", change["content"].encode() if has_content else _replaced(name, old, change)
    if not has_content or has_edit:
        raise _bad(name, "give an operation (create, update, delete), or the whole content")
    content = change["content"].encode()
    if expected and sha256(old or b"") != expected and old != content:
        raise _bad(name, f"its content changed since you read it (sha256 {sha256(old or b'')})", "stale-content")
    return ("create" if old is None else "update"), content


def _check_bounds(changes: list[Change]) -> None:
    if not 0 < len(changes) <= MAX_CHANGES:
        raise ToolError(f"a changeset holds 1 to {MAX_CHANGES} files (it has {len(changes)})", "bad-changeset")
    given = sum(len((change.get("content", "") + change.get("old_text", "") + change.get("new_text", "")).encode())
                for change in changes)
    if given > MAX_INPUT_BYTES:
        raise ToolError(f"a changeset gives at most {MAX_INPUT_BYTES} bytes of text (it gives {given})",
                        "too-big")


def _portable_key(relative: str) -> str:
    """Two names one file system could take for the same file (case, Unicode forms)."""
    return unicodedata.normalize("NFKC", relative).casefold()


def plan(ctx: ToolContext, changes: list[Change], prior: checkpoints.Checkpoint | None) -> list[apply.Planned]:
    """Every change checked (paths, scopes, content, counts) and planned; nothing written."""
    _check_bounds(changes)
    root = ctx.workspace.resolve()
    keys: Counter[str] = Counter()
    planned = []
    for change in changes:
        raw = change["path"]
        keys[_portable_key(target(ctx, raw).relative_to(root).as_posix())] += 1
        apply.check_writable(ctx, raw, delete=change.get("operation") == "delete")
        old = apply.base(ctx, prior, raw)
        operation, new = new_content(change, old)
        if new is not None and len(new) > MAX_FILE_BYTES:
            raise _bad(raw, f"over {MAX_FILE_BYTES} bytes once changed", "too-big")
        planned.append(apply.Planned(raw, operation, old, new))
    if any(count > 1 for count in keys.values()):
        raise ToolError("a changeset names each file once (names that differ only in case or Unicode form"
                        " are the same file on some systems)", "bad-changeset")
    return planned


def _diff(item: apply.Planned, limit: int, roots: tuple[str, ...]) -> str:
    def lines(data: bytes | None) -> list[str]:
        # As project.diff shows a diff: no secret, no absolute path (seed 004 V1.3).
        text = redact_text((data or b"").decode(errors="replace"))
        return scrub_paths(text, roots).splitlines(keepends=True)

    text = "".join(difflib.unified_diff(lines(item.before), lines(item.after), f"a/{item.raw}", f"b/{item.raw}"))
    return text if len(text) <= limit else text[:limit] + "\n[diff truncated]\n"


class Changeset:
    default_policy = ASKS_A_PERSON
    schema = schema(
        "project.changeset",
        "Change up to 12 files at once, atomically (all or nothing), after an automatic checkpoint. Each change"
        " has an operation: create (content; the file must not exist), update (content with expected_sha256, or"
        " old_text/new_text with expected_replacements, the exact number of occurrences), delete"
        " (expected_sha256). Returns the review (a diff and hashes per file) and the checkpoint id, for"
        " project.diff and project.restore. After it succeeds, review the whole change with"
        " project.diff(since_checkpoint=<its checkpoint>, include_content=true) before you run a verifying command.",
        ChangesetArgs,
        read_only=False,
        # Seed 004 V1.3: "Runner 在 executing 阶段退出仍不得自动重放，checkpoint 是人工核对和恢复依据":
        # a crash after ``executing`` leaves it for a person (needs-reconciliation), with
        # its checkpoint; it is never run again on its own.
        effect="external",
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        name = self.schema.name
        cp_id = checkpoints.checkpoint_id(ctx.run_id, ctx.action_id, name, tool_input)

        def prepare() -> tuple[list[apply.Planned], list[apply.Planned], checkpoints.Checkpoint]:
            planned = plan(ctx, tool_input["changes"], checkpoints.find(ctx.home, cp_id))
            return planned, *apply.checkpoint_plan(ctx, planned, cp_id, name)

        planned, todo, checkpoint = await trio.to_thread.run_sync(prepare)
        # Seed 004 V1.3: the one project revision, made after the checkpoint and before
        # the first write, and kept whatever the apply comes to (a full rollback too).
        revision = (await ctx.ask(ProjectRevisionAdvance(run_id=ctx.run_id, action_id=ctx.action_id))).revision
        await trio.to_thread.run_sync(apply.write_plan, ctx, todo, cp_id)
        review = apply.describe(planned)
        roots = (str(ctx.workspace), str(ctx.workspace.resolve()))
        for entry, item in zip(review, planned, strict=True):
            entry["diff"] = _diff(item, MAX_DIFF_CHARS // len(planned), roots)
        counts = Counter(item.operation for item in planned)
        done = ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
        output = {"files": review, "checkpoint": checkpoint.id, "revision": revision, SOURCES_CHANGED: True}
        return ToolResult(True, output,
                          f"changeset of {len(planned)} files applied ({done}); checkpoint {checkpoint.id}")
