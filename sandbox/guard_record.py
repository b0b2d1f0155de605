"""The tree guard's snapshot on disk while a sandboxed command runs, so the check
after the command survives the death of the process that launched it.

The check after a sandboxed command (tree_guard.Snapshot.enforce) runs in the
process that launched it. If that process dies while the command runs (the agent or
the session actor killed, a SIGKILL of the supervisor), the sandbox dies with it
(PDEATHSIG), the check never runs, and whatever the command created (a ``.git`` with
``core.fsmonitor``...) would count as existing at the next launch, and stay.

So, before the command may start (before COMMIT_EXEC), the launcher writes the
snapshot to a private directory of its own that the sandbox never sees (corral's
home: bwrap.SandboxProfile.private_dir), under a random name, fsync'd (the file, the
rename, the directory), and holds an exclusive ``flock`` on it for as long as the
launch lives; once the check after the command has run, the record is removed. The
kernel drops a lock when its holder dies, so a record whose lock can be taken
belongs to no live launch: :func:`recover`, run by every sandboxed launch that uses
the same directory (whatever its project) before it takes its own snapshot, waits
for the recorded sandbox processes to be gone, runs the check against the record,
then removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from corral.sandbox.guard_serial import from_record, to_record
from corral.sandbox.tree_guard import GuardReport, Snapshot

log = logging.getLogger("corral.sandbox")

#: The records' directory, inside the launcher's private directory.
GUARD_DIR = "sandbox-guard"
_SUFFIX = ".snapshot.json"
#: A record being written: never read by recover (it is renamed once complete).
_PARTIAL = ".partial"
#: Held (blocking) by recover: two launches never check the same leftovers at once,
#: and neither takes its own snapshot before the other's check has removed them.
_RECOVER_LOCK = "recover.lock"
#: A record is never larger than this (the walk stops at 200,000 entries).
_MAX_RECORD_BYTES = 64 << 20
#: How long recover waits for a dead launcher's sandbox to finish dying.
_DYING_S = 5.0
_START_SLACK_S = 1.0

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class GuardRecordError(OSError):
    """The private directory cannot hold records (the message says why)."""


def guard_dir(private: Path) -> Path:
    """``private/sandbox-guard``, made private (0700) if missing; never a symlink."""
    directory = private / GUARD_DIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise GuardRecordError(f"{directory} is not a directory of this user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    return directory


Process = tuple[int, float]


def process_identity(pid: int) -> Process | None:
    """A pid with its start time: a recycled pid is another process."""
    try:
        return pid, psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(process: Process) -> bool:
    pid, started = process
    try:
        proc = psutil.Process(pid)
        # Start times are read through the boot time, which the kernel reports to
        # the second; a pid reused within a second would only delay the check.
        started_now: float = proc.create_time()
        return abs(started_now - started) < _START_SLACK_S and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _processes(record: dict[str, Any]) -> list[Process]:
    try:
        return [(int(pid), float(started)) for pid, started in record.get("processes", [])]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad process list ({exc})") from None


@dataclass
class GuardRecord:
    """One launch's record, written and locked (see the module docstring)."""

    directory: Path
    name: str
    fd: int

    @classmethod
    def write(cls, directory: Path, snap: Snapshot, processes: Sequence[Process]) -> GuardRecord:
        """Write, fsync and lock the record of ``snap``; ``processes`` are the launch's
        own (bwrap, the sandbox's pid 1...), so that a recover does not check the tree
        while they may still be writing to it."""
        data = json.dumps({**to_record(snap), "processes": [list(p) for p in processes]}).encode()
        name = secrets.token_hex(12) + _SUFFIX
        dir_fd = os.open(directory, _DIR_FLAGS)
        try:
            partial = name + _PARTIAL
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
            try:
                # Locked before it has its final name: recover never sees it unlocked.
                fcntl.flock(fd, fcntl.LOCK_EX)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
                os.rename(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                os.fsync(dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(partial, dir_fd=dir_fd)
                os.close(fd)
                raise
        finally:
            os.close(dir_fd)
        return cls(directory, name, fd)

    def finish(self) -> None:
        """The check after the command has run: the record goes. Unlinked before its
        lock is dropped, so nobody can take it for a leftover meanwhile."""
        if self.fd < 0:
            return
        try:
            dir_fd = os.open(self.directory, _DIR_FLAGS)
            try:
                os.unlink(self.name, dir_fd=dir_fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.warning("cannot remove the sandbox guard record %s/%s: %s", self.directory, self.name, exc)
        finally:
            self.release()

    def release(self) -> None:
        """Drop the lock and keep the record: the check after the command did not
        run to its end (a tree that would not die), so the next launch runs it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@contextlib.contextmanager
def _recover_lock(dir_fd: int) -> Iterator[None]:
    fd = os.open(_RECOVER_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def recover(directory: Path) -> list[GuardReport]:
    """Run the check after the command for every record of ``directory`` whose
    launcher is dead (its lock is free), and remove those records. Returns what each
    check did (also logged). A record whose sandbox processes are still alive after
    a short wait is left for the next launch."""
    reports: list[GuardReport] = []
    dir_fd = os.open(directory, _DIR_FLAGS)
    try:
        with _recover_lock(dir_fd):
            for name in sorted(os.listdir(dir_fd)):
                if name.endswith(_SUFFIX) or name.endswith(_SUFFIX + _PARTIAL):
                    report = _recover_one(directory, dir_fd, name)
                    if report is not None:
                        reports.append(report)
    finally:
        os.close(dir_fd)
    return reports


def recover_home(home: Path) -> list[GuardReport]:
    """``recover`` for corral's home (when a supervisor boots, say), if it has records."""
    directory = home / GUARD_DIR
    return recover(directory) if directory.is_dir() and not directory.is_symlink() else []


def _recover_one(directory: Path, dir_fd: int, name: str) -> GuardReport | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None  # finished meanwhile
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its launch is alive: its own check will run
        info = os.fstat(fd)
        if info.st_nlink == 0 or not stat.S_ISREG(info.st_mode):
            return None  # removed by its launcher between the listing and the lock
        if name.endswith(_PARTIAL):
            # Its launcher died before the record was complete, so before COMMIT_EXEC:
            # the command never ran.
            _unlink(dir_fd, name)
            return None
        try:
            record = _load(fd, info.st_size)
            # What the check takes goes to the quarantine of the home these records are in.
            snap = from_record(record, home=directory.parent)
            processes = _processes(record)
        except ValueError as exc:
            log.error("sandbox guard record %s/%s is unusable, removed: %s", directory, name, exc)
            _unlink(dir_fd, name)
            return None
        if not _gone(processes):
            log.warning("a sandbox of %s outlives its launcher; its check waits for the next launch", snap.root)
            return None
        # Not live: what is found now may be the user's own (a git init since the
        # launcher died), so it is never deleted (guard_removal.py).
        report = snap.enforce(live=False)
        if report.clean:
            log.info("checked %s after a command whose launcher died: nothing left behind", snap.root)
        else:
            log.warning("a command whose launcher died left git control entries in %s: %s", snap.root,
                        report.as_dict())
        _unlink(dir_fd, name)
        return report
    finally:
        os.close(fd)


def _gone(processes: list[Process]) -> bool:
    """Whether the launch's processes are all gone. PDEATHSIG kills them within
    milliseconds of their launcher, so this waits a little for that, no longer."""
    deadline = time.monotonic() + _DYING_S
    while any(_alive(p) for p in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _load(fd: int, size: int) -> dict[str, Any]:
    if size > _MAX_RECORD_BYTES:
        raise ValueError(f"{size} bytes")
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("not an object")
    return data


def _unlink(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    os.fsync(dir_fd)
