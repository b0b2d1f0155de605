"""Terminal output made safe to show an agent, persist or put in a receipt.

A program's output is untrusted: escape sequences can retitle a terminal, move the
cursor over earlier text or (on some terminals) inject input, and the text itself
can carry secrets and the machine's absolute paths. :func:`sanitize_output` removes
the first and redacts the other two. It is pure (same input, same output) so that
a transcript sanitized chunk by chunk is stable and a cursor into it stays valid.

Order matters: control sequences go first, so a secret split by an escape sequence
(``sk-abc\\x1b[0mdef...``) is whole again when the redaction patterns look at it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from corral.core.redact import redact_text

# CSI (7-bit ESC [ and 8-bit U+009B): parameters, intermediates, one final byte; cut
# off by the end of the text, it is removed to the end.
_CSI = r"(?:\x1b\[|\x9b)[0-?]*[ -/]*(?:[@-~]|$)"
# OSC, DCS, SOS, PM, APC: a string up to BEL or ST (ESC \ or U+009C). An unterminated
# string runs to the end of the text: hiding too much beats passing a control through.
_STRING = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c|$)"
# Any other escape: intermediates and a final byte (ESC ( B), or a final byte alone
# (ESC 7, ESC c) that does not introduce one of the sequences above.
_ESC = r"\x1b(?:[ -/]+(?:[0-~]|$)|[0-OQ-WYZ\\`-~])"
# A lone trailing ESC, or ESC followed by something that is not a sequence.
_LONE_ESC = r"\x1b"

_SEQUENCES = re.compile("|".join((_CSI, _STRING, _ESC, _LONE_ESC)))
# C0 except \t and \n, DEL, C1; plus bidi overrides/isolates, which reorder how text
# is displayed without changing it (a terminal-free way to hide what a line says).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

_PATH_CHAR = r"[\w.\-/~+@%]"


def strip_controls(text: str) -> str:
    """Remove ANSI/VT sequences and control characters; ``\\r\\n`` becomes ``\\n``."""
    if "\x1b" in text or "\x9b" in text or any("\x90" <= c <= "\x9f" for c in text):
        text = _SEQUENCES.sub("", text)
    text = text.replace("\r\n", "\n")
    return _CONTROLS.sub("", text)


@functools.lru_cache(maxsize=64)
def _path_pattern(roots: tuple[tuple[str, str], ...]) -> tuple[re.Pattern[str], dict[str, str]]:
    # Longest root first, so /home/u/project wins over /home/u inside one alternation.
    ordered = sorted(roots, key=lambda item: len(item[1]), reverse=True)
    placeholders = {path: name for name, path in ordered}
    alternation = "|".join(re.escape(path) for _name, path in ordered)
    # Only whole path components: /home/u must not match inside /x/home/u or /home/uv.
    # A trailing "." ends a sentence, not a path: "/srv/p." still matches, "/srv/p.bak" not.
    pattern = re.compile(
        rf"(?<!{_PATH_CHAR})(?:{alternation})(?=/|\.?(?:[^\w.\-+@%~/]|$))"
    )
    return pattern, placeholders


Roots = Mapping[str, str | Path] | Iterable[tuple[str, str | Path]]


def _normalize_roots(roots: Roots | None) -> tuple[tuple[str, str], ...]:
    if not roots:
        return ()
    pairs = roots.items() if isinstance(roots, Mapping) else roots
    out: list[tuple[str, str]] = []
    for name, path in pairs:
        text = str(path).rstrip("/")
        # "/" or "" as a root would rewrite every absolute path into nonsense.
        if text.startswith("/") and len(text) > 1:
            out.append((name, text))
    return tuple(sorted(out))


def redact_paths(text: str, roots: Roots | None) -> str:
    """Replace absolute paths under ``roots`` with their placeholder.

    ``roots`` maps placeholder -> directory, or is a sequence of (placeholder,
    directory) pairs when one placeholder stands for several spellings of a path.
    """
    normalized = _normalize_roots(roots)
    if not normalized or "/" not in text:
        return text
    pattern, placeholders = _path_pattern(normalized)
    return pattern.sub(lambda m: placeholders[m.group(0)], text)


def default_roots(
    project_root: str | Path | None = None, home: str | Path | None = None
) -> dict[str, str | Path]:
    """The usual placeholders: ``<project>`` and ``<home>`` (the invoking user's)."""
    roots: dict[str, str | Path] = {}
    if project_root is not None:
        roots["<project>"] = Path(project_root)
    roots["<home>"] = Path(home) if home is not None else Path.home()
    return roots


def sanitize_output(text: str, roots: Roots | None = None) -> str:
    """Strip control sequences, then redact secrets and absolute paths under ``roots``.

    ``roots`` maps a placeholder to a directory, e.g. ``{"<project>": "/srv/p",
    "<home>": "/home/u"}``: ``/srv/p/src/x.py`` becomes ``<project>/src/x.py``.
    """
    return redact_paths(redact_text(strip_controls(text)), roots)


def sanitize_lines(lines: Iterable[str], roots: Roots | None = None) -> list[str]:
    return [sanitize_output(line, roots) for line in lines]
