"""The collaboration policy on the supervisor (supervisor/context/collaboration.py
holds the rules; this module reads the ledger and the file and applies them).

* A root run's plan is checked at commit. Until the run is bound, a plan that
  starts a collaboration (or, when the policy asks for a wave, one that changes
  the project or ends the run) is preflighted whole as the first wave: short of
  the policy, it is refused as a repair the model sees and nothing of it exists.
  Every collaboration batch that passes is recorded as a v2 batch (its contract,
  its fingerprint, an id that binds both) before its plan commits; the first one
  binds the run's policy snapshot (V1.38).
* A delegation or spawn of a root takes effect only as a member of its batch's
  contract (``member_check``, asked by the swarm before its first effect and
  before every replay); otherwise its outcome is left to a person.
* ``orchestratorOnlyAfterDelegation``: a batch that collaborates and works alone
  is refused whole; once the root has a delegation or a group, a barred action
  is denied before it is prepared for anyone to approve.
* V1.37: a root's first new claim waits for ``minIsolatedGroupsBeforeClaim``
  groups (``claim_check``, asked by the claim before its journal is written); a
  final reply waits for the wave's facts and that many groups.
* The file is written only through ``corral collaboration set`` (the file tools
  refuse ``.corral/``). It is still the workspace's (a clone may ship one), so it
  is read as hostile: no symlink followed, no FIFO waited on, at most
  MAX_POLICY_FILE_BYTES (corral/core/nesting.py; strict_json bounds its nesting).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from corral.core import nesting
from corral.mailbox.steps import CompactStep, ProviderStep
from corral.supervisor.context import collaboration
from corral.supervisor.context.collaboration import Policy
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.mcp.mcp_catalog import read_only_tools
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_versions import ABSENT

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor


#: ``corral collaboration set`` writes at most 16,000 characters of policy.
MAX_POLICY_FILE_BYTES = 64 * 1024
#: Batches remembered as not yet known to be committed.
MAX_UNCONFIRMED = 4096


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
        #: Why the policy file last read could not be taken (None: it could, or there is none).
        self.problem: str | None = None
        #: The (run, loop) of batches recorded for a plan not yet known to have
        #: committed: a guard runs only before a loop's plan commits, so seeing one
        #: again means its plan was refused after this guard.
        self._unconfirmed: set[tuple[str, int]] = set()

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
            policy = Policy() if text is None else collaboration.parse(text)
        except (OSError, collaboration.PolicyError) as exc:
            # A broken file must not fail open: every root run is held to a wave,
            # and no unbound run may write its final reply, until someone fixes it
            # (corral collaboration show says why).
            self.problem = str(exc)
            return Policy(requiredInitialWave="static", minStaticDelegates=1)
        self.problem = None
        return policy

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

    def drift(self, run_id: str) -> str | None:
        """The project's live policy against the run's bound snapshot (seed 004 V1.38:
        "只允许报告 matched / drifted / unreadable"), None for an unbound run. A report
        only: nothing of what the run may do depends on it."""
        bound = self.binding(run_id)
        if bound is None:
            return None
        live = self.live()
        if self.problem is not None:
            return "unreadable"
        return "matched" if live.digest == bound["digest"] else "drifted"

    def prompt_section(self, run_id: str) -> str | None:
        """The effective policy of a root run, as the planning prompt renders it: the
        bound snapshot once bound ("planning prompt 继续渲染 snapshot 中的规范 policy 本体，不改变
        现有 JSON 外形"), the project's live policy before; None when the project has no
        policy file and nothing is bound (the defaults hold and are not repeated)."""
        bound = self.binding(run_id) is not None
        if not bound:
            if not os.path.lexists(self.path):
                return None
            run = self.ledger.one("SELECT kind FROM runs WHERE run_id = ?", run_id)
            if run is None or run["kind"] != "root":
                return None
        policy, _ = self.policy_for(run_id)
        where = ("bound to this run at its first collaboration batch" if bound
                 else "the project's, until this run binds it")
        return (f"\n\nCOLLABORATION POLICY ({where}; the runtime enforces it, whatever this text says):\n"
                + json.dumps(policy.as_json(), sort_keys=True, separators=(",", ":")))

    def mcp_reads(self, run_id: str, tools: Sequence[str]) -> frozenset[str]:
        """The run's pinned MCP tools that count as read-only (V1.32), looked up only
        when the plan names an MCP tool at all."""
        if not any(tool.startswith("mcp.") for tool in tools):
            return frozenset()
        return read_only_tools(self.ledger, run_id)

    def delegated(self, run_id: str) -> bool:
        """Whether the root has a static delegation or an isolated group (durable facts)."""
        return self.ledger.one(
            "SELECT 1 AS x FROM delegations WHERE parent_run_id = ? UNION ALL"
            " SELECT 1 AS x FROM isolated_groups WHERE parent_run_id = ? LIMIT 1", run_id, run_id) is not None

    # -- the checks ------------------------------------------------------------------

    def plan_guard(self, run: Any, loop: int, plan: dict[str, Any]) -> str | None:
        if run["kind"] != "root":
            return None
        policy, bound = self.policy_for(run["run_id"])
        bound_here = bound and int((self.binding(run["run_id"]) or {}).get("loop_index", -1)) == loop
        if bound_here or (run["run_id"], loop) in self._unconfirmed:
            # A plan of this loop passed this guard, then another refused it (a secret
            # in it), or the supervisor stopped before it committed: it never
            # committed (a guard runs only then), so neither its batch nor its binding holds.
            self._forget(run["run_id"], loop)
            policy, bound = self.policy_for(run["run_id"])
        actions = list(plan.get("actions") or [])
        tools = [str(a.get("tool")) for a in actions]
        # A batch that starts a collaboration and also works alone is refused whole;
        # a later plan's barred action is denied by itself (``action_guard``).
        reads = self.mcp_reads(run["run_id"], tools)
        refusal = collaboration.spawn_refusal(tools) or collaboration.orchestration_refusal(policy, tools, reads)
        if refusal is not None:
            return refusal + ". Plan that batch again without it."
        if not bound:
            if not collaboration.needs_preflight(policy, plan, reads):
                return None
            short = collaboration.wave_shortfalls(policy, actions) if collaboration.wants_a_wave(policy) else []
            if short:
                return ("collaboration policy: the first wave needs " + "; ".join(short)
                        + ". Plan that wave now (agent.delegate / agent.spawn_isolated).")
        if collaboration.COLLABORATION_TOOLS.intersection(tools):
            self.record_batch(run["run_id"], loop, policy, actions, bind=not bound)
        return None

    def _forget(self, run_id: str, loop: int) -> None:
        self._unconfirmed.discard((run_id, loop))
        with self.ledger.tx() as db:
            db.execute("DELETE FROM collaboration_batches WHERE run_id = ? AND loop_index = ?", (run_id, loop))
            db.execute("DELETE FROM collaboration_bindings WHERE run_id = ? AND loop_index = ?", (run_id, loop))

    def record_batch(self, run_id: str, loop: int, policy: Policy, actions: list[dict[str, Any]], *,
                     bind: bool) -> None:
        """A collaboration batch that passed its preflight, as a v2 batch: its contract
        and the ids that bind it, durable before the plan commits (so before any of
        its actions is prepared); the first one binds the run's policy snapshot."""
        contract = collaboration.batch_contract(policy, actions)
        digest = collaboration.contract_fingerprint(contract)
        the_id = collaboration.batch_id(run_id, loop, digest)
        with self.ledger.tx() as db:
            if bind:
                db.execute(
                    "INSERT OR IGNORE INTO collaboration_bindings (run_id, policy, digest, loop_index, bound_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (run_id, json.dumps(policy.as_json(), sort_keys=True), policy.digest, loop, time.time()),
                )
                self.ledger.event("collaboration-bound", run_id, digest=policy.digest, loop=loop)
            # The loop's plan is not committed yet (a guard runs only then): a batch
            # kept from a plan refused after its guards is replaced.
            db.execute("DELETE FROM collaboration_batches WHERE run_id = ? AND loop_index = ?", (run_id, loop))
            db.execute(
                "INSERT INTO collaboration_batches (batch_id, run_id, loop_index, version, policy_fingerprint,"
                " contract_fingerprint, contract, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (the_id, run_id, loop, collaboration.BATCH_VERSION, policy.digest, digest,
                 json.dumps(contract, sort_keys=True), time.time()),
            )
            self.ledger.event("collaboration-batch", run_id, batch=the_id, contract=digest, loop=loop,
                              members=len(contract["members"]))
        if len(self._unconfirmed) >= MAX_UNCONFIRMED:
            self._unconfirmed.clear()  # a bound, not a policy: a plan refused after this guard is rare
        self._unconfirmed.add((run_id, loop))

    def member_check(self, run: Any, action: Any) -> str | None:
        """Before a root's delegation or spawn takes effect, first time or replay: the
        reason it may not (its batch's contract does not hold it), or None."""
        if run["kind"] != "root":
            return None
        batch = self.ledger.one("SELECT * FROM collaboration_batches WHERE run_id = ? AND loop_index = ?",
                                run["run_id"], action["loop_index"])
        bound = self.binding(run["run_id"])
        policy = None if bound is None else collaboration.from_snapshot(json.loads(bound["policy"]))
        return collaboration.member_refusal(batch, policy, run["run_id"], int(action["loop_index"]),
                                            int(action["action_index"]), action["tool"], action["fingerprint"])

    def claim_check(self, run_id: str, ready_groups: int) -> str | None:
        """A root's first new claim (V1.37): why it must wait, or None."""
        policy, _bound = self.policy_for(run_id)
        if not policy.minIsolatedGroupsBeforeClaim:
            return None
        groups = self.ledger.one("SELECT COUNT(*) AS n FROM isolated_groups WHERE parent_run_id = ?", run_id)
        return collaboration.claim_shortfall(policy, int(groups["n"]) if groups else 0, ready_groups)

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        run = ledger.one("SELECT kind FROM runs WHERE run_id = ?", run_id)
        if run is None or run["kind"] != "root":
            return []
        policy, bound = self.policy_for(run_id)
        if not bound and self.problem is not None:
            return [f"the collaboration policy file is broken: {self.problem}"]
        if not collaboration.wants_a_wave(policy) and not policy.minIsolatedGroupsBeforeClaim:
            return []
        delegated_to = [row["target_agent"] for row in ledger.all(
            "SELECT target_agent FROM delegations WHERE parent_run_id = ? AND repair_of IS NULL", run_id)]
        sizes = [int(row["n"]) for row in ledger.all(
            "SELECT COUNT(c.delegation_id) AS n FROM isolated_groups g LEFT JOIN children c"
            " ON c.group_id = g.group_id WHERE g.parent_run_id = ? GROUP BY g.group_id", run_id)]
        return collaboration.completion_shortfalls(policy, delegated_to, sizes)

    def action_guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        if run["kind"] != "root" or tool in collaboration.ORCHESTRATION_TOOLS:
            return "continue", ""
        policy, bound = self.policy_for(run["run_id"])
        # Only a barred tool of a bound root pays for the look at its delegations.
        why = collaboration.action_refusal(policy, tool, bound and self.delegated(run["run_id"]),
                                           self.mcp_reads(run["run_id"], [tool]))
        return ("continue", "") if why is None else ("block", why)

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
        bindings = [dict(row) for row in self.ledger.all(
            "SELECT run_id, digest, loop_index, bound_at FROM collaboration_bindings ORDER BY bound_at")]
        for binding in bindings:
            binding["policy_status"] = ("unreadable" if problem is not None
                                        else "matched" if binding["digest"] == live.digest else "drifted")
        return {"path": str(self.path), "exists": exists, "problem": problem,
                "policy": live.as_json(), "digest": live.digest, "bindings": bindings}

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

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        return self.service.finalize_blockers(ledger, run_id)

    async def shape_provider(self, run_id: str, step: ProviderStep) -> ProviderStep | CompactStep:
        section = self.service.prompt_section(run_id)
        return step if section is None else msgspec.structs.replace(step, task=step.task + section)

    def show(self, run_id: str) -> Mapping[str, Any]:
        status = self.service.drift(run_id)
        if status is None:
            return {}
        bound = self.service.binding(run_id) or {}
        return {"collaboration": {"digest": bound.get("digest"), "policy_status": status}}


def install(sup: Supervisor) -> CollaborationService:
    service = CollaborationService(sup.ledger, sup.spec.project_root)
    sup.control_methods["collaboration.show"] = service.show
    sup.control_methods["collaboration.set"] = service.set_policy
    return service


