"""The project revision (seed 004 V1.2, V1.3): one number per project, one more for
each committed write.

One number per project needs one ledger per project root. With SQLite homes,
``corral up`` takes the project's execution-owner lock (seed 004 V1.1 §2,
supervisor/home/project_lock.py): a second home on the same root is refused, so
no two homes keep their own revisions for the same files. The nodes of a
PostgreSQL cluster take no such lock (their partition leases decide who drives a
run), and each partition is a schema with its own ``project_revisions``: an
adopting node that runs an adopted partition on the same project root keeps two
numbers for it. Nothing makes those one.

How a write is known, one mechanism: a tool whose committed result changed the
project's sources says so in its output, ``"sources_changed": true``
(``corral.actors.tools.fs.SOURCES_CHANGED``). The file tools (``fs.write``,
``fs.patch``) always do; ``command.exec`` and ``project.verify`` do when the
source fingerprint taken before and after the command differs
(actors/tools/source_fingerprint.py); ``project.changeset`` and any tool of
one's own do the same. The receipt hook below reads the flag inside the receipt's
transaction, so the write, its receipt and the revision it makes commit together,
once per action. It counts a failed receipt too: a command that exited non-zero
may still have edited a file. An action whose outcome was never reported (a crash,
then a person's reconciliation) carries no output and makes no revision.
"""

from __future__ import annotations

import json
import time
from typing import Any

from corral.actors.tools.fs import SOURCES_CHANGED
from corral.supervisor.ledger.port import Ledger


def current(ledger: Ledger) -> int:
    """The project's revision now: 0 before any write."""
    row = ledger.one("SELECT MAX(revision) AS revision FROM project_revisions")
    return int(row["revision"]) if row is not None and row["revision"] is not None else 0


def changed_sources(result_json: str | None) -> bool:
    """Whether an action's stored result says it changed the project's sources."""
    if not result_json or SOURCES_CHANGED not in result_json:
        return False  # the flag's name is not even in the text (most results): no parse
    try:
        result = json.loads(result_json)
    except ValueError:
        return False
    if not isinstance(result, dict):
        return False
    if result.get("truncated") is True and isinstance(result.get("preview"), str):
        # A result past the ledger's bound is kept as a preview of its JSON text. Its
        # keys are sorted, so the flag comes before any key after "s" (a command's
        # stdout): found unescaped, it can only be a key, never inside a string.
        return f'"{SOURCES_CHANGED}":true' in result["preview"]
    output = result.get("output")
    return isinstance(output, dict) and output.get(SOURCES_CHANGED) is True


def on_receipt(ledger: Ledger, action: Any) -> None:
    """Inside the receipt's transaction: a write makes the next revision (none when
    the action made its revision before it wrote: ``project.changeset``)."""
    if changed_sources(action["result"]):
        record(ledger, action)


def record(ledger: Ledger, action: Any) -> int:
    """The action's one revision: the next one, made now, or the one it made before
    (a changeset makes its revision after its checkpoint, before its first write,
    and keeps it whatever the apply comes to: seed 004 V1.3)."""
    with ledger.tx() as db:
        made = db.execute("SELECT revision FROM project_revisions WHERE action_id = ?",
                          (action["action_id"],)).fetchone()
        if made is not None:
            return int(made["revision"])
        run = db.execute("SELECT root_run_id FROM runs WHERE run_id = ?", (action["run_id"],)).fetchone()
        root = run["root_run_id"] if run is not None else action["run_id"]
        revision = current(ledger) + 1
        db.execute(
            "INSERT INTO project_revisions (revision, action_id, run_id, root_run_id, tool, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (revision, action["action_id"], action["run_id"], root, action["tool"], time.time()),
        )
        ledger.event("project-revision", action["action_id"], run=action["run_id"], revision=revision,
                     tool=action["tool"])
        return revision


def last_change_in_tree(ledger: Ledger, root_run_id: str) -> int | None:
    """The latest revision made by the tree of runs whose root is ``root_run_id`` (a
    root run, its children and delegations), or None if it changed no sources. A
    run that is not a tree's root has no tree: None."""
    row = ledger.one("SELECT MAX(revision) AS revision FROM project_revisions WHERE root_run_id = ?", root_run_id)
    return int(row["revision"]) if row is not None and row["revision"] is not None else None
