"""Intent contracts on the supervisor: binding, the guard, receipts, evidence, updates.

A run starts bound (its contract stored once, the binding kept in the run's
options) or unbound with the reason: fail-open, the run works under the normal
policy, its high-risk actions get advisory ``remind`` receipts, and nothing
fills the gap from a summary or model output. Work a bound run hands on
(delegations, isolated children) inherits its binding: their actions are judged
by the same contract. Every action of a bound or unbound-with-a-reason run is
judged before it is prepared (supervisor/intent/intent_guard.py, with path scopes from
supervisor/intent/intent_scope.py) and each decision writes a receipt in the reference
guard's wire shape. A command of a run under a path scope runs in a sandbox
whose only writable binds are the scope's paths and whose excluded paths are
masked (``scoped_sandbox``). The final reply waits for verified completion
evidence (what the runtime ran and recorded, never the model's claim); after a
few refusals the run parks in ``needs-input``. An update with a higher version
rebinds the run at its next safe boundary. corral never writes back to the
intent source.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.errors import BadRequest, SupervisorError
from corral.supervisor.intent import intent_contract
from corral.supervisor.intent.intent_classify import COMMAND_TOOLS, command_line, corral_action
from corral.supervisor.intent.intent_contract import ContractError
from corral.supervisor.intent.intent_guard import (
    Decision,
    Evidence,
    decide,
    is_test_run,
    missing_evidence,
    requirement_ref,
    with_paths,
)
from corral.supervisor.intent.intent_scope import judge_action, sandbox_paths, scope_of
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_text
from corral.supervisor.runs import run_store
from corral.supervisor.runs.loop_plan_store import FINAL_BLOCKED_CATEGORY
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

#: Final replies refused for missing evidence before the run parks for a person.
EVIDENCE_ATTEMPTS = 1
EVIDENCE_PREFIX = "completion evidence missing"
#: How far up the tree of runs a binding is inherited (deeper than any spec allows).
MAX_INHERIT_DEPTH = 64
#: What the run service does with each decision (a remind is recorded, not enforced).
VERDICTS = {"block": "block", "ask": "ask", "continue": "continue", "remind": "continue"}


class IntentService:
    def __init__(self, ledger: Ledger, runs: RunService, home: Path) -> None:
        self.ledger = ledger
        #: Wakes a run an update rebinds.
        self.runs = runs
        #: The supervisor's home: path scopes never reach into it.
        self.home = home

    # -- binding ------------------------------------------------------------------------

    def bind(self, value: Any) -> dict[str, Any]:
        """A binding for a new run. ``value`` is the contract document, or its JSON
        text (the CLI sends the text, so a duplicate key is judged here like any
        other fault): whatever is wrong, the run starts unbound and says why."""
        try:
            contract = intent_contract.parse(value)
            intent_contract.store(self.ledger, contract)
        except ContractError as exc:
            return {"status": "unbound", "reason": f"{exc.code}: {exc}"[:500], "advisory": True}
        return contract.binding()

    # -- the guard ----------------------------------------------------------------------

    def guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        binding, _owner = effective_binding(self.ledger, run)
        if not binding:
            return "continue", ""
        contract = intent_contract.load_contract(self.ledger, binding)
        receipt_id = f"ir-{action_id}-{contract.contract_version if contract else 'unbound'}"
        earlier = self.ledger.one("SELECT data FROM intent_receipts WHERE receipt_id = ?", receipt_id)
        if earlier is not None:
            # A replayed prepare: the decision already made stands.
            data = json.loads(earlier["data"])
            return VERDICTS.get(data["decision"], "continue"), str(data.get("unlock") or "")
        started = time.monotonic()
        decision = self.judge(run, contract.projection if contract else None, tool, tool_input)
        self.write_receipt(run["run_id"], receipt_id, {
            "event_ref": action_id,
            "contract_ref": contract.contract_ref if contract else "unbound",
            "contract_version": contract.contract_version if contract else 1,
            "decision": decision.decision,
            "authority": decision.authority,
            "severity": decision.severity,
            "reason_codes": list(decision.reason_codes),
            "rule_ids": list(decision.rule_ids),
            "evidence_refs": [],
            # corral shows a reminder to people (receipts, show), not inside the model's context.
            "visibility": "user" if decision.decision == "remind" else decision.visibility,
            "reversible": decision.reversible,
            "coverage": decision.coverage,
            "unlock": decision.unlock,
            "latency_ms": round((time.monotonic() - started) * 1000, 3),
        })
        return VERDICTS[decision.decision], decision.detail

    def judge(self, run: Any, projection: dict[str, Any] | None, tool: str, tool_input: dict[str, Any]) -> Decision:
        action = corral_action(tool, tool_input)
        decision = decide(projection, action)
        if projection is None:
            return decision
        scope = scope_of(projection)
        workspace = Path(json.loads(run["options"]).get("workspace") or ".")
        decision = with_paths(decision, judge_action(scope, workspace, self.home, tool, tool_input), action)
        if decision.decision != "block" and tool in COMMAND_TOOLS and scope.active and not self.sandbox_works():
            return Decision(
                "block", "deterministic_rule", "high", ("scope_unenforceable",), (), "user", action.reversible,
                unlock="The contract limits paths and commands need the sandbox to hold them to it; install"
                       " bubblewrap, or change the contract.",
                detail=f"{tool}: the contract limits paths and the sandbox (bubblewrap) is not available to"
                       " enforce that on a command",
            )
        return decision

    def sandbox_works(self) -> bool:
        return bwrap_available()

    def scoped_sandbox(self, run: Any, settings: dict[str, Any]) -> dict[str, Any]:
        """The sandbox settings of a command or process session of ``run``: under a
        contract with path rules, the include paths are the only writable binds,
        the exclude paths are masked, and the sandbox is required (never skipped)."""
        binding, _owner = effective_binding(self.ledger, run)
        projection = intent_contract.load(self.ledger, binding) if binding else None
        if projection is None:
            return settings
        scope = scope_of(projection)
        if not scope.active:
            return settings
        workspace = Path(json.loads(run["options"]).get("workspace") or ".")
        writable, masked = sandbox_paths(scope, workspace)
        scoped = {**settings, "mode": "required", "masked": [*settings.get("masked", []), *masked]}
        if writable is not None:
            scoped["writable"] = writable
        return scoped

    def write_receipt(self, run_id: str, receipt_id: str, fields: dict[str, Any]) -> None:
        """One receipt per decision (a replayed prepare finds it written)."""
        receipt = {"schema_version": "1.0", "receipt_id": receipt_id, **fields, "semantic_model": None,
                   "decided_at": intent_contract.utc_ms()}
        intent_contract.validate("decision-receipt", receipt)
        with self.ledger.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO intent_receipts (receipt_id, run_id, event_ref, data, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (receipt_id, run_id, fields["event_ref"], json.dumps(receipt), time.time()),
            )

    def record_decision(self, params: dict[str, Any]) -> None:
        """An approval or denial of an action the guard sent to the user is the
        user's own decision on that one action: a receipt with authority ``user``."""
        action_id = params.get("action_id")
        asked = self.ledger.one(
            "SELECT run_id, data FROM intent_receipts WHERE event_ref = ? AND json_extract(data, '$.decision')"
            " = 'ask' ORDER BY created_at DESC LIMIT 1",
            action_id,
        )
        if asked is not None:
            data = json.loads(asked["data"])
            approved = params.get("decision") == "approve"
            self.write_receipt(asked["run_id"], f"ir-{action_id}-user", {
                **{k: data[k] for k in ("event_ref", "contract_ref", "contract_version", "rule_ids",
                                        "severity", "reversible")},
                "decision": "continue" if approved else "block",
                "authority": "user",
                "reason_codes": ["user_approved" if approved else "user_denied"],
                "evidence_refs": [],
                "visibility": "user",
                "coverage": "observed",
                "unlock": None,
                "latency_ms": 0,
            })

    # -- completion evidence -------------------------------------------------------------

    def evidence_records(self, run_id: str) -> list[Evidence]:
        """What the runtime ran and recorded for a run, oldest first: a command with
        its exit status (a test suite run directly is ``test`` evidence too), a file
        written, an MCP call that succeeded, a question the user answered."""
        found: list[Evidence] = []
        rows = self.ledger.all(
            "SELECT action_id, tool, input, phase, result FROM actions WHERE run_id = ? AND phase IN ('ok', 'failed')"
            " ORDER BY created_at, loop_index, action_index",
            run_id,
        )
        for row in rows:
            tool, ok = row["tool"], row["phase"] == "ok"
            output = (json.loads(row["result"]) if row["result"] else {}).get("output") or {}
            tool_input = json.loads(row["input"])
            tags = corral_action(tool, tool_input).tags
            if tool == "command.exec":
                code = output.get("exit_code")
                if isinstance(code, int) and not isinstance(code, bool):
                    kinds = {"command", "test"} if is_test_run(command_line(tool_input)) else {"command"}
                    passed = ok and code == 0 and output.get("status") == "exited"
                    found.append(Evidence(row["action_id"], frozenset(kinds), passed, tags))
            elif ok and tool in ("fs.write", "fs.patch", "project.changeset", "project.git_commit"):
                found.append(Evidence(row["action_id"], frozenset({"file"}), True, tags))
            elif ok and tool.startswith("mcp."):
                found.append(Evidence(row["action_id"], frozenset({"api"}), True, tags))
            elif ok and tool == "user.input_request":
                found.append(Evidence(row["action_id"], frozenset({"user"}), True, tags))
        return found

    def evidence(self, run_id: str) -> tuple[dict[str, Any] | None, list[tuple[int, str]], list[str]]:
        """(projection, unmet requirements, verified refs used) of a run's own binding."""
        run = run_store.get_run(self.ledger, run_id)
        projection = intent_contract.load(self.ledger, own_binding(run))
        if projection is None:
            return None, [], []
        missing, used = missing_evidence(projection, self.evidence_records(run_id))
        return projection, missing, used

    def evidence_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        projection, missing, _ = self.evidence(run_id)
        if projection is None or not missing:
            return []
        return [f"{EVIDENCE_PREFIX}: {requirement}" for _, requirement in missing]

    def evidence_park(self, ledger: Ledger, run_id: str, reasons: list[str]) -> str | None:
        if not any(reason.startswith(EVIDENCE_PREFIX) for reason in reasons):
            return None
        run = run_store.get_run(ledger, run_id)
        refused = int(json.loads(run["repairs"]).get(FINAL_BLOCKED_CATEGORY, 0))
        if refused < EVIDENCE_ATTEMPTS:
            return None
        missing = "; ".join(r.removeprefix(EVIDENCE_PREFIX + ": ") for r in reasons if r.startswith(EVIDENCE_PREFIX))
        return (f"{EVIDENCE_PREFIX} after {refused} final replies: {missing[:300]}. Steer the run (corral steer)"
                " or update its contract (corral intent update)")

    # -- updates -------------------------------------------------------------------------

    async def update(self, params: dict[str, Any]) -> dict[str, Any]:
        run = run_store.get_run(self.ledger, param_text(params, "run_id", None, limit=300))
        if RunStatus(run["status"]) in TERMINAL:
            raise SupervisorError(f"run {run['run_id']} is {run['status']}; nothing to rebind", code="conflict")
        try:
            contract = intent_contract.parse(params.get("contract"))
        except ContractError as exc:
            raise BadRequest(f"{exc.code}: {exc}") from None
        current = own_binding(run)
        if current.get("contract_ref") == contract.contract_ref and contract.contract_version <= int(
            current.get("contract_version", 0)
        ):
            raise SupervisorError(
                f"version {contract.contract_version} is not above the bound v{current['contract_version']}",
                code="conflict",
            )
        try:
            intent_contract.store(self.ledger, contract)
        except ContractError as exc:
            raise SupervisorError(f"{exc.code}: {exc}", code="conflict") from None
        update_id = f"iu-{secrets.token_hex(8)}"
        with self.ledger.tx() as db:
            db.execute(
                "INSERT INTO intent_updates (update_id, run_id, contract_ref, contract_version, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (update_id, run["run_id"], contract.contract_ref, contract.contract_version, time.time()),
            )
            if RunStatus(run["status"]) is RunStatus.NEEDS_INPUT and not self._open_question(run["run_id"]):
                run_store.set_run_status(
                    self.ledger, run["run_id"], RunStatus.RUNNING, self.runs.features, "intent updated"
                )
        await self.runs.wake_run(run["run_id"])
        return {"update_id": update_id, "run_id": run["run_id"], **contract.binding()}

    def _open_question(self, run_id: str) -> bool:
        return self.ledger.one("SELECT 1 FROM input_requests WHERE run_id = ? AND answer IS NULL", run_id) is not None

    def apply_updates(self, ledger: Ledger, run_id: str) -> None:
        """At a step boundary: the newest pending update becomes the binding."""
        pending = ledger.all(
            "SELECT * FROM intent_updates WHERE run_id = ? AND applied_at IS NULL ORDER BY created_at",
            run_id,
        )
        if not pending:
            return
        newest = pending[-1]
        run = run_store.get_run(ledger, run_id)
        options = json.loads(run["options"])
        contract = intent_contract.load_contract(ledger, {
            "status": "bound", "contract_ref": newest["contract_ref"], "contract_version": newest["contract_version"]})
        # ``update`` stores the contract before it records the update that names it.
        assert contract is not None, f"intent update {newest['update_id']} names a contract never stored"
        options["intent"] = contract.binding()
        with ledger.tx() as db:
            db.execute("UPDATE runs SET options = ? WHERE run_id = ?", (json.dumps(options), run_id))
            db.execute(
                "UPDATE intent_updates SET applied_at = ? WHERE run_id = ? AND applied_at IS NULL",
                (time.time(), run_id),
            )
            ledger.event("intent-rebound", run_id, contract=newest["contract_ref"], version=newest["contract_version"])

    # -- views ---------------------------------------------------------------------------

    async def receipts(self, params: dict[str, Any]) -> dict[str, Any]:
        return receipts_view(self.ledger, param_text(params, "run_id", None, limit=300))

    async def contract(self, params: dict[str, Any]) -> dict[str, Any]:
        """The contract a run is bound to, as seed 000 sends it."""
        run = run_store.get_run(self.ledger, param_text(params, "run_id", None, limit=300))
        binding, owner = effective_binding(self.ledger, run)
        contract = intent_contract.load_contract(self.ledger, binding) if binding else None
        if contract is None:
            raise SupervisorError(f"run {run['run_id']} is not bound to a contract"
                                  f" ({binding.get('reason', 'none given')})", code="conflict")
        return {"run_id": run["run_id"], "inherited_from": owner if owner != run["run_id"] else None,
                "contract": contract.document()}

    async def snapshot(self, params: dict[str, Any]) -> dict[str, Any]:
        """The continuity snapshot: verified facts only, no body text copied."""
        run = run_store.get_run(self.ledger, param_text(params, "run_id", None, limit=300))
        binding = own_binding(run)
        if binding.get("status") != "bound":
            raise SupervisorError(f"run {run['run_id']} is not bound to a contract ({binding.get('reason', 'none')})",
                                  code="conflict")
        _, missing, used = self.evidence(run["run_id"])
        questions = self.ledger.all(
            "SELECT action_id FROM input_requests WHERE run_id = ? AND answer IS NULL ORDER BY created_at",
            run["run_id"],
        )
        snapshot = {
            "schema_version": "1.0",
            "contract_ref": binding["contract_ref"],
            "contract_version": binding["contract_version"],
            "phase": self.phase(run, missing),
            "open_commitments": list(dict.fromkeys(
                [f"question:{q['action_id']}" for q in questions]
                + [requirement_ref(index, requirement) for index, requirement in missing]
            )),
            "evidence_refs": list(dict.fromkeys(used)),
            "captured_at": intent_contract.utc_ms(),
        }
        intent_contract.validate("continuity-snapshot", snapshot)
        return snapshot

    def phase(self, run: Any, missing: list[tuple[int, str]]) -> str:
        """A working phase only the runtime's records verify, else ``unknown``:
        ``delivered`` (completed with every piece of evidence), ``verification``
        (every piece of evidence recorded, the final reply still to come),
        ``implementation`` (a write or a command ran, evidence still missing)."""
        if not missing:
            return "delivered" if run["status"] == RunStatus.COMPLETED.value else "verification"
        worked = self.ledger.one(
            "SELECT 1 FROM actions WHERE run_id = ? AND phase = 'ok' AND tool IN ('fs.write', 'fs.patch',"
            " 'project.changeset', 'command.exec', 'process.start')",
            run["run_id"],
        )
        return "implementation" if worked is not None else "unknown"

    def show_section(self, run_id: str) -> dict[str, Any]:
        run = run_store.get_run(self.ledger, run_id)
        binding, owner = effective_binding(self.ledger, run)
        count = self.ledger.one("SELECT COUNT(*) AS n FROM intent_receipts WHERE run_id = ?", run_id)
        if not binding:
            return {"status": "none"}
        inherited = {"inherited_from": owner} if owner and owner != run_id else {}
        return {**binding, **inherited, "receipts": int(count["n"]) if count else 0}


def own_binding(run: Any) -> dict[str, Any]:
    """The binding a run was started or rebound with (empty: none)."""
    intent: dict[str, Any] = json.loads(run["options"]).get("intent") or {}
    return intent


def effective_binding(ledger: Ledger, run: Any) -> tuple[dict[str, Any], str | None]:
    """(the binding, the run it was made for): a run's own, else the nearest
    ancestor's (a delegation or an isolated child works under its parent's
    contract)."""
    current: Any = run
    for _ in range(MAX_INHERIT_DEPTH):
        own = own_binding(current)
        if own:
            return own, current["run_id"]
        parent = current["parent_run_id"] if "parent_run_id" in current.keys() else None  # noqa: SIM118 - a row, not a dict
        if not parent:
            break
        current = ledger.one("SELECT run_id, parent_run_id, options FROM runs WHERE run_id = ?", parent)
        if current is None:
            break
    return {}, None


def receipts_view(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """``intent.receipts``: a run's decision receipts and the binding they judged by,
    from ``ledger`` alone (the supervisor's, or a home's read with none running:
    corral/offline_read.py)."""
    run = run_store.get_run(ledger, run_id)
    rows = ledger.all("SELECT data FROM intent_receipts WHERE run_id = ? ORDER BY created_at, receipt_id", run_id)
    binding, owner = effective_binding(ledger, run)
    inherited = {"inherited_from": owner} if owner and owner != run["run_id"] else {}
    return {"run_id": run["run_id"], "intent": {**binding, **inherited},
            "receipts": [json.loads(r["data"]) for r in rows]}


class IntentFeature(RunFeature):
    """The user's intent contract in runs: bound when a run starts, stricter on
    each action, its updates applied at the step boundary, its evidence required
    (or a person asked) before the final reply, a person's decision recorded."""

    def __init__(self, service: IntentService) -> None:
        self.service = service

    def start_options(self, ledger: Ledger, params: Mapping[str, Any]) -> dict[str, Any]:
        intent = params.get("intent")
        return {} if intent is None else {"intent": self.service.bind(intent)}

    def action_guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        return self.service.guard(run, action_id, tool, tool_input)

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        return self.service.evidence_blockers(ledger, run_id)

    def finalize_park(self, ledger: Ledger, run_id: str, reasons: list[str]) -> str | None:
        return self.service.evidence_park(ledger, run_id, reasons)

    def at_boundary(self, ledger: Ledger, run_id: str) -> None:
        self.service.apply_updates(ledger, run_id)

    def on_decision(self, params: dict[str, Any]) -> None:
        self.service.record_decision(params)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"intent": self.service.show_section(run_id)}


def install(sup: Supervisor) -> IntentService:
    service = IntentService(sup.ledger, sup.runs, sup.home)
    sup.control_methods.update({
        "intent.receipts": service.receipts,
        "intent.snapshot": service.snapshot,
        "intent.update": service.update,
        "intent.contract": service.contract,
    })
    return service
