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
from corral.core.errors import CorralError

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
        tmp = self.home / f".{LOCK}.{os.getpid()}"
        with open(tmp, "w") as handle:
            handle.write(str(os.getpid()))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

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
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
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


def write_endpoint(home: Path, endpoint: Endpoint) -> None:
    tmp = home / f".{ENDPOINT}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(endpoint), handle)
    os.replace(tmp, home / ENDPOINT)


def remove_endpoint(home: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (home / ENDPOINT).unlink()


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


def heartbeat_endpoint(home: Path, endpoint: Endpoint) -> Endpoint:
    fresh = Endpoint(**{**asdict(endpoint), "heartbeat": time.time()})
    write_endpoint(home, fresh)
    return fresh
