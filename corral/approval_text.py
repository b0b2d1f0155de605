"""An approval view as a person reads it in a terminal: the one text form behind
``corral pending``, ``corral approve ACTION --show`` and the chat's ``[y/n]``
prompt (the dashboard renders the same view as HTML, corral/ui/pages.py).

The view comes from the supervisor (supervisor/runs/approval_view.py): real
argument values with secret-looking substrings masked, sealed fields as their
digest, a file tool's diff. Here it is laid out, and long values are paged, never
cut silently: what is not shown is counted, with the command that shows it.
Characters a terminal would act on (escape sequences, a carriage return, bidi
overrides, zero-width characters) are shown escaped: a value cannot hide what
it is, or rewrite the line that asks for approval.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Any

#: Lines of each value ``pending`` and the chat show before the "more" line.
PREVIEW_LINES = 12
#: A value this short, on one line, is shown beside its name.
INLINE_CHARS = 100


def printable(text: str) -> str:
    """``text`` with every control, format and unassigned character escaped
    (``\\x1b``, ``\\u202e``), line breaks and tabs kept."""
    if text.isprintable():
        return text
    return "".join(
        char
        if char in "\n\t" or not unicodedata.category(char).startswith("C")
        else (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        for char in text
    )


def show_command(action_id: str, page: int | None = None) -> str:
    """The command that shows the rest of an action's values."""
    return f"corral approve {action_id} --show " + (f"--page {page}" if page else "--all")


def render(view: dict[str, Any], *, preview: bool, indent: str = "    ") -> list[str]:
    """The lines of an approval view (as ``approval.show`` or ``pending`` gives it).
    ``preview``: each value's first ``PREVIEW_LINES`` lines (pending, the chat);
    else the whole page held."""
    action_id = str(view["action_id"])
    page_chars = int(view.get("page_chars") or 1)
    lines = [
        f"{indent}{view['tool']}  effect {view['effect']}  policy {view['policy']}  run {view['run_id']}"
        f"  agent {view['agent_id']}",
        f"{indent}fingerprint {view['fingerprint']}",
    ]
    value = functools.partial(_value, action_id=action_id, page_chars=page_chars, preview=preview, indent=indent)
    for argument in view["arguments"]:
        lines += value(f"{argument['name']}:", argument)
    if view.get("omitted_arguments"):
        lines.append(f"{indent}… {view['omitted_arguments']} more arguments not listed")
    for change in view["files"]:
        if change["error"]:
            lines.append(f"{indent}diff {printable(change['path'])}: {printable(change['error'])}")
        elif not change["chars"]:
            lines.append(f"{indent}diff {printable(change['path'])}: no change")
        else:
            lines += value(f"diff {change['path']}:", change, block=True)
    return lines


def _value(
    label: str,
    value: dict[str, Any],
    action_id: str,
    *,
    page_chars: int,
    preview: bool,
    indent: str,
    block: bool = False,
) -> list[str]:
    text, page, pages, chars = str(value["text"]), int(value["page"]), int(value["pages"]), int(value["chars"])
    start = (page - 1) * page_chars
    if not text and chars:
        return [f"{indent}{printable(label)} (no page {page}: it has {pages})"]
    shown = text
    if preview:
        cut = shown.split("\n")
        if len(cut) > PREVIEW_LINES:
            shown = "\n".join(cut[:PREVIEW_LINES]) + "\n"
    more = chars - start - len(shown)
    if not block and "\n" not in shown and len(shown) <= INLINE_CHARS and not more and page == 1:
        return [f"{indent}{printable(label)} {printable(shown)}"]
    lines = [f"{indent}{printable(label)}" + (f" (page {page} of {pages})" if page > 1 else "")]
    lines += [f"{indent}  {printable(line)}" for line in shown.rstrip("\n").split("\n")]
    if more > 0:
        where = show_command(action_id) if preview or page >= pages else show_command(action_id, page + 1)
        also = "" if preview or page >= pages else f" or `{show_command(action_id)}`"
        lines.append(f"{indent}  … {more} more chars, see `{where}`{also}")
    return lines

