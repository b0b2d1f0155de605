"""Taking a git control entry out of a project tree (the tree guard's verdicts,
sandbox/tree_guard.py), without ever destroying a person's repository.

An entry judged new is *moved*, not deleted: into ``<home>/quarantine/<UTC time>-
<random>/<its path in the project>`` (directories 0700), corral's home being the
launcher's private directory that no sandbox sees. The check cannot tell a command's
``git init`` from the user's own (run in the tree while a command ran, or between a
launcher's death and the check that catches it up), so nothing it takes is lost: the
report says where each entry went, and moving it back restores it.

When the home is on another file system (``rename`` fails with EXDEV):

* after a live, observed command (``live``), the entry is deleted, as it was before
  quarantine existed: it was made while that command ran;
* when catching up a dead launcher (not ``live``), the window is long and the entry
  may be the user's, so it stays where it is, defused: renamed in its own directory
  to ``<name>.corral-quarantined-<random>``, and inside a directory every name that
  makes or feeds a repository (``HEAD``, ``config``, ``commondir``, ``gitdir``,
  ``.git``, driver files) renamed the same way, so git no longer takes it for one.

With no home (a bare SandboxProfile), entries are deleted.

Every parent is opened with ``O_NOFOLLOW`` from the root, and an entry is taken only
if it still has the inode the walk saw; a moved entry is checked again at its
destination.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from corral.sandbox.git_shapes import DOTGIT_NAMES, DRIVER_FILES, fold_name

#: Inside corral's home.
QUARANTINE_DIR = "quarantine"
#: What a defused entry's name gets (and a random part).
DEFUSED = ".corral-quarantined"
#: Names that make a directory a repository to git, or feed one (folded).
_REPOSITORY_NAMES: frozenset[str] = frozenset({"head", "config", "commondir", "gitdir"}) | DOTGIT_NAMES | DRIVER_FILES

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: An inode: (st_dev, st_ino).
Inode = tuple[int, int]


class Moved(Exception):
    """The entry is no longer the one the walk saw."""


@dataclass
class Removal:
    """Where one enforce puts what it takes (see the module docstring)."""

    #: corral's home (the launcher's private directory); None: entries are deleted.
    home: Path | None
    #: After a live, observed command (False: catching up a dead launcher).
    live: bool
    #: ``<home>/quarantine/<stamp>``, made at the first entry moved.
    where: Path | None = field(default=None, init=False)

    def take(self, root: Path, rel: str, inode: Inode) -> str | None:
        """Take ``root/rel`` (which must still be ``inode``) out of the project.
        Returns where it is now (a path to restore it from), or None if deleted."""
        if not rel:
            raise Moved("the project root itself is never removed")
        with _parent_fd(root, rel) as (fd, name):
            info = _check_same(fd, name, inode)
            if self.home is not None:
                try:
                    return self._quarantine(fd, name, rel, inode)
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                if not self.live:
                    return _defuse(root, fd, name, rel, inode, stat.S_ISDIR(info.st_mode))
            _delete(fd, name, stat.S_ISDIR(info.st_mode))
            return None

    def _quarantine(self, fd: int, name: str, rel: str, inode: Inode) -> str:
        if os.stat(self.home or "/", follow_symlinks=False).st_dev != inode[0]:
            raise OSError(errno.EXDEV, "another file system")  # nothing made in the home for nothing
        parent = self._where_fd(rel.split("/")[:-1])
        try:
            os.rename(name, name, src_dir_fd=fd, dst_dir_fd=parent)
            moved = os.stat(name, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
        assert self.where is not None
        dest = str(self.where / rel)
        if (moved.st_dev, moved.st_ino) != inode:
            raise Moved(f"it changed since the check; what was there is now in {dest}")
        return dest

    def _where_fd(self, parents: list[str]) -> int:
        """The quarantine directory for an entry under ``parents``, made (0700) as needed."""
        assert self.home is not None
        fd = os.open(self.home, _DIR_FLAGS)
        try:
            if self.where is None:
                fd = _subdir(fd, QUARANTINE_DIR)
                stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)
                os.mkdir(stamp, 0o700, dir_fd=fd)  # fails if it exists: never shared
                self.where = self.home / QUARANTINE_DIR / stamp
                fd = _subdir(fd, stamp)
            else:
                fd = _subdir(_subdir(fd, QUARANTINE_DIR), self.where.name)
            for part in parents:
                fd = _subdir(fd, part)
            return fd
        except BaseException:
            os.close(fd)
            raise


def _subdir(fd: int, name: str) -> int:
    """Open (making it 0700 if missing) ``name`` in ``fd``, and close ``fd``."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=fd)
        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    info = os.fstat(child)
    if info.st_uid != os.geteuid():
        os.close(child)
        raise PermissionError(errno.EACCES, f"{name} in the quarantine is not this user's")
    return child


def _defuse(root: Path, fd: int, name: str, rel: str, inode: Inode, is_dir: bool) -> str:
    token = secrets.token_hex(4)
    new = f"{name}{DEFUSED}-{token}"
    os.rename(name, new, src_dir_fd=fd, dst_dir_fd=fd)
    if _inode(os.stat(new, dir_fd=fd, follow_symlinks=False)) != inode:
        raise Moved(f"it changed since the check; what was there is now {new}")
    if is_dir:
        _grant_owner(fd, new)
        top = os.open(new, _DIR_FLAGS, dir_fd=fd)
        try:
            for _path, dirnames, filenames, dir_fd in os.fwalk(dir_fd=top, follow_symlinks=False):
                for names in (dirnames, filenames):
                    for index, entry in enumerate(names):
                        if fold_name(entry) in _REPOSITORY_NAMES:
                            renamed = f"{entry}{DEFUSED}-{token}"
                            os.rename(entry, renamed, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                            names[index] = renamed  # fwalk descends by these names
        finally:
            os.close(top)
    parent = rel.rpartition("/")[0]
    return str(root / parent / new) if parent else str(root / new)


def _inode(info: os.stat_result) -> Inode:
    return info.st_dev, info.st_ino


@contextlib.contextmanager
def _parent_fd(root: Path, rel: str) -> Iterator[tuple[int, str]]:
    """The directory holding ``root/rel``, opened component by component without
    following a symlink, and the entry's name in it."""
    parts = rel.split("/")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _check_same(fd: int, name: str, inode: Inode) -> os.stat_result:
    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if _inode(info) != inode:
        raise Moved("it changed since the check")
    return info


def _delete(fd: int, name: str, is_dir: bool) -> None:
    if not is_dir:
        os.unlink(name, dir_fd=fd)
        return
    try:
        shutil.rmtree(name, dir_fd=fd)
    except PermissionError:
        # A subdirectory the command made unreadable: give the owner its rights back.
        _grant_owner(fd, name)
        shutil.rmtree(name, dir_fd=fd)


def _grant_owner(parent_fd: int, name: str) -> None:
    top = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        os.chmod(top, stat.S_IRWXU)
        for _dirpath, dirnames, _files, dirfd in os.fwalk(dir_fd=top, follow_symlinks=False):
            for sub in dirnames:
                info = os.stat(sub, dir_fd=dirfd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
                    os.chmod(sub, stat.S_IMODE(info.st_mode) | stat.S_IRWXU, dir_fd=dirfd)
    finally:
        os.close(top)
