"""Intent contracts on the supervisor: binding, the guard, receipts, evidence, updates.

A run starts bound (its contract stored once, the binding kept in the run's
options) or unbound with the reason: fail-open, the run works under the normal
policy and nothing fills the gap from a summary or model output. Every action of
a bound run is classified before it is prepared (supervisor/intent_guard.py) and
each decision writes a receipt in the guard's wire shape. The final reply waits
for verified completion evidence (results the runtime recorded, never the
model's claim); after a few refusals the run parks in ``needs-input``. An update
with a higher version rebinds the run at its next safe boundary. corral never
writes back to the intent source.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import TYPE_CHECKING, Any

from corral.supervisor import finalization, intent_contract, run_service, run_store
from corral.supervisor.errors import BadRequest, SupervisorError
from corral.supervisor.intent_contract import ContractError
from corral.supervisor.intent_guard import classify, evidence_sources, missing_evidence
from corral.supervisor.params import param_text
from corral.supervisor.run_state import TERMINAL, RunStatus

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

#: Final replies refused for missing evidence before the run parks for a person.
EVIDENCE_ATTEMPTS = 1
EVIDENCE_PREFIX = "completion evidence missing"


class IntentService:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.ledger = sup.ledger

    # -- binding ------------------------------------------------------------------------

    def bind(self, value: Any) -> dict[str, Any]:
        try:
            contract = intent_contract.parse(value)
            intent_contract.store(self.ledger, contract)
        except ContractError as exc:
            return {"status": "unbound", "reason": f"{exc.code}: {exc}", "advisory": True}
        return contract.binding()

    def binding(self, run: Any) -> dict[str, Any]:
        intent: dict[str, Any] = json.loads(run["options"]).get("intent") or {}
        return intent

    # -- the guard ----------------------------------------------------------------------

    def guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        binding = self.binding(run)
        projection = intent_contract.load(self.ledger, binding)
        if projection is None:
            return "continue", ""
        started = time.monotonic()
        decision = classify(projection, tool, tool_input)
        self.write_receipt(
            run["run_id"],
            f"ir-{action_id}-{binding['contract_version']}",
            {
                "event_ref": action_id,
                "contract_ref": binding["contract_ref"],
                "contract_version": binding["contract_version"],
                "decision": decision.decision,
                "authority": "deterministic_rule",
                "severity": decision.severity,
                "reason_codes": list(decision.reason_codes),
                "rule_ids": list(decision.rule_ids),
                "evidence_refs": [],
                "visibility": decision.visibility,
                "reversible": decision.decision != "block",
                "coverage": "observed",
                "latency_ms": int((time.monotonic() - started) * 1000),
            },
        )
        return decision.decision, decision.detail

    def write_receipt(self, run_id: str, receipt_id: str, fields: dict[str, Any]) -> None:
        """One receipt per decision (a replayed prepare finds it written)."""
        receipt = {"receipt_id": receipt_id, **fields, "decided_at": intent_contract.utc_ms()}
        intent_contract.validate("decision-receipt", receipt)
        with self.ledger.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO intent_receipts (receipt_id, run_id, event_ref, data, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (receipt_id, run_id, fields["event_ref"], json.dumps(receipt), time.time()),
            )

    def wrap_decision(self, handler: Any) -> Any:
        """An approval or denial of an action the guard sent to the user is the
        user's own decision on that one action: a receipt with authority ``user``."""

        async def decide(params: dict[str, Any]) -> dict[str, Any]:
            result: dict[str, Any] = await handler(params)
            action_id = params.get("action_id")
            asked = self.ledger.one(
                "SELECT run_id, data FROM intent_receipts WHERE event_ref = ? AND json_extract(data, '$.decision')"
                " = 'ask' ORDER BY created_at DESC LIMIT 1",
                action_id,
            )
            if asked is not None:
                data = json.loads(asked["data"])
                approved = params.get("decision") == "approve"
                self.write_receipt(
                    asked["run_id"],
                    f"ir-{action_id}-user",
                    {
                        **{k: data[k] for k in ("event_ref", "contract_ref", "contract_version", "rule_ids")},
                        "decision": "continue" if approved else "block",
                        "authority": "user",
                        "severity": data["severity"],
                        "reason_codes": ["user-approved" if approved else "user-denied"],
                        "evidence_refs": [],
                        "visibility": "user",
                        "reversible": False,
                        "coverage": "observed",
                        "latency_ms": 0,
                    },
                )
            return result

        return decide

    # -- completion evidence -------------------------------------------------------------

    def evidence(self, run_id: str) -> tuple[dict[str, Any] | None, list[str], list[str]]:
        """(projection, unmet requirements, verified refs used) of a run."""
        run = run_store.get_run(self.ledger, run_id)
        projection = intent_contract.load(self.ledger, self.binding(run))
        if projection is None:
            return None, [], []
        refs = [
            (row["action_id"], evidence_sources(row["tool"], json.loads(row["input"])))
            for row in self.ledger.all(
                "SELECT action_id, tool, input FROM actions WHERE run_id = ? AND phase = 'ok' ORDER BY created_at",
                run_id,
            )
        ]
        missing, used = missing_evidence(projection, refs)
        return projection, missing, used

    def evidence_blockers(self, ledger: Any, run_id: str) -> list[str]:
        projection, missing, _ = self.evidence(run_id)
        if projection is None or not missing:
            return []
        return [f"{EVIDENCE_PREFIX}: {requirement}" for requirement in missing]

    def evidence_park(self, ledger: Any, run_id: str, reasons: list[str]) -> str | None:
        if not any(reason.startswith(EVIDENCE_PREFIX) for reason in reasons):
            return None
        run = run_store.get_run(ledger, run_id)
        refused = int(json.loads(run["repairs"]).get("final-blocked", 0))
        if refused < EVIDENCE_ATTEMPTS:
            return None
        missing = "; ".join(r.removeprefix(EVIDENCE_PREFIX + ": ") for r in reasons if r.startswith(EVIDENCE_PREFIX))
        return (f"{EVIDENCE_PREFIX} after {refused} final replies: {missing[:300]}. Steer the run (corral steer)"
                " or update its contract (corral intent update)")

    # -- updates -------------------------------------------------------------------------

    async def update(self, params: dict[str, Any]) -> dict[str, Any]:
        run = run_store.get_run(self.ledger, param_text(params, "run_id", None, limit=300))
        if RunStatus(run["status"]) in TERMINAL:
            raise SupervisorError(f"run {run['run_id']} is {run['status']}; nothing to rebind", "conflict")
        try:
            contract = intent_contract.parse(params.get("contract"))
        except ContractError as exc:
            raise BadRequest(f"{exc.code}: {exc}") from None
        current = self.binding(run)
        if current.get("contract_ref") == contract.contract_ref and contract.contract_version <= int(
            current.get("contract_version", 0)
        ):
            raise SupervisorError(
                f"version {contract.contract_version} is not above the bound v{current['contract_version']}",
                "conflict",
            )
        try:
            intent_contract.store(self.ledger, contract)
        except ContractError as exc:
            raise SupervisorError(f"{exc.code}: {exc}", "conflict") from None
        update_id = f"iu-{secrets.token_hex(8)}"
        with self.ledger.tx() as db:
            db.execute(
                "INSERT INTO intent_updates (update_id, run_id, contract_ref, contract_version, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (update_id, run["run_id"], contract.contract_ref, contract.contract_version, time.time()),
            )
            if RunStatus(run["status"]) is RunStatus.NEEDS_INPUT and not self._open_question(run["run_id"]):
                run_store.set_run_status(self.ledger, run["run_id"], RunStatus.RUNNING, "intent updated")
        await self.sup.services["runs"].wake_run(run["run_id"])
        return {"update_id": update_id, "run_id": run["run_id"], **contract.binding()}

    def _open_question(self, run_id: str) -> bool:
        return self.ledger.one("SELECT 1 FROM input_requests WHERE run_id = ? AND answer IS NULL", run_id) is not None

    def apply_updates(self, ledger: Any, run_id: str) -> None:
        """At a step boundary: the newest pending update becomes the binding."""
        pending = ledger.all(
            "SELECT * FROM intent_updates WHERE run_id = ? AND applied_at IS NULL ORDER BY contract_version",
            run_id,
        )
        if not pending:
            return
        newest = pending[-1]
        run = run_store.get_run(ledger, run_id)
        options = json.loads(run["options"])
        row = ledger.one(
            "SELECT snapshot_sha256 FROM intent_contracts WHERE contract_ref = ? AND contract_version = ?",
            newest["contract_ref"],
            newest["contract_version"],
        )
        options["intent"] = {
            "status": "bound",
            "contract_ref": newest["contract_ref"],
            "contract_version": int(newest["contract_version"]),
            "snapshot_sha256": row["snapshot_sha256"],
        }
        with ledger.tx() as db:
            db.execute("UPDATE runs SET options = ? WHERE run_id = ?", (json.dumps(options), run_id))
            db.execute(
                "UPDATE intent_updates SET applied_at = ? WHERE run_id = ? AND applied_at IS NULL",
                (time.time(), run_id),
            )
            ledger.event("intent-rebound", run_id, contract=newest["contract_ref"], version=newest["contract_version"])

    # -- views ---------------------------------------------------------------------------

    async def receipts(self, params: dict[str, Any]) -> dict[str, Any]:
        run = run_store.get_run(self.ledger, param_text(params, "run_id", None, limit=300))
        rows = self.ledger.all(
            "SELECT data FROM intent_receipts WHERE run_id = ? ORDER BY created_at, receipt_id", run["run_id"]
        )
        return {"run_id": run["run_id"], "intent": self.binding(run), "receipts": [json.loads(r["data"]) for r in rows]}

    async def snapshot(self, params: dict[str, Any]) -> dict[str, Any]:
        """The continuity snapshot: verified facts only, no body text copied."""
        run = run_store.get_run(self.ledger, param_text(params, "run_id", None, limit=300))
        binding = self.binding(run)
        if binding.get("status") != "bound":
            raise SupervisorError(f"run {run['run_id']} is not bound to a contract ({binding.get('reason', 'none')})",
                                  "conflict")
        _, missing, used = self.evidence(run["run_id"])
        snapshot = {
            "schema_version": "1.0",
            "contract_ref": binding["contract_ref"],
            "contract_version": binding["contract_version"],
            "phase": str(run["status"]) or "unknown",
            "open_commitments": list(dict.fromkeys(missing)),
            "evidence_refs": list(dict.fromkeys(used)),
            "captured_at": intent_contract.utc_ms(),
        }
        intent_contract.validate("continuity-snapshot", snapshot)
        return snapshot

    def show_section(self, run_id: str) -> dict[str, Any]:
        run = run_store.get_run(self.ledger, run_id)
        binding = self.binding(run)
        count = self.ledger.one("SELECT COUNT(*) AS n FROM intent_receipts WHERE run_id = ?", run_id)
        return {**binding, "receipts": int(count["n"]) if count else 0} if binding else {"status": "none"}


def install(sup: Supervisor) -> IntentService:
    service = IntentService(sup)
    sup.services["intent"] = service
    run_service.ACTION_GUARDS.append(service.guard)
    run_service.SHOW_SECTIONS["intent"] = service.show_section
    finalization.BLOCKERS.append(service.evidence_blockers)
    finalization.PARKERS.append(service.evidence_park)
    run_store.BOUNDARY_HOOKS.append(service.apply_updates)
    sup.control_methods.update(
        {"intent.receipts": service.receipts, "intent.snapshot": service.snapshot, "intent.update": service.update}
    )
    sup.control_methods["continue_action"] = service.wrap_decision(sup.control_methods["continue_action"])
    return service
