"""An agent's own instructions (issue 49 §1): the spec's ``instructions`` (text)
and ``instructions_file`` (the operator's file, its absolute path), as a run
carries them in its options (``{"text": ..., "file": ...}``).

They lead the system prompt of every turn of the run (``ProviderRequest.instructions``).
The file is read again whenever its stat moves, so the next plan sees an edit, and
its digest is folded into the plan's context fingerprint (``fold``): the stale-action
guard (supervisor/context/repo_fingerprint_service.py) reads the file again before
each action and blocks one planned under other instructions, as it does for an
AGENTS.md edit.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import rfc8785

from corral.core import nesting

#: An instructions file is a role, not a corpus.
MAX_FILE_BYTES = 64 * 1024


class InstructionsError(ValueError):
    """The instructions cannot be used; the message names the file and says why."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_file(path: str) -> tuple[str, str]:
    """The text of the instructions file at ``path`` and the sha256 of its bytes:
    a regular UTF-8 file of at most MAX_FILE_BYTES (the operator's own file: a
    symlink is followed, a FIFO is never waited on)."""
    try:
        read = nesting.read_file(path, MAX_FILE_BYTES)
    except nesting.NotReadable as exc:
        raise InstructionsError(f"cannot read instructions file {path}: {exc}") from None
    if read.truncated:
        raise InstructionsError(f"instructions file {path} is {read.size} bytes; the limit is {MAX_FILE_BYTES}")
    try:
        return read.data.decode("utf-8"), _sha(read.data)
    except UnicodeDecodeError as exc:
        raise InstructionsError(f"instructions file {path} is not UTF-8 text (byte {exc.start})") from None


@dataclass(frozen=True)
class Instructions:
    """What one prompt was made from: the inline text and the file's, with its digest."""

    text: str = ""
    file: str | None = None
    file_text: str = ""
    file_sha256: str | None = None

    @property
    def prompt(self) -> str:
        """As the model reads them: the inline text, then the file's."""
        return "\n\n".join(part.strip() for part in (self.text, self.file_text) if part.strip())

    @property
    def digest(self) -> str:
        return _sha(rfc8785.dumps({"text": self.text, "file": self.file, "file_sha256": self.file_sha256}))

    def sources(self) -> dict[str, str]:
        """Each source by a readable name, as the context's own sources are named."""
        found = {}
        if self.text:
            found["agent instructions (inline, in the spec)"] = _sha(self.text.encode())[:16]
        if self.file is not None:
            found[f"agent instructions at {self.file}"] = str(self.file_sha256)[:16]
        return found


class InstructionsCache:
    """A run's instructions, the file read again only when its stat moved."""

    def __init__(self) -> None:
        self._key: tuple[str, int, int, int, int] | None = None
        self._read: tuple[str, str] = ("", "")

    def current(self, options: Any) -> Instructions | None:
        """The instructions ``options`` (a run's ``instructions`` option) name, now;
        None when the run has none. Raises InstructionsError when the file cannot be read."""
        if not isinstance(options, dict):
            return None
        given, named = options.get("text"), options.get("file")
        text = given if isinstance(given, str) else ""
        file = named if isinstance(named, str) else None
        if file is None:
            return Instructions(text) if text else None
        try:
            info = os.stat(file)
        except OSError as exc:
            raise InstructionsError(f"cannot read instructions file {file}: {exc.strerror}") from None
        key = (file, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
        if key != self._key:
            self._read, self._key = read_file(file), key
        return Instructions(text, file, *self._read)


def folded(fingerprint: str, instructions: Instructions | None) -> str:
    """The context fingerprint with the instructions in it (unchanged without any)."""
    if instructions is None:
        return fingerprint
    return _sha(f"{fingerprint}:{instructions.digest}".encode())


def fold(stamp: dict[str, Any], instructions: Instructions | None) -> dict[str, Any]:
    """A plan's context stamp (actors/project_context.py ``stamp``) that also covers
    the instructions its prompt was made with."""
    if instructions is None:
        return stamp
    return {**stamp, "fingerprint": folded(str(stamp["fingerprint"]), instructions),
            "sources": {**stamp.get("sources", {}), **instructions.sources()}}
