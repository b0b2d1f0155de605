"""Nothing stale runs (seed 004 V1.1 §1, V1.24, V1.25): an action planned on an
older repository context is blocked before it is prepared.

Every plan an agent commits records the context its prompt was made from (the
fingerprint and a digest of each source, actors/project_context.py ``stamp``), in
the plan's own row. Before each action of that plan is prepared, this guard builds
the workspace's context again (cheaply: actors/project_context.py ``ContextCache``
re-reads only when a stat of a walked directory or a read file moved; stat'd once
per ledger transaction, so a read batch's actions, prepared together, are checked
at one instant; the digest computed once per build; the plan's stamp parsed once
per plan) and compares fingerprints. On a difference the action is refused, never
executing, with an observation naming what changed (``AGENTS.md at
game/AGENTS.md changed sha256 a→b``); every later action of the plan meets the same refusal, and the next plan
is made with the new text (the agent re-reads the context at every turn).

An action that waits for a person is checked again when approved: at the next
step boundary of its run (``RunHooks.boundary``), an approved action of a plan
whose context moved since fails with the same observation, before it can begin.

A plan without a stamp (a run with no workspace, a plan from before this check, an
agent of another build) is not checked.

Nor is a tool that reads only the ledger, never the project: the parent's claim of
its delegations' receipts (``agent.run_status``) is bound by the delivery and claim
journals, so a specialist's write to AGENTS.md under the parent's plan does not make
it stale (seed 004 V1.16: "不受专业 Agent 写黑板或项目文件导致的全局 project revision /
repository fingerprint 漂移误伤").

The build runs on the supervisor's trio loop, and is kept cheap rather than moved to
a worker thread: the guard is called synchronously inside the transaction that
prepares the action (supervisor/runs/run_actor_methods.py ``prepare_checked``), so
the check and the prepared row are one instant; an await there (for
``trio.to_thread.run_sync``) would split it, and let another task's writes into the
open transaction. So every part of a build is bounded, and a rebuild redoes only
what moved: documents and skill files are read to a cap, the skills' front matter
is bounded per skill (8 KiB, 256 YAML nodes) and in all (64 KiB, 4,096 nodes), and
parsed by libyaml (actors/repo_skills.py); the ``ContextCache`` stat stamps
(path, size, mtime, ctime, inode) skip a build when nothing moved, and its front
matter memo (keyed on the text itself, so never stale) skips the parser for every
skill that did not change when an agent's write moves a walked directory. Eight
skills of 122 KiB front matter held this loop for 10 to 27 s at a time; they are
now refused unparsed.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from corral.actors import agent_instructions
from corral.actors.project_context import ContextCache, RepoContext, changes
from corral.actors.tools.swarm import RunStatus
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.action_state import action_id as derive_action_id
from corral.supervisor.runs.run_feature import RunFeature, RunFeatures
from corral.supervisor.runs.run_store import get_run, run_options

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

#: Workspaces whose context is kept (one supervisor serves a few projects at most).
MAX_CACHED_WORKSPACES = 32
#: Changes named in one observation.
MAX_NAMED_CHANGES = 8


#: Tools that read only the ledger, never the project: no context makes them stale.
LEDGER_ONLY_TOOLS = frozenset({RunStatus.schema.name})

#: Runs whose current plan's stamp is kept.
MAX_PLANS_KEPT = 1024


class _PlanStamp(NamedTuple):
    """A committed plan's stamp and the ids of its actions."""

    loop: int
    text: str
    action_ids: frozenset[str]
    stamp: dict[str, Any] | None

    @classmethod
    def of(cls, run_id: str, loop: int, text: str) -> _PlanStamp:
        plan = json.loads(text)
        actions = plan.get("actions") or []
        stamp = plan.get("context")
        fits = isinstance(stamp, dict) and isinstance(stamp.get("fingerprint"), str)
        ids = frozenset(derive_action_id(run_id, loop, i) for i in range(len(actions)))
        return cls(loop, text, ids, stamp if fits else None)


class RepoFingerprintGuard(RunFeature):
    def __init__(self, ledger: Ledger, home: Path, features: RunFeatures) -> None:
        self.ledger = ledger
        self.home = home
        #: The supervisor's features (this one among them): a blocked action's
        #: receipt is seen by each.
        self.features = features
        self._caches: OrderedDict[str, ContextCache] = OrderedDict()
        #: Each workspace's last built context and its fingerprint: a build is
        #: immutable and the cache hands back the same object while nothing moved, so
        #: its digest (a canonical dump and a sha256, half of this guard's cost per
        #: action) is computed once per build, not once per action.
        self._fingerprints: dict[str, tuple[RepoContext, str]] = {}
        #: The context checked in the open transaction: (its serial, workspace, context).
        self._checked: tuple[int, str, RepoContext] | None = None
        #: Each run's current plan, as this guard reads it.
        self._plans: dict[str, _PlanStamp] = {}
        #: Each instructions file's last read (an agent's ``instructions_file``), by path.
        self._instructions: OrderedDict[str, agent_instructions.InstructionsCache] = OrderedDict()

    def cache(self, workspace: str) -> ContextCache:
        found = self._caches.get(workspace)
        if found is None:
            found = self._caches[workspace] = ContextCache(Path(workspace), self.home)
            if len(self._caches) > MAX_CACHED_WORKSPACES:
                self._caches.popitem(last=False)
        else:
            self._caches.move_to_end(workspace)
        return found

    def current(self, workspace: str) -> RepoContext:
        """The workspace's context now: stat'd once per transaction. A read batch
        prepares a plan's reads in one transaction, with no await in between, so
        they are checked at one instant, as one action would be."""
        serial = self.ledger.open_transaction()
        checked = self._checked
        if serial is not None and checked is not None and checked[:2] == (serial, workspace):
            return checked[2]
        built = self.cache(workspace).current()
        self._checked = None if serial is None else (serial, workspace, built)
        return built

    def fingerprint(self, workspace: str, built: RepoContext) -> str:
        known = self._fingerprints.get(workspace)
        if known is not None and known[0] is built:
            return known[1]
        if len(self._fingerprints) >= MAX_CACHED_WORKSPACES and workspace not in self._fingerprints:
            self._fingerprints.clear()
        digest = built.fingerprint
        self._fingerprints[workspace] = (built, digest)
        return digest

    def instructions(self, options: Any) -> agent_instructions.Instructions | None:
        """A run's instructions as they are now (its file re-read only when its stat moved)."""
        file = options.get("file") if isinstance(options, dict) else None
        key = file if isinstance(file, str) else ""
        cache = self._instructions.get(key)
        if cache is None:
            cache = self._instructions[key] = agent_instructions.InstructionsCache()
            if len(self._instructions) > MAX_CACHED_WORKSPACES:
                self._instructions.popitem(last=False)
        return cache.current(options)

    def planned_stamp(self, run: Any, the_action_id: str) -> dict[str, Any] | None:
        """The stamp of the plan this action belongs to (the run's current loop), or None."""
        run_id, loop = str(run["run_id"]), int(run["loop_index"])
        committed = self.ledger.committed_plan(run_id, loop)
        if committed is None:
            return None
        known = self._plans.get(run_id)
        if known is None or known.loop != loop or known.text != committed[0]:
            # Once per plan, not once per action: the plan parsed, its actions' ids derived.
            if len(self._plans) >= MAX_PLANS_KEPT:
                self._plans.clear()
            known = self._plans[run_id] = _PlanStamp.of(run_id, loop, committed[0])
        return known.stamp if the_action_id in known.action_ids else None

    def action_guard(self, run: Any, the_action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        if tool in LEDGER_ONLY_TOOLS:
            return "continue", ""
        workspace = run_options(run).get("workspace")
        if not isinstance(workspace, str) or not workspace:
            return "continue", ""
        stamp = self.planned_stamp(run, the_action_id)
        if stamp is None:
            return "continue", ""
        try:
            current = self.current(workspace)
            # The agent's own instructions (its spec's file, read again now) are part of it.
            instructions = self.instructions(run_options(run).get("instructions"))
            now = agent_instructions.folded(self.fingerprint(workspace, current), instructions)
        except Exception as exc:  # fail closed, by name: a workspace never takes the supervisor down
            return "block", (f"the repository context cannot be built ({type(exc).__name__}: {str(exc)[:200]})."
                             " Nothing ran.")
        if now == stamp["fingerprint"]:
            return "continue", ""
        sources = stamp.get("sources")
        now_sources = {**current.sources(), **(instructions.sources() if instructions else {})}
        named = changes(sources if isinstance(sources, dict) else {}, now_sources)
        if not named:
            named = ["the context's limits or schema changed"]
        if len(named) > MAX_NAMED_CHANGES:
            named = [*named[:MAX_NAMED_CHANGES], f"and {len(named) - MAX_NAMED_CHANGES} more"]
        return "block", (
            f"stale: the repository context changed after this action was planned (fingerprint"
            f" {stamp['fingerprint'][:12]}→{now[:12]}): {'; '.join(named)}. Nothing ran."
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
                    action_store.write_receipt(ledger, row["action_id"], self.features)

    def at_boundary(self, ledger: Ledger, run_id: str) -> None:
        self.recheck_approved(ledger, run_id)


def install(sup: Supervisor) -> RepoFingerprintGuard:
    return RepoFingerprintGuard(sup.ledger, sup.home, sup.features)
