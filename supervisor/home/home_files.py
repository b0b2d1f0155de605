"""The files a supervisor makes in its home, and the only ones it removes.

A home can be removed and made again under a running supervisor (``rm -rf`` of the
home, then ``corral up`` at the same path). The old supervisor, on its way out, must
leave what the new one made there alone. So every write and removal here goes
through the directory this supervisor locked, by its file descriptor (which keeps
naming that directory after it is removed or renamed, never the new one at the same
path), and a removal also checks that the name still holds the very file
(``st_dev``, ``st_ino``) that this supervisor made.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

#: A file's identity: (st_dev, st_ino).
FileId = tuple[int, int]


def file_id(info: os.stat_result) -> FileId:
    return (info.st_dev, info.st_ino)


class HomeFiles:
    """Writes and removals relative to one home directory, held open by ``dir_fd``
    (owned by the caller, who closes it after this object is done)."""

    def __init__(self, dir_fd: int) -> None:
        self.dir_fd = dir_fd
        #: What this supervisor made, by name relative to the home.
        self._made: dict[str, FileId] = {}

    def path_of(self, name: str) -> str | None:
        """A path to ``name`` that resolves through this home's descriptor, for code
        that only takes paths (nng's ipc listener, which also unlinks the path it
        listened on when it closes): it keeps naming this home after a new one
        took its place. None without a mounted /proc."""
        via = f"/proc/self/fd/{self.dir_fd}"
        return f"{via}/{name}" if os.path.isdir(via) else None

    def write(self, name: str, data: bytes) -> None:
        """Atomically replace ``name`` (mode 0600): a temporary file with a random name,
        created exclusively, renamed into place. Nothing is written through a link
        someone planted at a predictable name."""
        parent, _, base = name.rpartition("/")
        tmp = f"{parent}/.{base}.{secrets.token_hex(6)}" if parent else f".{base}.{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=self.dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                made = file_id(os.fstat(handle.fileno()))
            os.replace(tmp, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.dir_fd)
            raise
        self._made[name] = made

    def made(self, name: str) -> bool:
        """Whether ``name`` still holds the file this supervisor made."""
        made = self._made.get(name)
        if made is None:
            return False
        try:
            info = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return False
        return file_id(info) == made

    def remove(self, name: str) -> bool:
        """Unlink ``name`` if it is still the file this supervisor made; True if it went."""
        if not self.made(name):
            self._made.pop(name, None)
            return False
        del self._made[name]
        try:
            os.unlink(name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return False
        return True

    def remove_stale(self, subdir: str, suffix: str) -> list[str]:
        """At boot, under the lock: files ending in ``suffix`` in ``subdir`` are left
        from an earlier boot of this very home (this directory, by descriptor)."""
        removed: list[str] = []
        try:
            fd = os.open(subdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return removed
        try:
            for entry in os.listdir(fd):
                if entry.endswith(suffix):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry, dir_fd=fd)
                        removed.append(entry)
        finally:
            os.close(fd)
        return removed


def open_home(home: Path) -> int:
    """A descriptor of the home directory itself (never a symlink to one)."""
    return os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
