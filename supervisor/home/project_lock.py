"""One supervisor owns a project (seed 004 V1.1 §2: the project's execution owner is
a cross-process lock of the project, not of the home).

Two homes on one project root would each keep their own project revision and
verification for the same files: a verification from one could gate a commit
while the other changed the sources. So ``corral up`` takes an exclusive ``flock``,
held for the supervisor's life and released by the kernel when it dies.

The lock is a file outside the project, in the user's state directory, named by the
project root directory's device and inode: two homes on one project meet there
whatever path each was given. Not a file inside the workspace, which the model could
remove or replace. Not the project directory itself either, whose ``flock`` the file
tools take for every staged write (actors/tools/staging.py). The file also holds
the owner's home and pid, so a refused second supervisor can name it.

A node of a PostgreSQL cluster takes no project lock: there the partition leases
of the shared ledger decide who drives which run, and an adopting node runs the
adopted partition's spec, on the same project root, beside its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path

from corral.supervisor.home.home_dir import HomeBusy


def owners_dir() -> Path:
    """Where owner records live: ``$XDG_STATE_HOME/corral/project-owners`` (per user)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "corral" / "project-owners"


class ProjectBusy(HomeBusy):
    """Another supervisor owns the project root."""


class ProjectLock:
    """The exclusive lock on one project root, for one supervisor's life."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root = root
        self.home = home
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise ProjectBusy naming the owner."""
        # The root was resolved by the spec: a symlink here now is a swap, refused.
        directory = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            info = os.fstat(directory)
        finally:
            os.close(directory)
        key = hashlib.sha256(f"{info.st_dev}:{info.st_ino}".encode()).hexdigest()[:32]
        owners = owners_dir()
        owners.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(owners / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise ProjectBusy(
                f"another supervisor{owner} owns the project {self.root}: one supervisor drives a project at a"
                " time. Use that home (`corral --home HOME status`), or stop it (`corral --home HOME down`) first"
            ) from None
        self._fd = fd
        record = json.dumps({"home": str(self.home), "pid": os.getpid(), "root": str(self.root)}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)

    def release(self) -> None:
        if self._fd is None:
            return
        # Emptied, never unlinked: another process may have the file open, waiting to lock it.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None


def _owner(fd: int) -> str:
    """`` (home H, pid N)`` from the holder's record, or '' if it cannot be read."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        record = json.loads(os.pread(fd, 4096, 0))
        return f" (home {record['home']}, pid {record['pid']})"
    return ""
