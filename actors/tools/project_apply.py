"""How project.changeset and project.restore change files: planned whole, checked
whole, checkpointed, then applied all together or rolled back.

A plan says, per file, its content before (None: absent) and after (None: delete).
``apply_plan``:

1. compares each file as it is now with the plan: already the ``after`` content
   (an earlier attempt of this action wrote it) means nothing to do; anything but
   the ``before`` content means someone else changed it, and nothing is written;
2. takes the checkpoint (project_checkpoints.py) of every ``before``;
3. stages every write (checked and written beside its target, fsync'd), then
   renames them all into place and removes the deleted files;
4. on a failure in step 3, puts back every file it changed from the ``before``
   bytes held in memory, and reports the failure.

The failpoint ``changeset.after-checkpoint`` lies between 2 and 3: an agent killed
there has a checkpoint and no change; the rerun (the tools are idempotent) finds
the same checkpoint and applies the plan once.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

from corral.actors.tools import fs
from corral.actors.tools import project_checkpoints as checkpoints
from corral.actors.tools.base import OUTCOME_UNKNOWN, ToolContext, ToolError
from corral.actors.tools.paths import check_write_scope
from corral.actors.tools.staging import open_existing_parent
from corral.core import failpoints

FAILPOINT = "changeset.after-checkpoint"
DELETES_FAILPOINT = "changeset.before-deletes"
ROLLBACK_FAILPOINT = "changeset.rollback"


@dataclass(frozen=True)
class Planned:
    raw: str
    operation: str
    before: bytes | None
    after: bytes | None


def current(ctx: ToolContext, raw: str) -> bytes | None:
    """The file's bytes as fs.read reads them, or None when there is none."""
    try:
        return fs.read_confined(ctx, raw)
    except ToolError as exc:
        if exc.code == "not-found":
            return None
        raise


def base(ctx: ToolContext, prior: checkpoints.Checkpoint | None, raw: str) -> bytes | None:
    """What a change of ``raw`` is planned against: the checkpoint an earlier attempt
    of this action took, else the file as it is now."""
    if prior is not None and raw in prior.files:
        return checkpoints.prior_content(ctx.home, prior, raw)
    return current(ctx, raw)


def check_writable(ctx: ToolContext, raw: str, *, delete: bool = False) -> None:
    """Inside the workspace and this agent's write scopes; a file to delete must be
    a plain file with no other name (checked again when it is removed)."""
    target = fs.confined(ctx, raw)
    check_write_scope(ctx.workspace, target, ctx.write_scopes, raw)
    if delete:
        try:
            info = target.lstat()
        except FileNotFoundError:
            return
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            raise ToolError(f"{raw!r} has {info.st_nlink} names (hard links); corral deletes no such file",
                            "path-refused")


def _delete(ctx: ToolContext, raw: str) -> None:
    target = fs.confined(ctx, raw)
    check_write_scope(ctx.workspace, target, ctx.write_scopes, raw)
    name, parent_fd = open_existing_parent(ctx, target, raw, ToolError(f"{raw!r} is the workspace", "bad-input"))
    try:
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{raw!r} is not a plain file", "path-refused")
        if info.st_nlink > 1:
            raise ToolError(f"{raw!r} has {info.st_nlink} names (hard links); corral deletes no such file",
                            "path-refused")
        os.unlink(name, dir_fd=parent_fd)
        os.fsync(parent_fd)
    finally:
        os.close(parent_fd)


def _put(ctx: ToolContext, raw: str, data: bytes | None) -> None:
    if data is None:
        _delete(ctx, raw)
    else:
        fs.commit_staged([fs.stage_write(ctx, raw, data)])


def _rollback(ctx: ToolContext, plan: list[Planned]) -> list[str]:
    """Every file of ``plan`` that holds its ``after`` content gets its ``before``
    back; the paths that could not be put back."""
    failed = []
    for item in plan:
        try:
            if current(ctx, item.raw) == item.after:
                failpoints.hit(ROLLBACK_FAILPOINT)
                _put(ctx, item.raw, item.before)
        except (OSError, ToolError, failpoints.FailpointError):  # an injected failure is an I/O failure here
            failed.append(item.raw)
    return failed


def apply_plan(ctx: ToolContext, plan: list[Planned], cp_id: str, tool: str) -> checkpoints.Checkpoint:
    """Apply ``plan`` after its checkpoint (see the module docstring); the checkpoint."""
    todo, checkpoint = checkpoint_plan(ctx, plan, cp_id, tool)
    write_plan(ctx, todo, cp_id)
    return checkpoint


def checkpoint_plan(ctx: ToolContext, plan: list[Planned], cp_id: str,
                    tool: str) -> tuple[list[Planned], checkpoints.Checkpoint]:
    """The changes still to make (each file checked unchanged since planning), after
    the checkpoint of the prior content is taken; nothing is written yet."""
    todo = []
    for item in plan:
        now = current(ctx, item.raw)
        if now == item.after:
            continue
        if now != item.before:
            shown = checkpoints.sha256(now) if now is not None else "absent"
            raise ToolError(f"{item.raw}: it changed while the change was planned (now {shown})", "stale-content")
        todo.append(item)
    checkpoint = checkpoints.take(ctx.home, cp_id, run_id=ctx.run_id, action_id=ctx.action_id, tool=tool,
                                  workspace=ctx.workspace, prior={item.raw: item.before for item in plan})
    return todo, checkpoint


def write_plan(ctx: ToolContext, todo: list[Planned], cp_id: str) -> None:
    """Make ``todo``'s changes together, or roll back what was written and fail."""
    failpoints.hit(FAILPOINT)
    staged: list[fs.Staged] = []
    try:
        for item in todo:
            if item.after is not None:
                staged.append(fs.stage_write(ctx, item.raw, item.after))
    except BaseException:
        fs.discard_staged(staged)
        raise
    try:
        fs.commit_staged(staged)
        failpoints.hit(DELETES_FAILPOINT)
        for item in todo:
            if item.after is None:
                _delete(ctx, item.raw)
    except (OSError, ToolError, failpoints.FailpointError) as exc:  # an injected failure is an I/O failure here
        left = _rollback(ctx, todo)
        why = exc if isinstance(exc, ToolError) else ToolError(f"{type(exc).__name__}: {exc}", "io-error")
        if left:
            # Seed 004 V1.3: "回滚不完整…都进入 needs-reconciliation": neither ok nor failed.
            raise ToolError(f"{why}; rolling back failed for {', '.join(left)}: checkpoint {cp_id} holds their"
                            " prior content", OUTCOME_UNKNOWN) from None
        raise ToolError(f"{why} (nothing was changed)", why.code) from None


def describe(plan: list[Planned]) -> list[dict[str, Any]]:
    """Per file: path, operation, hashes and size; never its content."""
    return [
        {
            "path": item.raw,
            "operation": item.operation,
            "sha256_before": checkpoints.sha256(item.before) if item.before is not None else None,
            "sha256_after": checkpoints.sha256(item.after) if item.after is not None else None,
            "bytes": len(item.after) if item.after is not None else 0,
        }
        for item in plan
    ]
