"""Nothing stale runs (seed 004 V1.1 §1, V1.24, V1.25): an action planned on an
older repository context is blocked before it is prepared.

Every plan an agent commits records the context its prompt was made from (the
fingerprint and a digest of each source, actors/project_context.py ``stamp``), in
the plan's own row. Before each action of that plan is prepared, this guard builds
the workspace's context again (cheaply: actors/project_context.py ``ContextCache``
re-reads only when a stat of a walked directory or a read file moved) and compares
fingerprints. On a difference the action is refused, never executing, with an
observation naming what changed (``AGENTS.md at game/AGENTS.md changed sha256
a→b``); every later action of the plan meets the same refusal, and the next plan
is made with the new text (the agent re-reads the context at every turn).

An action that waits for a person is checked again when approved: at the next
step boundary of its run (``RunHooks.boundary``), an approved action of a plan
whose context moved since fails with the same observation, before it can begin.

A plan without a stamp (a run with no workspace, a plan from before this check, an
agent of another build) is not checked.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.actors.project_context import ContextCache, changes
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store, loop_plan_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.action_state import action_id as derive_action_id
from corral.supervisor.runs.run_store import get_run

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

#: Workspaces whose context is kept (one supervisor serves a few projects at most).
MAX_CACHED_WORKSPACES = 32
#: Changes named in one observation.
MAX_NAMED_CHANGES = 8


class RepoFingerprintGuard:
    def __init__(self, ledger: Ledger, home: Path) -> None:
        self.ledger = ledger
        self.home = home
        self._caches: OrderedDict[str, ContextCache] = OrderedDict()

    def cache(self, workspace: str) -> ContextCache:
        found = self._caches.get(workspace)
        if found is None:
            found = self._caches[workspace] = ContextCache(Path(workspace), self.home)
            if len(self._caches) > MAX_CACHED_WORKSPACES:
                self._caches.popitem(last=False)
        else:
            self._caches.move_to_end(workspace)
        return found

    def planned_stamp(self, run: Any, the_action_id: str) -> dict[str, Any] | None:
        """The stamp of the plan this action belongs to (the run's current loop), or None."""
        loop = int(run["loop_index"])
        plan = loop_plan_store.get_plan(self.ledger, run["run_id"], loop)
        if plan is None:
            return None
        actions = plan.get("actions") or []
        if not any(derive_action_id(run["run_id"], loop, i) == the_action_id for i in range(len(actions))):
            return None
        stamp = plan.get("context")
        return stamp if isinstance(stamp, dict) and isinstance(stamp.get("fingerprint"), str) else None

    def action_guard(self, run: Any, the_action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        workspace = json.loads(run["options"]).get("workspace")
        if not isinstance(workspace, str) or not workspace:
            return "continue", ""
        stamp = self.planned_stamp(run, the_action_id)
        if stamp is None:
            return "continue", ""
        current = self.cache(workspace).current()
        if current.fingerprint == stamp["fingerprint"]:
            return "continue", ""
        sources = stamp.get("sources")
        named = changes(sources if isinstance(sources, dict) else {}, current.sources())
        if not named:
            named = ["the context's limits or schema changed"]
        if len(named) > MAX_NAMED_CHANGES:
            named = [*named[:MAX_NAMED_CHANGES], f"and {len(named) - MAX_NAMED_CHANGES} more"]
        return "block", (
            f"stale: the repository context changed after this action was planned (fingerprint"
            f" {stamp['fingerprint'][:12]}→{current.fingerprint[:12]}): {'; '.join(named)}. Nothing ran."
            " Your next turn's context has the new text: plan again under it."
        )

    def recheck_approved(self, ledger: Ledger, run_id: str) -> None:
        """At a step boundary: an approved action of the current plan, planned on a
        context that has moved since (a change while it waited for a person), fails
        before it begins. One indexed read when nothing waits."""
        rows = ledger.all(
            "SELECT a.* FROM actions a JOIN runs r ON r.run_id = a.run_id AND r.loop_index = a.loop_index"
            " WHERE a.run_id = ? AND a.phase = ?", run_id, ActionPhase.APPROVED.value)
        if not rows:
            return
        run = get_run(ledger, run_id)
        for row in rows:
            verdict, why = self.action_guard(run, row["action_id"], row["tool"], {})
            if verdict == "block":
                with ledger.tx():
                    action_store.move_action(ledger, row["action_id"], ActionPhase.FAILED, current=row,
                                             error=why, reason=why)
                    action_store.write_receipt(ledger, row["action_id"])


def install(sup: Supervisor) -> RepoFingerprintGuard:
    guard = RepoFingerprintGuard(sup.ledger, sup.home)
    sup.hooks.action_guards.append(guard.action_guard)
    sup.hooks.boundary.append(guard.recheck_approved)
    return guard
