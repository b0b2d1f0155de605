"""Reading a file that a spec names: a regular file, bounded, UTF-8, or a clear error.

``script = "/dev/zero"`` once grew one process to 24 GB; a FIFO would block the
reader forever. Every file a spec or the CLI reads goes through here.
"""

from __future__ import annotations

from pathlib import Path

from corral.core import nesting

#: Specs and scripts are small; anything larger is a mistake, not a swarm.
MAX_SPEC_FILE_BYTES = 1024 * 1024


class FileReadError(ValueError):
    """The file cannot be used; the message names it and says why."""


def read_text_bounded(path: Path, what: str = "file", limit: int = MAX_SPEC_FILE_BYTES) -> str:
    """The text of ``path`` (the operator's own file: a symlink is followed), read by
    corral's one bounded reader (corral/core/nesting.py). Its nesting is bounded by
    whoever parses it (load_spec, parse_script_text, strict_json)."""
    try:
        read = nesting.read_file(path, limit)
    except nesting.NotReadable as exc:
        raise FileReadError(f"cannot read {what} {path}: {exc}") from None
    if read.truncated:
        raise FileReadError(f"{what} {path} is {read.size} bytes; the limit is {limit}")
    try:
        return read.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileReadError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None
