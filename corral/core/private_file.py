"""Reading a file that holds secrets (an API key, the bridge's tokens): it must be a
regular file that only its owner can read, or nothing is read.

One check for every such file, so each refuses the same things with the same
words: a missing or unopenable file, a FIFO or a directory, any group or other
permission bit (with the ``chmod 600`` that fixes it), and a file past its size.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class PrivateFileError(ValueError):
    """What is wrong with the file; the message names it (never its content)."""


def read_private_file(path: Path, what: str, max_bytes: int) -> bytes:
    """The file's bytes; ``what`` names it in messages (``api_key_file``)."""
    try:
        # O_NONBLOCK: a FIFO must be refused below, not wait here for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PrivateFileError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise PrivateFileError(f"{what} {path} cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        # fstat of the open file: no window for a swap between the check and the read.
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PrivateFileError(f"{what} {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise PrivateFileError(
                f"{what} {path} has mode {mode:04o}; it must not be accessible to "
                f"group or others (run: chmod 600 {path})"
            )
        raw = handle.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise PrivateFileError(f"{what} {path} is too large (more than {max_bytes} bytes)")
    return raw
