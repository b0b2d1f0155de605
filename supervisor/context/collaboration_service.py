"""The collaboration policy on the supervisor (supervisor/context/collaboration.py).

* A root run's plan is checked at commit: until the run is bound, a plan that is
  its first collaboration wave (or, under ``requiredInitialWave``, its first plan
  with any action) must meet the policy, else it is refused as a repair the model
  sees. The first valid wave binds the run: the policy's snapshot and digest are
  recorded, and that snapshot governs the run from then on.
* A first claim (``agent.run_status``) waits for the isolated group the policy
  asks for; ``orchestratorOnlyAfterDelegation`` keeps a bound root to
  orchestration tools.
* The file is written only through ``corral collaboration set`` (the file tools
  refuse ``.corral/``). It is still the workspace's (a clone may ship one), so it
  is read as hostile: no symlink followed, no FIFO waited on, at most
  MAX_POLICY_FILE_BYTES (corral/core/nesting.py; strict_json bounds its nesting).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core import nesting
from corral.supervisor.context import collaboration
from corral.supervisor.context.collaboration import Policy
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_versions import ABSENT

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor


#: ``corral collaboration set`` writes at most 16,000 characters of policy.
MAX_POLICY_FILE_BYTES = 64 * 1024


class CollaborationService:
    def __init__(self, ledger: Ledger, project_root: Path) -> None:
        self.ledger = ledger
        self.root = Path(project_root)
        #: The project's policy file, read live until a run binds its snapshot.
        self.path = Path(project_root) / collaboration.POLICY_FILE
        #: The file's stat when last read, and the policy read: every action of a
        #: root run asks, and a stat costs less than an open, a read and a parse
        #: (or the exception a missing file raised each time).
        self._read: tuple[tuple[int, ...] | None, Policy] | None = None

    def live(self) -> Policy:
        try:
            info = os.stat(self.path)
            key: tuple[int, ...] | None = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
        except FileNotFoundError:
            key = None
        except OSError:
            key = (-1,)  # unreadable: read (and refuse) it below, every time
        if self._read is not None and self._read[0] == key and key != (-1,):
            return self._read[1]
        policy = self._parse_file()
        self._read = (key, policy)
        return policy

    def _read_text(self) -> str | None:
        """The policy file's text, None when there is none; PolicyError when it cannot
        be taken (a FIFO, a symlink, too large, not UTF-8)."""
        if not os.path.lexists(self.path):
            return None
        try:
            read = nesting.read_inside(self.root, collaboration.POLICY_FILE, MAX_POLICY_FILE_BYTES)
        except nesting.NotReadable as exc:
            raise collaboration.PolicyError(f"{collaboration.POLICY_FILE}: {exc}") from None
        if read.truncated:
            raise collaboration.PolicyError(f"{collaboration.POLICY_FILE} is larger than {MAX_POLICY_FILE_BYTES} bytes")
        try:
            return read.data.decode("utf-8")
        except UnicodeDecodeError:
            raise collaboration.PolicyError(f"{collaboration.POLICY_FILE} is not UTF-8 text") from None

    def _parse_file(self) -> Policy:
        try:
            text = self._read_text()
            return Policy() if text is None else collaboration.parse(text)
        except (OSError, collaboration.PolicyError):
            # A broken file must not fail open: every root run is held to a wave
            # until someone fixes it (corral collaboration show says why).
            return Policy(requiredInitialWave=True, minStaticDelegates=1)

    def binding(self, run_id: str) -> dict[str, Any] | None:
        # Kept once read, found or not, until a write to it (run_versions.py): every
        # plan and every boundary asks.
        kept = self.ledger.run_versions.row("collaboration_bindings", run_id, self.ledger)
        if kept is None:
            kept = self.ledger.one("SELECT * FROM collaboration_bindings WHERE run_id = ?", run_id) or ABSENT
            self.ledger.run_versions.keep_row("collaboration_bindings", run_id, kept, self.ledger)
        return None if kept is ABSENT else dict(kept)

    def policy_for(self, run_id: str) -> tuple[Policy, bool]:
        bound = self.binding(run_id)
        if bound is not None:
            return collaboration.from_snapshot(json.loads(bound["policy"])), True
        return self.live(), False

    # -- the checks ------------------------------------------------------------------

    def plan_guard(self, run: Any, loop: int, plan: dict[str, Any]) -> str | None:
        if run["kind"] != "root":
            return None
        policy, bound = self.policy_for(run["run_id"])
        if bound or not collaboration.wants_a_wave(policy):
            return None
        actions = list(plan.get("actions") or [])
        is_wave = any(a.get("tool") in collaboration.COLLABORATION_TOOLS for a in actions)
        if not is_wave and not (policy.requiredInitialWave and (actions or plan.get("final") is not None)):
            return None
        short = collaboration.wave_shortfalls(policy, actions)
        if short:
            return ("the project's collaboration policy wants a first wave first: " + "; ".join(short)
                    + ". Plan that wave now (agent.delegate / agent.spawn_isolated).")
        self.bind(run["run_id"], loop, policy)
        return None

    def bind(self, run_id: str, loop: int, policy: Policy) -> None:
        with self.ledger.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO collaboration_bindings (run_id, policy, digest, loop_index, bound_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (run_id, json.dumps(policy.as_json(), sort_keys=True), policy.digest, loop, time.time()),
            )
            self.ledger.event("collaboration-bound", run_id, digest=policy.digest, loop=loop)

    def action_guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        if run["kind"] != "root":
            return "continue", ""
        policy, bound = self.policy_for(run["run_id"])
        if tool == "agent.run_status" and policy.minIsolatedChildren:
            groups = self.ledger.one("SELECT COUNT(*) AS n FROM isolated_groups WHERE parent_run_id = ?",
                                     run["run_id"])
            if groups is None or int(groups["n"]) < 1:
                return "block", "no claim before the isolated group the collaboration policy asks for exists"
        if bound and policy.orchestratorOnlyAfterDelegation and tool not in collaboration.ORCHESTRATION_TOOLS:
            return "block", (f"{tool}: after its first wave this root only orchestrates"
                             " (orchestratorOnlyAfterDelegation)")
        return "continue", ""

    # -- people ----------------------------------------------------------------------

    async def show(self, params: dict[str, Any]) -> dict[str, Any]:
        problem = None
        exists = os.path.lexists(self.path)
        try:
            text = self._read_text()
            if text is not None:
                collaboration.parse(text)
        except (OSError, collaboration.PolicyError) as exc:
            problem = str(exc)
        live = self.live()
        return {"path": str(self.path), "exists": exists, "problem": problem,
                "policy": live.as_json(), "digest": live.digest,
                "bindings": [dict(row) for row in self.ledger.all(
                    "SELECT run_id, digest, loop_index, bound_at FROM collaboration_bindings ORDER BY bound_at")]}

    async def set_policy(self, params: dict[str, Any]) -> dict[str, Any]:
        text = params.get("text")
        if not isinstance(text, str) or len(text) > 16_000:
            raise BadRequest("text must be the policy's JSON, at most 16,000 characters")
        try:
            policy = collaboration.parse(text)
        except collaboration.PolicyError as exc:
            raise BadRequest(f"collaboration policy: {exc}") from None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        with partial.open("w") as out:
            json.dump(policy.as_json(), out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)
        self.ledger.event("collaboration-policy-set", "project", digest=policy.digest)
        return {"path": str(self.path), "digest": policy.digest, "policy": policy.as_json()}


class CollaborationFeature(RunFeature):
    """The collaboration policy in runs: a plan's first wave and each action are
    held to it."""

    def __init__(self, service: CollaborationService) -> None:
        self.service = service

    def plan_guard(self, run: Any, loop: int, plan: dict[str, Any]) -> str | None:
        return self.service.plan_guard(run, loop, plan)

    def action_guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        return self.service.action_guard(run, action_id, tool, tool_input)


def install(sup: Supervisor) -> CollaborationService:
    service = CollaborationService(sup.ledger, sup.spec.project_root)
    sup.control_methods["collaboration.show"] = service.show
    sup.control_methods["collaboration.set"] = service.set_policy
    return service


