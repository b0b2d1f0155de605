"""The project revision (seed 004 V1.2, V1.3): one number per project, one more for
each committed write.

One number per project, however many supervisors work in it (seed 004 V1.1 §2:
one execution owner per project, never one per home). With SQLite homes,
``corral up`` takes the project's execution-owner lock
(supervisor/home/project_lock.py): a second home on the same root is refused, so
the home's own ``project_revisions`` is the project's only count. The nodes of a
PostgreSQL cluster share one ledger and work in the same root side by side (their
partition leases decide who drives a run): each partition lists the revisions its
own actions made, and the number itself is the root's one head for the whole
cluster (``Ledger.project_head``, ``corral_cluster.project_heads``), advanced in
the write's own transaction. So a write on any node moves the revision every node
reads, and a verification another node made on the older one is stale.

How a write is known: a tool whose committed result changed the project's
sources says so in its output, ``"sources_changed": true``
(``corral.actors.tools.fs.SOURCES_CHANGED``). The file tools (``fs.write``,
``fs.patch``) always do; ``project.verify`` does when the source fingerprint
taken before and after its commands differs (actors/tools/source_fingerprint.py);
any tool of one's own does the same. The receipt hook below reads the flag inside
the receipt's transaction, so the write, its receipt and the revision it makes
commit together, once per action. It counts a failed receipt too: a command that
exited non-zero may still have edited a file.

Some actions make their revision before they write, and keep it whatever they
come to: ``project.changeset`` after its checkpoint (seed 004 V1.3), and a
``command.exec`` or a process session (``process.start``) when its sandbox is
ready, in the launch record's commit, before the program runs (seed 004 V1.11.1:
"command.exec 只在 SANDBOX_READY 后推进 revision 和清除旧验证凭证";
supervisor/sessions/session_service.py). So a command whose outcome is never
reported (a crash, then a person's reconciliation) has moved the revision all
the same, and no verification made before it lets a commit or a final reply
through. Its receipt keeps that one revision. A ``command.exec`` that says
``"sources_changed": false`` (its fingerprint did not move) still made its
revision, but the final-reply gate (``last_change_in_tree``) passes it over: a
run that only looked does not need a verification to finish.
"""

from __future__ import annotations

import json
import time
from typing import Any

from corral.actors.tools.fs import SOURCES_CHANGED
from corral.supervisor.ledger.port import Ledger


def current(ledger: Ledger) -> int:
    """The project's revision now: 0 before any write."""
    shared = ledger.project_head()
    own = _own(ledger)
    # Both: a partition may hold revisions from before the cluster kept one head.
    return own if shared is None else max(shared, own)


def _own(ledger: Ledger) -> int:
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
        own = _own(ledger) + 1
        shared = ledger.project_head(at_least=own)
        revision = own if shared is None else shared
        db.execute(
            "INSERT INTO project_revisions (revision, action_id, run_id, root_run_id, tool, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (revision, action["action_id"], action["run_id"], root, action["tool"], time.time()),
        )
        ledger.event("project-revision", action["action_id"], run=action["run_id"], revision=revision,
                     tool=action["tool"])
        return revision


def unchanged_sources(result_json: str | None) -> bool:
    """Whether an action's stored result says, explicitly, that it changed no sources
    (``"sources_changed": false``). No result (still running, reconciled after a
    crash), a failure without output, a result without the flag: not known."""
    if not result_json or SOURCES_CHANGED not in result_json:
        return False
    try:
        result = json.loads(result_json)
    except ValueError:
        return False
    if not isinstance(result, dict):
        return False
    if result.get("truncated") is True and isinstance(result.get("preview"), str):
        return f'"{SOURCES_CHANGED}":false' in result["preview"]  # see changed_sources
    output = result.get("output")
    return isinstance(output, dict) and output.get(SOURCES_CHANGED) is False


#: The tool whose early revision (made at SANDBOX_READY) may turn out to have
#: changed nothing: its result says so. A process session never says.
_EARLY_REVISION_TOOL = "command.exec"


def last_change_in_tree(ledger: Ledger, root_run_id: str) -> int | None:
    """The latest revision by which the tree of runs whose root is ``root_run_id`` (a
    root run, its children and delegations) changed sources or may have, or None. A
    ``command.exec`` whose result says it changed nothing is passed over. A run
    that is not a tree's root has no tree: None."""
    row = ledger.one("SELECT MAX(revision) AS revision FROM project_revisions WHERE root_run_id = ? AND tool != ?",
                     root_run_id, _EARLY_REVISION_TOOL)
    firm = int(row["revision"]) if row is not None and row["revision"] is not None else None
    commands = ledger.all(
        "SELECT r.revision, a.result FROM project_revisions r LEFT JOIN actions a ON a.action_id = r.action_id"
        " WHERE r.root_run_id = ? AND r.tool = ? AND r.revision > ? ORDER BY r.revision DESC",
        root_run_id, _EARLY_REVISION_TOOL, firm or 0)
    for command in commands:
        if not unchanged_sources(command["result"]):
            return int(command["revision"])
    return firm
