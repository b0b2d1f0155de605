"""Reconciliation by evidence: what a careful person does after a crash.

For each action whose outcome is unknown, look at the world (the effects file, the
workspace files) and say ``ok`` if its effect is visibly there, ``failed`` if not.
Chaos uses it to drive runs to their end; it never looks at process memory.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from corral.chaos.invariants import read_effects
from corral.supervisor.ledger.port import Ledger

_PENDING = (
    "SELECT a.action_id, a.tool, a.input, r.options FROM actions a JOIN runs r ON r.run_id = a.run_id"
    " WHERE a.phase = 'needs-reconciliation'"
)


def pending_reconciliations(ledger_path: Path | Ledger) -> list[dict[str, Any]]:
    """From an SQLite ledger file, or an open ledger of any backend."""
    if isinstance(ledger_path, Ledger):
        return [dict(row) for row in ledger_path.all(_PENDING)]
    db = sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in db.execute(_PENDING).fetchall()]
    finally:
        db.close()


def decide(action: dict[str, Any], effects_path: Path) -> tuple[str, str]:
    tool = action["tool"]
    tool_input = json.loads(action["input"])
    workspace = Path(json.loads(action["options"]).get("workspace") or ".")
    # MCP servers under chaos record their effects with the action id from the call's
    # _meta, in the same file and format as effect.record; a user tool may too.
    if any(e.get("action_id") == action["action_id"] for e in read_effects(effects_path)):
        return "ok", "effect line present"
    if tool == "effect.record" or tool.startswith("mcp."):
        return "failed", "no effect line"
    if tool == "fs.write":
        target = workspace / tool_input.get("path", "")
        expected = hashlib.sha256(tool_input.get("content", "").encode()).hexdigest()
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == expected:
            return "ok", "file has the intended content"
        return "failed", "file missing or different"
    if tool == "fs.patch":
        target = workspace / tool_input.get("path", "")
        if target.is_file() and tool_input.get("new_text", "") in target.read_text(errors="replace"):
            return "ok", "patch visible"
        return "failed", "patch not visible"
    return "failed", f"no evidence rule for {tool}"
