"""What git treats as a repository, so nothing an agent does can make or change one.

Git runs programs named in a repository's files (hooks, ``core.fsmonitor``, diff and
filter drivers, ...), with the rights of whoever runs git. It finds a repository in
three ways (git's setup.c: ``setup_git_directory_gently_1``, ``is_git_directory``,
``read_gitfile_gently``):

- a ``.git`` entry at some level of a path: a directory, a symlink to one, or a file
  ``gitdir: <path>`` naming the directory elsewhere (a worktree, a submodule);
- the level itself, if it has the shape of a repository (a bare repository);
- a directory named by a ``commondir`` file of such a shape (a worktree's gitdir keeps
  its objects, refs, config and hooks in the main repository).

A repository shape is ``HEAD`` with ``objects`` and ``refs``, or ``HEAD`` with
``commondir``: that is what ``is_git_directory`` checks (a ``config`` is not needed:
hooks run without one). Git also validates HEAD's content; any entry named HEAD
counts here, so a shape is refused before it is valid.

Names are folded the way git folds them on case-insensitive and NTFS/HFS+ volumes
(``is_ntfs_dotgit``, ``is_hfs_dotgit``): ``.GIT``, ``.git.``, ``.g\\u200cit`` and
``git~1`` are all ``.git`` there. Folding costs nothing on Linux and keeps a
workspace on such a mount safe.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

#: Code points HFS+ ignores when it compares names (git's is_hfs_dotgit skips them).
_HFS_IGNORABLE: dict[int, None] = dict.fromkeys(
    [0x200C, 0x200D, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, *range(0x206A, 0x2070), 0xFEFF]
)

#: ``.git`` as git spells it on every volume it knows (``git~1``: the NTFS short name).
DOTGIT_NAMES: frozenset[str] = frozenset({".git", "git~1"})

#: Files of the work tree that name programs or fetch code: ``.gitattributes`` picks
#: filter/diff/merge drivers, ``.gitmodules`` submodule URLs and update commands.
DRIVER_FILES: frozenset[str] = frozenset({".gitattributes", ".gitmodules"})

#: Entries of a repository shape (folded names).
_HEAD = "head"
_FULL_SHAPE = frozenset({"objects", "refs"})
_COMMONDIR = "commondir"

#: Read no more of a ``.git`` or ``commondir`` file than a path can take.
_POINTER_LIMIT = 4096 + 16


def fold_name(name: str) -> str:
    """``name`` as a case-insensitive NTFS or HFS+ volume compares it: without the
    code points HFS+ ignores, without an NTFS stream suffix (``:...``) or trailing
    dots and spaces, case-folded."""
    if name.isascii() and ":" not in name and not name.endswith((".", " ")):
        return name.lower()  # the common case, and the cheap one: the walk folds every name
    return name.translate(_HFS_IGNORABLE).split(":", 1)[0].rstrip(". ").casefold()


def is_dotgit(name: str) -> bool:
    return fold_name(name) in DOTGIT_NAMES


def is_driver_file(name: str) -> bool:
    return fold_name(name) in DRIVER_FILES


def has_repository_shape(names: Iterable[str]) -> bool:
    """Whether a directory with these entries is a repository to git (see the module
    docstring). Call it with the entries plus one to be created to ask whether
    creating it would make one."""
    folded = {fold_name(name) for name in names}
    return _HEAD in folded and (folded >= _FULL_SHAPE or _COMMONDIR in folded)


def _read_pointer(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not _is_regular(fd):
            return None  # a FIFO or a device named `.git` must not hang or feed the walk
        data = os.read(fd, _POINTER_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)
    first = data.split(b"\n", 1)[0].rstrip(b"\r \t")
    return first.decode(errors="surrogateescape") if first else None


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def gitdir_target(gitfile: Path) -> Path | None:
    """The directory a ``.git`` *file* names (``gitdir: <path>``, relative to the
    file's directory), resolved; None if it names none. Git accepts only the exact
    prefix ``gitdir: ``; any letter case and spacing is accepted here, to err on the
    side of protecting."""
    line = _read_pointer(gitfile)
    if line is None or line[:7].lower() != "gitdir:":
        return None
    named = line[7:].strip()
    return (gitfile.parent / named).resolve() if named else None


def commondir_target(gitdir: Path) -> Path | None:
    """The main repository a worktree's gitdir shares (its ``commondir`` file), resolved."""
    line = _read_pointer(gitdir / "commondir")
    if line is None or not line.strip():
        return None
    return (gitdir / line.strip()).resolve()
