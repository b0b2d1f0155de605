"""One supervisor owns a project (seed 004 V1.1 §2: the project's execution owner is
a cross-process lock of the project, not of the home).

Two homes on one project root would each keep their own project revision and
verification for the same files: a verification from one could gate a commit
while the other changed the sources. So ``corral up`` takes an exclusive ``flock``,
held for the supervisor's life and released by the kernel when it dies.

The lock is a file outside the project, named by the project root directory's device
and inode: two homes on one project meet there whatever path each was given. Not a
file inside the workspace, which the model could remove or replace. Not the project
directory itself either, whose ``flock`` the file tools take for every staged write
(actors/tools/staging.py). The file also holds the owner's home, pid, root and its
inode, so a refused second supervisor can name it.

Where the lock files live is the user's, never the environment's: every supervisor
of one user must meet in the same directory, and ``XDG_STATE_HOME`` or ``HOME`` are
each process's own (two supervisors started with different ones would each lock a
file of their own). It is ``.local/state/corral/project-owners`` under the home
directory of the user's passwd entry. Not ``/run/user/UID``: it exists only while
the user has a login session (a cron job or a plain ``su`` has none) and is removed at
the last logout, under a still running supervisor; two supervisors could then lock in
different places. Not ``/tmp`` first: a service with ``PrivateTmp`` has a ``/tmp`` of
its own, and cleaners age files there. Only a user without a passwd home directory
falls back to ``/tmp/corral-UID``. Either directory must be a real directory, owned by
the user and writable by nobody else, or ``corral up`` refuses.

A lock file with another name (a hard link) is refused, as a symlink is (``O_NOFOLLOW``):
that name could be locked or replaced apart from this one. The record is a diagnostic,
written after the lock is held, synced and read back: a torn or missing one never keeps
the lock's holder out and never lets anyone in (only the ``flock`` decides), and a new
holder notes the one it recovered from (``recovered_from``: home and pid) only when the
old record is whole, as one a holder killed outright leaves (a clean release empties it).

Nested roots have one owner too: one home on ``p`` and another on ``p/sub`` would
both write ``p/sub/x``. So acquiring also reads the other records, and refuses when a
held one's root contains ours or lies inside it (compared by device and inode where
the path still names it). A record counts only while its file is locked: a supervisor
killed outright leaves its record, but not its lock. The scan and the taking of the
lock happen under one more lock, ``.acquire``, held for that moment only: no two
supervisors judge each other half-written, and a file found unlocked there can be
removed (every opener of a lock file holds ``.acquire``), so the directory does not
grow with every project ever run.

The nodes of one PostgreSQL cluster are one owner: they share one ledger and the
project's one revision (supervisor/project/revision_store.py); their partition
leases decide who drives which run, and an adopting node runs the adopted
partition's spec on the same root beside its own. So each node locks a file of its
own (named by the root, its cluster and its process), whose record names its cluster
(a digest of the database's address), and the scan above also refuses a record of
the same root: the nodes of one cluster pass each other's, a home or another
cluster's node is refused while a node holds the root, and a node is refused on a
root a home holds. Exclusive locks only: a supervisor of an older corral, whose scan
takes a file it can lock shared for nobody's, never removes a held one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pwd
import re
import stat
from pathlib import Path
from typing import Any

from corral.supervisor.home.home_dir import HomeBusy, HomeError
from corral.supervisor.home.nofollow import open_levels

log = logging.getLogger(__name__)

#: A lock file's name: the hash of the root's device and inode.
_LOCK_NAME = re.compile(r"[0-9a-f]{32}\.lock")
#: Held while a lock is taken and the others are read (see the module's docstring).
_GATE = ".acquire"
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


def owners_dir() -> Path:
    """Where owner records live: from the user's passwd entry, never the environment."""
    return _owners_place()[1]


def _owners_place() -> tuple[Path, Path]:
    """The trusted start (the passwd home, else ``/tmp``) and the owners' directory below it."""
    uid = os.getuid()
    with contextlib.suppress(KeyError):
        home = Path(pwd.getpwuid(uid).pw_dir)
        if home.is_absolute() and home.is_dir():
            return home, home / ".local" / "state" / "corral" / "project-owners"
    return Path("/tmp"), Path(f"/tmp/corral-{uid}")


class ProjectBusy(HomeBusy):
    """Another supervisor owns the project root, or one around it or inside it."""


class ProjectLock:
    """The exclusive lock on one project root, for one supervisor's life."""

    def __init__(self, root: Path, home: Path, *, cluster: str | None = None) -> None:
        self.root = root
        self.home = home
        #: The cluster this supervisor is a node of (its shared ledger's identity), or
        #: None: a home, which owns the root alone.
        self.cluster = cluster
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise ProjectBusy naming the owner (HomeError when the
        root or the owners' directory cannot be used)."""
        # The root was resolved by the spec: a symlink here now is a swap, refused.
        try:
            directory = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _OPEN)
        except OSError as exc:
            raise HomeError(f"the project root {self.root} cannot be opened: {exc.strerror}") from None
        try:
            info = os.fstat(directory)
        finally:
            os.close(directory)
        ours = (info.st_dev, info.st_ino)
        key = f"{ours[0]}:{ours[1]}"
        if self.cluster is not None:
            key += f":{self.cluster}:{os.getpid()}:{os.urandom(8).hex()}"  # a node's own file
        name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock"
        owners = _open_owners(*reversed(_owners_place()))
        try:
            gate = os.open(_GATE, os.O_RDWR | os.O_CREAT | _OPEN, 0o600, dir_fd=owners)
            try:
                fcntl.flock(gate, fcntl.LOCK_EX)  # brief: held by another acquire only
                self._fd = self._take(owners, name, ours)
            finally:
                os.close(gate)
        finally:
            os.close(owners)

    def _take(self, owners: int, name: str, ours: tuple[int, int]) -> int:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | _OPEN, 0o600, dir_fd=owners)
        try:
            if os.fstat(fd).st_nlink != 1:
                # Another name of the file could be locked, emptied or replaced apart from this one.
                raise HomeError(f"the project lock file {name} has another name (a hard link): remove both")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ProjectBusy(_busy(_record(fd), self.root, "")) from None
            _check_nesting(owners, name, self.root, ours, self.cluster)
        except BaseException:
            os.close(fd)
            raise
        # The last holder's record, left by a holder that died: noted only when whole
        # (a torn one is no evidence of anyone); it never decides who holds the lock.
        old = _record(fd)
        recovered = {"home": old["home"], "pid": old["pid"]} if _whole(old) else None
        record = {
            "home": str(self.home),
            "pid": os.getpid(),
            "root": str(self.root),
            "dev": ours[0],
            "ino": ours[1],
            **({"cluster": self.cluster} if self.cluster is not None else {}),
            **({"recovered_from": recovered} if recovered else {}),
        }
        text = json.dumps(record).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
        os.fsync(fd)
        if os.pread(fd, len(text) + 1, 0) != text:
            log.warning("the project owner record %s reads back otherwise; the lock holds all the same", name)
        return fd

    def release(self) -> None:
        if self._fd is None:
            return
        # Emptied, never unlinked here: only an acquire, under the gate, removes a file.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None


def _open_owners(path: Path, start: Path | None = None) -> int:
    """The owners' directory, opened: from ``start`` (trusted: the user's passwd home)
    level by level, each made 0700 if missing and opened without following a symlink
    (nofollow.py, the home's own mechanism: no level swapped for a link leads
    elsewhere); and refused unless it is a real directory of this user that nobody
    else can write."""
    fd = open_levels(path, start or path.parent, what="the project owners' directory", make=0o700)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise HomeError(
            f"the project owners' directory {path} is not yours alone (owner uid {info.st_uid}, mode"
            f" {stat.S_IMODE(info.st_mode):o}): another user could hold or remove the project locks. Remove it,"
            " or make it yours with mode 0700"
        )
    return fd


def _check_nesting(owners: int, own: str, root: Path, ours: tuple[int, int], cluster: str | None = None) -> None:
    """Raise ProjectBusy when a held lock's root is ``root`` (another node's file, or a
    home's when we are a node), contains it or lies inside it, unless it is a node of
    our own cluster; remove the lock files nobody holds (we hold the gate: nobody is
    opening them)."""
    around = _ancestors(root)
    for name in os.listdir(owners):
        if name == own or not _LOCK_NAME.fullmatch(name):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | _OPEN, dir_fd=owners)
        except OSError:
            continue
        try:
            if not _held(fd):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=owners)  # nobody's: a supervisor gone, or released
                continue
            record = _record(fd)
            if cluster is not None and record.get("cluster") == cluster:
                continue  # our own cluster's node: the same owner
            where = _nesting(record, around, ours)
            if where == "is":
                raise ProjectBusy(_busy(record, root, ""))
            if where:
                raise ProjectBusy(_busy(record, Path(str(record["root"])), f", which {where} the project {root}"))
        finally:
            os.close(fd)


def _held(fd: int) -> bool:
    """Whether another process holds the lock on ``fd`` (ours, if we got it, goes
    with the descriptor's close)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


def _nesting(record: dict[str, Any], around: set[tuple[int, int]], ours: tuple[int, int]) -> str:
    """'is', 'contains' or 'lies inside' (the held root against ours), or ''."""
    theirs = record.get("root")
    if not isinstance(theirs, str) or not theirs:
        return ""
    path = Path(theirs)
    identity = (record.get("dev"), record.get("ino"))
    try:
        now = os.stat(path)
    except OSError:
        now = None
    if identity == (None, None) and now is not None:
        identity = (now.st_dev, now.st_ino)  # a record without them: as its path names it now
    if identity == ours:
        return "is"
    if identity in around:
        return "contains"
    if now is not None and (now.st_dev, now.st_ino) == identity and ours in _ancestors(path):
        return "lies inside"
    return ""


def _ancestors(path: Path) -> set[tuple[int, int]]:
    """The device and inode of every directory above ``path``."""
    found = set()
    for parent in path.parents:
        with contextlib.suppress(OSError):
            info = os.stat(parent)
            found.add((info.st_dev, info.st_ino))
    return found


def _whole(record: dict[str, Any]) -> bool:
    """A record with every field a holder writes, each of its type."""
    return (
        isinstance(record.get("home"), str)
        and isinstance(record.get("pid"), int)
        and isinstance(record.get("root"), str)
        and isinstance(record.get("dev"), int)
        and isinstance(record.get("ino"), int)
    )


def _record(fd: int) -> dict[str, Any]:
    """The holder's record, or {} if it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(os.pread(fd, 4096, 0))
        if isinstance(record, dict):
            return record
    return {}


def _busy(record: dict[str, Any], owned: Path, nested: str) -> str:
    owner = f" (home {record['home']}, pid {record['pid']})" if "home" in record and "pid" in record else ""
    if record.get("cluster"):
        owner = (
            f" (a node of PostgreSQL cluster {str(record['cluster'])[:12]}: home {record.get('home')}, pid"
            f" {record.get('pid')})"
        )
    return (
        f"another supervisor{owner} owns the project {owned}{nested}: one supervisor drives a project, and"
        " everything inside it, at a time. Use that home (`corral --home HOME status`), or stop it"
        " (`corral --home HOME down`) first"
    )
