"""Sanitizing output as it arrives: raw bytes in, sanitized text out, in pieces.

:class:`IncrementalSanitizer` commits output at boundaries that do not change what
:func:`~corral.actors.sanitize.sanitize_output` would make of the whole: whole lines,
or a quiet partial line such as a prompt, never half a UTF-8 character, half an
escape sequence or half a private key block. A PTY session and a one-shot command
both sanitize through it; :func:`session_roots` names the paths their output hides.
"""

from __future__ import annotations

import re

from corral.sandbox.bwrap import SANDBOX_HOME, SandboxProfile

from .sanitize import Roots, default_roots, sanitize_output

#: Output held back waiting for a newline before it is committed anyway.
MAX_PENDING = 64 * 1024

_COMPLETE_ESCAPE = re.compile(
    rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"
    rb"|[ -/]+[0-~]|[0-OQ-WYZ\\`-~])"
)


def _safe_cut(buf: bytes | bytearray, *, pem: bool = True) -> int:
    """How much of ``buf`` can be sanitized now without splitting a UTF-8 character,
    an escape sequence, a ``\\r\\n`` pair or (``pem``) a key block still arriving."""
    cut = len(buf)
    if cut and buf[cut - 1] == 0x0D:
        cut -= 1
    for back in range(1, min(4, cut) + 1):
        byte = buf[cut - back]
        if byte & 0xC0 == 0x80:
            continue
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if need > back:
                cut -= back
        break
    esc = buf.rfind(b"\x1b", max(0, cut - 512), cut)
    if esc >= 0:
        match = _COMPLETE_ESCAPE.match(bytes(buf[esc:cut]))
        if match is None:
            cut = esc
    if pem:
        cut = _before_open_pem(buf, cut)
    return cut


def _before_open_pem(buf: bytes | bytearray, cut: int) -> int:
    # The redactor matches a private key only as a whole block; committing its first
    # half would publish it.
    begin = buf.rfind(b"-----BEGIN ", 0, cut)
    if begin >= 0 and buf.find(b"-----END ", begin, cut) < 0:
        return begin
    return cut


class IncrementalSanitizer:
    """Raw output in, sanitized text out, committed at boundaries that do not change
    what :func:`sanitize_output` would make of the whole."""

    def __init__(self, roots: Roots | None, max_pending: int = MAX_PENDING) -> None:
        self._roots = roots
        self._pending = bytearray()
        self._max_pending = max_pending

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def _commit(self, cut: int) -> str:
        if cut <= 0:
            return ""
        raw = bytes(self._pending[:cut])
        del self._pending[:cut]
        return sanitize_output(raw.decode("utf-8", errors="replace"), self._roots)

    def feed(self, data: bytes) -> str:
        """Sanitized text of the complete lines now available."""
        self._pending += data
        cut = _before_open_pem(self._pending, self._pending.rfind(b"\n") + 1)
        if len(self._pending) - cut > self._max_pending:
            # Bounded memory beats perfect redaction of a "key" that never ends.
            cut = _safe_cut(self._pending, pem=False) or len(self._pending)
        return self._commit(cut)

    def flush(self) -> str:
        """Commit a partial line (a prompt) except an unfinished sequence at its end."""
        return self._commit(_safe_cut(self._pending, pem=len(self._pending) <= self._max_pending))

    def finish(self) -> str:
        return self._commit(len(self._pending))


def session_roots(profile: SandboxProfile, roots: Roots | None) -> Roots:
    """The roots a sandboxed process's output is redacted against: ``roots`` if
    given, else the project's and the sandbox's home directory."""
    if roots is not None:
        return roots
    pairs = list(default_roots(profile.project_root).items())
    pairs.append(("<home>", SANDBOX_HOME))
    return pairs
