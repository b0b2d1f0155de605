"""Large tool results: kept whole in a private file, a bounded preview inline.

The observation a model sees (and the ledger keeps) stays small; the full result is
a 0600 file under the home's transcripts with a reference. One helper for user
tools and MCP tools.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Results up to this size travel inline; larger ones go to a sidecar file.
INLINE_RESULT_BYTES = 32 * 1024
#: Results past this size are refused outright.
MAX_RESULT_BYTES = 8 * 1024 * 1024
PREVIEW_CHARS = 2000


class ResultTooLarge(ValueError):
    code = "result-too-large"


def sidecar_path(home: Path, run_id: str, action_id: str, kind: str) -> Path:
    return home / "transcripts" / run_id / f"{action_id}.{kind}.json"


def bounded(payload: dict[str, Any], sidecar: Path | None, preview: str) -> dict[str, Any]:
    """``payload`` inline when small; else written to ``sidecar`` and replaced by a
    reference, its size and a preview. Raises ResultTooLarge past the hard cap."""
    data = json.dumps(payload, ensure_ascii=False, default=str).encode()
    if len(data) > MAX_RESULT_BYTES:
        raise ResultTooLarge(f"the result is {len(data)} bytes; the limit is {MAX_RESULT_BYTES}")
    if len(data) <= INLINE_RESULT_BYTES or sidecar is None:
        return payload
    for directory in (sidecar.parent.parent, sidecar.parent):
        directory.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(sidecar, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return {"sidecar": str(sidecar), "bytes": len(data), "truncated": True, "preview": preview[:PREVIEW_CHARS]}
