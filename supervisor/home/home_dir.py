"""The home directory: mode 0700, an OS lock, the endpoint file, socket paths."""

from __future__ import annotations

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
from corral.core.errors import CorralError
from corral.supervisor.home.home_files import HomeFiles

ENDPOINT = "endpoint.json"
LOCK = "supervisor.lock"
LEDGER = "ledger.db"


class HomeError(CorralError, RuntimeError):
    """A home that cannot be used; the message says what to do."""


class HomeBusy(HomeError):
    pass


class NotRunning(HomeError):
    """No supervisor runs on this home (start one with ``corral up`` or ``Client.start``)."""


def resolve_home(arg: str | os.PathLike[str] | None) -> Path:
    raw = arg or os.environ.get("CORRAL_HOME") or "./.corral"
    return Path(raw).expanduser().absolute()


def ensure_home(path: Path) -> Path:
    if path.is_symlink():
        raise HomeError(f"home {path} is a symlink; refusing to follow it")
    if path.exists() and not path.is_dir():
        raise HomeError(f"home {path} exists and is not a directory")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise HomeError(f"home {path} belongs to uid {info.st_uid}, not to you")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    for sub in ("s", "logs", "workspaces", "failpoints"):
        (path / sub).mkdir(mode=0o700, exist_ok=True)
    return path


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
        fd = os.open(self.home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
