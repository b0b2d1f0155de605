"""Opening a directory level by level, following no symlink (seed 004 V1.1 §2: "Runner
lock、Agent lane lock 和项目 execution-owner 均拒绝符号链接…Unix 通过 openat 逐级无跟随打开").

One mechanism for the home (supervisor/home/home_dir.py) and the project owners'
directory (supervisor/home/project_lock.py): from a trusted start, every level below
it is opened with ``openat`` and ``O_NOFOLLOW``, so no level, checked once and swapped
for a link afterwards, leads elsewhere. A path's own text is compared first: ``..`` or
``.`` would make its levels mean something other than what a reader sees.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from corral.supervisor.home.home_errors import HomeError

_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_levels(path: Path, start: Path, *, what: str, make: int | None = None) -> int:
    """The directory ``path`` opened below ``start`` (itself trusted, opened as named),
    each level without following a symlink; a missing level is made with mode ``make``
    (None: ``FileNotFoundError``). ``HomeError`` names the level that is a symlink or
    not a directory; ``what`` names the directory (``home``, ``the project owners'
    directory``). The caller closes the descriptor."""
    relative = path.relative_to(start)
    if any(part in ("..", ".") for part in relative.parts):
        raise HomeError(f"{what} {path} cannot be used: give it without '.' or '..' levels")
    try:
        fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise HomeError(f"{what} {path} cannot be used: {start}: {exc.strerror}") from None
    here = start
    for part in relative.parts:
        here = here / part
        try:
            if make is not None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, make, dir_fd=fd)
            child = os.open(part, _OPEN, dir_fd=fd)
        except FileNotFoundError:
            os.close(fd)
            raise
        except OSError as exc:
            why = _why(fd, part, exc)
            os.close(fd)
            raise HomeError(f"{what} {path} cannot be used: {here} is {why}") from None
        os.close(fd)
        fd = child
    return fd


def _why(parent: int, part: str, exc: OSError) -> str:
    """What a level that did not open is: a symlink (refused whatever it points at), or
    not a directory, or the system's reason."""
    with contextlib.suppress(OSError):
        mode = os.stat(part, dir_fd=parent, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            return "a symlink (refusing to follow it: give the real path)"
        if not stat.S_ISDIR(mode):
            return "not a directory"
    if exc.errno == errno.ELOOP:
        return "a symlink (refusing to follow it: give the real path)"
    return exc.strerror or "unusable"
