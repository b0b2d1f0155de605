"""Reading a file that a spec names: a regular file, bounded, UTF-8, or a clear error.

``script = "/dev/zero"`` once grew one process to 24 GB; a FIFO would block the
reader forever. Every file a spec or the CLI reads goes through here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Specs and scripts are small; anything larger is a mistake, not a swarm.
MAX_SPEC_FILE_BYTES = 1024 * 1024


class FileReadError(ValueError):
    """The file cannot be used; the message names it and says why."""


def read_text_bounded(path: Path, what: str = "file", limit: int = MAX_SPEC_FILE_BYTES) -> str:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer before we can refuse it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise FileReadError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileReadError(f"{what} {path} is not a regular file")
        if info.st_size > limit:
            raise FileReadError(f"{what} {path} is {info.st_size} bytes; the limit is {limit}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileReadError(f"{what} {path} is larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileReadError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None
