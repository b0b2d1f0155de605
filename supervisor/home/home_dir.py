"""The home directory: mode 0700, an OS lock, the endpoint file, socket paths."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from corral import PROTOCOL_VERSION
from corral.supervisor.home.home_errors import HomeBusy, HomeError, NotRunning
from corral.supervisor.home.home_files import HomeFiles
from corral.supervisor.home.nofollow import open_levels

ENDPOINT = "endpoint.json"
LOCK = "supervisor.lock"
LEDGER = "ledger.db"


__all__ = ["HomeBusy", "HomeError", "NotRunning"]  # re-exported: callers find them here


def resolve_home(arg: str | os.PathLike[str] | None) -> Path:
    raw = arg or os.environ.get("CORRAL_HOME") or "./.corral"
    return Path(raw).expanduser().absolute()


def ensure_home(path: Path) -> Path:
    """The home for a supervisor to start on (``corral up``): made if missing, every
    level opened without following a symlink (nofollow.py), refused unless it is this
    user's, then made 0700 (the writer's entry; a read entry only verifies: check_home)."""
    fd = _open_home(path, make=0o700)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise HomeError(f"home {path} belongs to uid {info.st_uid}, not to you")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
        for sub in ("s", "logs", "workspaces", "failpoints"):
            with contextlib.suppress(FileExistsError):
                os.mkdir(sub, 0o700, dir_fd=fd)
    finally:
        os.close(fd)
    return path


def check_home(path: Path) -> None:
    """Every entry that reads a home verifies it first, and changes nothing (seed 004
    V1.1 §2: "AppData 在 Unix 上必须由当前用户持有且权限为 0700…只读状态入口只能校验"):
    a real directory (not a symlink), of this user, mode 0700. A home others can read
    or write could hand a reader another supervisor's endpoint, or have given its
    token away. A missing home passes: the caller says nothing runs. The levels above
    it are the reader's own path to it (a reader may reach a home in another mount
    namespace through ``/proc/PID/root``); the home itself is locked level by level
    with no symlink (``HomeLock``), so a home reached through a link never runs."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(info.st_mode):
        raise HomeError(f"home {path} is a symlink; refusing to follow it: give the real path")
    if not stat.S_ISDIR(info.st_mode):
        raise HomeError(f"home {path} exists and is not a directory")
    if info.st_uid != os.getuid():
        raise HomeError(
            f"home {path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}): nothing was read from"
            " it. Use a home of your own (`--home`), or have its owner hand it over"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o700:
        raise HomeError(
            f"home {path} has mode {mode:o}, not 700: other users could read its control token and ledger,"
            f" so nothing was read from it. If you trust what is in it, fix it with `chmod 700 {path}`"
        )


def _open_home(path: Path, make: int | None) -> int:
    """The home directory opened from ``/`` level by level, following no symlink."""
    path = path.absolute()
    return open_levels(path, Path(path.anchor), what="home", make=make)


@dataclass(frozen=True)
class Endpoint:
    protocol: int
    pid: int
    boot_id: str
    control: str
    token: str
    heartbeat: float
    home: str

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("token")
        return data


class HomeLock:
    """flock on the home directory itself: released by the kernel when the holder
    dies, and (unlike a lock file) impossible to unlink from under a live holder.
    ``supervisor.lock`` only tells who holds it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / LOCK
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        #: Writes and removals through the locked directory itself (home_files.py).
        self.files: HomeFiles | None = None

    def acquire(self) -> None:
        try:
            fd = _open_home(self.home, make=None)  # the lock on the directory its levels lead to, no link
        except FileNotFoundError:
            raise HomeError(f"home {self.home} does not exist") from None
        if not _take(fd):
            os.close(fd)
            raise HomeBusy(
                f"another supervisor (pid {_holder(self.path)}) owns {self.home}; "
                "use `corral status` to inspect it or `corral down` to stop it"
            ) from None
        info = os.fstat(fd)
        self._fd, self._inode = fd, (info.st_dev, info.st_ino)
        self.files = HomeFiles(fd)
        self.files.write(LOCK, str(os.getpid()).encode())

    def still_held(self) -> bool:
        """False once the home this lock was taken on is no longer at its path
        (removed or replaced): the holder must stop writing."""
        try:
            info = os.stat(self.home)
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == self._inode

    def release(self) -> None:
        if self._fd is not None:
            if self.files is not None:
                # Only the lock file this supervisor wrote, in the home it locked: a new
                # home at the same path belongs to another supervisor.
                self.files.remove(LOCK)
            os.close(self._fd)
            self._fd = None


def _take(fd: int, attempts: int = 50) -> bool:
    """The exclusive lock, allowing for ``is_locked`` probes: they hold a shared lock
    for microseconds, which must not read as another supervisor."""
    for _ in range(attempts):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.01)
    return False


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip()[:16] or "?"
    except OSError:
        return "?"


def is_locked(home: Path) -> bool:
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write_endpoint(files: HomeFiles, endpoint: Endpoint) -> None:
    """Through the supervisor's own home directory (never a new home at its path)."""
    files.write(ENDPOINT, json.dumps(asdict(endpoint)).encode())


def remove_endpoint(files: HomeFiles) -> None:
    """Only the endpoint this supervisor wrote."""
    files.remove(ENDPOINT)


def read_endpoint(home: Path) -> Endpoint:
    check_home(home)  # the home before anything in it is trusted
    path = home / ENDPOINT
    try:
        info = path.stat()
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotRunning(f"no supervisor is running on {home} (start one with `corral up`)") from None
    except (OSError, ValueError) as exc:
        raise HomeError(f"endpoint file {path} is unreadable: {exc}") from None
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise HomeError(f"endpoint file {path} is readable by others; refusing to use it")
    try:
        endpoint = Endpoint(**data)
    except TypeError:
        raise HomeError(f"endpoint file {path} has unexpected fields") from None
    if endpoint.protocol != PROTOCOL_VERSION:
        raise HomeError(f"supervisor on {home} speaks protocol {endpoint.protocol}, this corral {PROTOCOL_VERSION}")
    if not psutil.pid_exists(endpoint.pid) or not is_locked(home):
        raise NotRunning(f"the supervisor of {home} (pid {endpoint.pid}) is gone; `corral up` starts a new boot")
    return endpoint


def heartbeat_endpoint(files: HomeFiles, endpoint: Endpoint) -> Endpoint:
    fresh = Endpoint(**{**asdict(endpoint), "heartbeat": time.time()})
    write_endpoint(files, fresh)
    return fresh
