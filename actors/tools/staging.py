"""How the file tools put bytes on disk: confined, never through another name, never
making or changing a git control entry.

A write is staged, then committed (project.changeset stages several and commits
them all or none):

- the path is checked (workspace, write scopes, control and secret names, then the
  tree as it is: corral.sandbox.control_paths.ControlScan.reason);
- the parent is walked one directory at a time with O_NOFOLLOW, and at each level the
  directory must not be a gitdir a ``.git`` file names (by inode) and must not have,
  or get by the next name, the shape of a repository;
- the bytes go to a fresh temporary file: O_CREAT|O_EXCL|O_NOFOLLOW and a random
  name, so no pre-planted name (a hard link to a hook, a symlink) can receive them;
- the commit renames it over the target, after checking again, under a lock on the
  workspace, that the whole batch makes no repository shape.

Every check and the change it guards happen under one ``flock`` of the workspace
root, so two agents cannot each add half of a repository shape.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.paths import check_write_scope, resolve_in_workspace
from corral.sandbox.control_paths import ControlPathError, Inode, scan_controls, write_refusal
from corral.sandbox.git_shapes import has_repository_shape

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: Room left for the random part of a temporary name (names are at most 255 bytes).
_TMP_STEM = 120


def _refuse(message: str) -> ToolError:
    return ToolError(message, "path-refused")


def confined(ctx: ToolContext, raw: str) -> Path:
    return resolve_in_workspace(ctx.workspace, raw, forbidden=(ctx.home,))


@dataclass(frozen=True)
class _Guard:
    """What the directory walk checks at each level (see the module docstring)."""

    raw: str
    gitdir_inodes: frozenset[Inode]

    def check(self, fd: int, next_name: str, shown: str) -> None:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) in self.gitdir_inodes:
            raise _refuse(f"path {self.raw!r}: {shown} is a git directory a .git file names")
        if has_repository_shape([*os.listdir(fd), next_name]):
            raise _refuse(
                f"path {self.raw!r}: {shown} has, or would get, the shape of a git repository"
                " (HEAD with objects and refs, or with commondir); git would run its hooks and config"
            )


def _open_parent(
    root: Path,
    parent: PurePosixPath,
    raw: str,
    *,
    guard: _Guard | None = None,
    created: list[tuple[int, str]] | None = None,
    create: bool = True,
) -> int:
    """An fd of ``root/parent``, walked one directory at a time with O_NOFOLLOW
    (creating what is missing, when ``create``; each one made is recorded in
    ``created`` as (a dup of its parent's fd, name)), so no symlink swapped in after
    the path check can take the write elsewhere: not out of the workspace, not into
    ``.git``. ``guard`` checks each level before the walk goes on from it."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for depth, part in enumerate(parent.parts):
            if guard is not None:
                guard.check(fd, part, "/".join(parent.parts[:depth]) or "the workspace root")
            try:
                child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise ToolError(f"no file {raw!r}", "not-found") from None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if created is not None:
                        created.append((os.dup(fd), part))
                except FileExistsError:
                    pass  # another writer (a sibling child, say) made it meanwhile: open it, checked
                child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except (NotADirectoryError, OSError) as exc:
                why = f"{raw!r}: {part!r} is not a plain directory ({exc.strerror})"
                raise ToolError(why, "path-refused") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def _workspace_lock(root: Path) -> Iterator[None]:
    """Exclusive among the file tools of every agent on this workspace (flock is per
    open file, so it holds across processes); held only for a check and its change."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@dataclass
class Staged:
    """A file written next to its target, fsync'd, not yet renamed."""

    root: Path
    parent_fd: int
    tmp: str
    name: str
    raw: str
    #: Directories the staging made, as (a dup of their parent's fd, name), to remove
    #: again if the write does not happen.
    created: list[tuple[int, str]] = field(default_factory=list)


def _refuse_other_names(parent_fd: int, name: str, raw: str) -> None:
    """A target that has another name (a hard link) is not written. The rename below
    would leave the other name's bytes alone, but every such write is refused anyway:
    the other names may lie where no walk can see them (outside the workspace), so
    whether one of them is a hook, a config or a secret cannot be known; replacing
    the file would silently split it from them (a pnpm store, a ``cp -al`` snapshot);
    and a patch or a changeset would first read it, and answer questions about
    bytes that may be a secret. A clear refusal is right whatever the other names are."""
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{raw!r} is a directory", "bad-input")
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise _refuse(
            f"path {raw!r} has {info.st_nlink} names (hard links); corral writes no file that has another name"
            " (copy it to a file of its own first)"
        )


def _write_temp(parent_fd: int, name: str, data: bytes) -> str:
    """A new file beside ``name`` holding ``data``, fsync'd; its name. O_EXCL with a
    random name: a name planted in advance (a hard link to a hook, a symlink) is never
    opened, it is a collision and another name is drawn. The mode is a fresh 0644:
    nothing (an exec bit) is copied from whatever the target was."""
    stem = name.encode()[:_TMP_STEM].decode(errors="ignore")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(8):
        tmp = f".{stem}.{secrets.token_hex(8)}.corral-tmp"
        try:
            fd = os.open(tmp, flags, 0o644, dir_fd=parent_fd)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            _unlink(parent_fd, tmp)
            raise
        return tmp
    raise ToolError(f"could not make a temporary file beside {name!r}", "io-error")


def _unlink(parent_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=parent_fd)
    except OSError:
        pass


def _remove_created(created: list[tuple[int, str]]) -> None:
    for parent_fd, name in reversed(created):
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except OSError:
            pass  # not empty: another writer put something there meanwhile; theirs now
        os.close(parent_fd)
    created.clear()


def _guard(root: Path, inside: PurePosixPath, raw: str) -> _Guard:
    """Check the target against the tree as it is (one walk) and return the guard
    for the directory walk."""
    refused = write_refusal(inside.parts)
    try:
        scan = scan_controls(root)
        refused = refused or scan.reason(inside)
    except ControlPathError as exc:
        raise _refuse(str(exc)) from None
    if refused is not None:
        raise _refuse(f"path {raw!r}: {refused}")
    # The root itself may be a pointer's target only if it has a repository shape,
    # which the guard checks anyway (see ControlScan.reason).
    root_info = root.stat()
    inodes = scan.gitdir_target_inodes() - {(root_info.st_dev, root_info.st_ino)}
    return _Guard(raw, frozenset(inodes))


def stage_write(ctx: ToolContext, raw: str, data: bytes) -> Staged:
    """Check ``raw`` (workspace, write scopes, control entries, no symlink on the
    way) and write ``data`` beside it; ``commit_staged`` renames it into place.
    Several staged files make an all-or-nothing changeset (project.changeset)."""
    target = confined(ctx, raw)
    check_write_scope(ctx.workspace, target, ctx.write_scopes, raw)
    if target.is_dir():
        raise ToolError(f"{raw!r} is a directory", "bad-input")
    root = ctx.workspace.resolve()
    inside = PurePosixPath(target.relative_to(root))
    guard = _guard(root, inside, raw)
    created: list[tuple[int, str]] = []
    with _workspace_lock(root):
        try:
            parent_fd = _open_parent(root, inside.parent, raw, guard=guard, created=created)
        except BaseException:
            _remove_created(created)
            raise
        try:
            guard.check(parent_fd, inside.name, str(inside.parent) if inside.parent.parts else "the workspace root")
            _refuse_other_names(parent_fd, inside.name, raw)
            tmp = _write_temp(parent_fd, inside.name, data)
        except BaseException:
            os.close(parent_fd)
            _remove_created(created)
            raise
    return Staged(root, parent_fd, tmp, inside.name, raw, created)


def _recheck(staged: list[Staged]) -> None:
    """Under the lock, just before the renames: the batch as a whole (with what other
    agents did since it was staged) makes no repository shape and writes no file
    that has gained another name."""
    names: dict[Inode, tuple[int, list[str]]] = {}
    for item in staged:
        info = os.fstat(item.parent_fd)
        names.setdefault((info.st_dev, info.st_ino), (item.parent_fd, []))[1].append(item.name)
        _refuse_other_names(item.parent_fd, item.name, item.raw)
    for parent_fd, new in names.values():
        if has_repository_shape([*os.listdir(parent_fd), *new]):
            raise _refuse(
                f"these writes would give a directory the shape of a git repository ({', '.join(sorted(new))}"
                " with what is there); git would run its hooks and config"
            )


def commit_staged(staged: list[Staged]) -> None:
    if not staged:
        return
    try:
        with _workspace_lock(staged[0].root):
            _recheck(staged)
            for item in staged:
                os.replace(item.tmp, item.name, src_dir_fd=item.parent_fd, dst_dir_fd=item.parent_fd)
                os.fsync(item.parent_fd)
    except BaseException:
        discard_staged(staged)
        raise
    for item in staged:
        _close(item)


def discard_staged(staged: list[Staged]) -> None:
    """Remove what staging made (the temporary files, then the directories it made)."""
    for item in staged:
        _unlink(item.parent_fd, item.tmp)
    for item in reversed(staged):
        _remove_created(item.created)
        _close(item)


def _close(item: Staged) -> None:
    if item.parent_fd >= 0:
        os.close(item.parent_fd)
        item.parent_fd = -1
    for parent_fd, _ in item.created:
        os.close(parent_fd)
    item.created.clear()


def open_existing_parent(ctx: ToolContext, target: Path, raw: str, is_workspace: ToolError) -> tuple[str, int]:
    """The last name of ``target`` (a checked path inside the workspace) and an fd of
    its existing parent, opened without following a symlink at any level; the
    caller closes it. ``is_workspace`` is raised when ``target`` is the workspace."""
    root = ctx.workspace.resolve()
    inside = PurePosixPath(target.relative_to(root))
    if not inside.parts:
        raise is_workspace
    return inside.name, _open_parent(root, inside.parent, raw, create=False)


def open_to_read(ctx: ToolContext, raw: str) -> int:
    """An fd of the regular file ``raw``, opened without following a symlink at any
    level (the path check and the open are separate moments). A file with another
    name is refused if that name is a secret or a git control file: secrets are
    recognised by inode as well as by name (a hard link ``innocent.txt`` to ``.env``
    is ``.env``)."""
    name, parent_fd = open_existing_parent(ctx, confined(ctx, raw), raw, ToolError(f"no file {raw!r}", "not-found"))
    try:
        # O_NONBLOCK: a FIFO must not hang the actor; a regular file ignores it.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent_fd)
    except FileNotFoundError:
        raise ToolError(f"no file {raw!r}", "not-found") from None
    except OSError as exc:
        raise _refuse(f"path {raw!r} cannot be opened as a plain file ({exc.strerror})") from None
    finally:
        os.close(parent_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"no file {raw!r}", "not-found")
        if info.st_nlink > 1:
            _refuse_secret_inode(ctx.workspace.resolve(), (info.st_dev, info.st_ino), raw)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_secret_inode(root: Path, inode: Inode, raw: str) -> None:
    # Paid only for a file with another name: one walk of the workspace.
    try:
        scan = scan_controls(root)
    except ControlPathError as exc:
        raise _refuse(str(exc)) from None
    if inode in scan.secret_inodes:
        raise _refuse(f"path {raw!r} is another name (a hard link) of a secrets file")
    if inode in scan.control_inodes():
        raise _refuse(f"path {raw!r} is another name (a hard link) of a file in a git control entry")
