"""Every bridge method with its parameter schema (JSON Schema draft 2020-12,
enforced by the store on every request) and its contract: mutating (an
idempotency key), CAS-checked (``expected_revision``), lease-bound (a live
assignment). ``corral bridge methods`` prints this table."""

from __future__ import annotations

from typing import Any

from corral.bridge import commands, history
from corral.bridge.store import Method

_ID = {"type": "string", "pattern": "^[a-z]{2,8}-[0-9a-f]{16}$"}
_KEY = {"type": "string", "minLength": 8, "maxLength": 128, "pattern": "^[A-Za-z0-9_.:-]+$"}
_REV = {"type": "integer", "minimum": 1}
#: A principal's name, in requests and in the registration file alike.
PRINCIPAL_PATTERN = "^[A-Za-z0-9_.-]{1,64}$"
_PRINCIPAL = {"type": "string", "pattern": PRINCIPAL_PATTERN}
_REASON = {"type": "string", "minLength": 1, "maxLength": 500}
_LEASE = {"type": "integer", "minimum": 1000, "maximum": 86_400_000}
_EXTENSIONS = {
    "type": "object",
    "maxProperties": 32,
    # Unknown business data is namespaced: "com.example.field".
    "propertyNames": {"pattern": "^[a-z0-9-]+(\\.[a-z0-9-]+)+$"},
}
_ARTIFACTS = {
    "type": "array",
    "maxItems": 32,
    "items": {
        "type": "object",
        "properties": {"uri": {"type": "string", "maxLength": 2048}, "sha256": {"type": "string",
                                                                              "pattern": "^[0-9a-f]{64}$"}},
        "required": ["uri"],
        "additionalProperties": False,
    },
}
_BODY = {
    "type": "object",
    "properties": {"description": {"type": "string", "maxLength": 20_000}, "extensions": _EXTENSIONS,
                   "artifacts": _ARTIFACTS},
    "additionalProperties": False,
}
_PERMISSIONS = {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": ["read", "claim", "decide"]}}
_GRANT = {
    "type": "object",
    "properties": {
        "principal": _PRINCIPAL,
        "permissions": _PERMISSIONS,
        "lease_cap_ms": _LEASE,
    },
    "required": ["principal", "permissions"],
    "additionalProperties": False,
}


def _params(
    required: dict[str, Any], optional: dict[str, Any] | None = None, *, mutating: bool = True
) -> dict[str, Any]:
    properties = {**required, **(optional or {})}
    names = list(required)
    if mutating:
        properties["idempotency_key"] = _KEY
        names.append("idempotency_key")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": names,
        "additionalProperties": False,
    }


_TASK_FIELDS = {"title": {"type": "string", "minLength": 1, "maxLength": 200}}
_TASK_OPTIONS = {"body": _BODY, "lease_ms": _LEASE, "decider": _PRINCIPAL, "publish": {"type": "boolean"}}

# -- results ---------------------------------------------------------------------------

_TIME = {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}\\.\\d{3}Z$"}
_INT = {"type": "integer", "minimum": 0, "maximum": 9007199254740991}
_OPT_STR = {"type": ["string", "null"]}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


_TASK = _object({
    "task_id": _ID, "owner": _PRINCIPAL, "issuer": _PRINCIPAL, "decider": _PRINCIPAL, "title": {"type": "string"},
    "body": {"type": "object"}, "status": {"enum": ["draft", "open", "assigned", "running", "submitted", "accepted",
                                                   "cancelled"]},
    "revision": _REV, "parent_id": _OPT_STR, "lease_ms": _INT, "created_at": _TIME, "updated_at": _TIME,
})
_ASSIGNMENT = _object({
    "assignment_id": _ID, "task_id": _ID, "principal": _PRINCIPAL, "binding_id": _ID,
    "status": {"enum": ["active", "completed", "released", "expired", "revoked", "cancelled"]},
    "lease_deadline": _TIME, "lease_expired": {"type": "boolean"}, "created_at": _TIME,
})
_RUN = _object({
    "run_id": _ID, "assignment_id": _ID, "task_id": _ID, "status": {"enum": ["running", "completed", "ended"]},
    "reports": {"type": "array", "items": _object({"seq": _INT, "body": {"type": "object"}, "at": _TIME})},
    "created_at": _TIME,
})
_DECISION = _object({"decision_id": _ID, "decider": _PRINCIPAL, "verdict": {"enum": ["accept", "reject"]},
                     "reason": {"type": "string"}, "at": _TIME})
_SUBMISSION = _object({
    "submission_id": _ID, "run_id": _ID, "assignment_id": _ID, "task_id": _ID, "result": {"type": "object"},
    "at": _TIME, "decision": {"anyOf": [_DECISION, {"type": "null"}]},
})
_GRANT_VIEW = _object({"grant_id": _ID, "task_id": _ID, "principal": _PRINCIPAL, "permissions": _PERMISSIONS,
                       "lease_cap_ms": {"type": ["integer", "null"]}, "status": {"enum": ["active", "revoked"]},
                       "auth_epoch": _INT})
_BINDING = _object({"binding_id": _ID, "principal": _PRINCIPAL, "status": {"enum": ["enabled", "disabled"]},
                    "lease_cap_ms": {"type": ["integer", "null"]}, "created_at": _TIME})
_EVENT = _object({"seq": _INT, "at": _TIME, "task_id": _ID, "kind": {"type": "string"}, "revision": _REV,
                  "principal": _PRINCIPAL, "request_id": {"type": "string"}, "data": {"type": "object"}})
_TASK_FACTS = _object({"task": _TASK, "assignments": {"type": "array", "items": _ASSIGNMENT},
                       "runs": {"type": "array", "items": _RUN},
                       "submissions": {"type": "array", "items": _SUBMISSION},
                       "grants": {"type": "array", "items": _GRANT_VIEW},
                       "children": {"type": "array", "items": _ID}})
_ONE_TASK = _object({"task": _TASK})

RESULTS: dict[str, dict[str, Any]] = {
    "bridge.info": _object({"protocol": {"const": "bridge-m1-1"}, "methods": {"type": "array"}, "at": _TIME}),
    "principal.whoami": _object({"principal": _PRINCIPAL, "auth_epoch": _INT, "at": _TIME}),
    "task.create": _ONE_TASK,
    "task.publish": _ONE_TASK,
    "task.cancel": _ONE_TASK,
    "task.createChild": _ONE_TASK,
    "task.get": _object({"task": _TASK, "assignments": {"type": "array", "items": _ASSIGNMENT},
                         "submissions": {"type": "array", "items": _SUBMISSION},
                         "children": {"type": "array", "items": _ID}}),
    "task.discover": _object({"tasks": {"type": "array", "items": _TASK}}),
    "grant.create": _object({"grant": _GRANT_VIEW, "revision": _REV}),
    "grant.revoke": _object({"grant_id": _ID, "auth_epoch": _INT, "revision": _REV}),
    "grant.list": _object({"grants": {"type": "array", "items": _GRANT_VIEW}}),
    "binding.enable": _object({"binding": _BINDING, "auth_epoch": _INT}),
    "binding.disable": _object({"binding_id": _ID, "ended_assignments": {"type": "array", "items": _ID},
                                "auth_epoch": _INT}),
    "binding.list": _object({"bindings": {"type": "array", "items": _BINDING}}),
    "assignment.claim": _object({"assignment": _ASSIGNMENT, "revision": _REV}),
    "assignment.renew": _object({"assignment": _ASSIGNMENT, "revision": _REV}),
    "assignment.release": _object({"assignment_id": _ID, "revision": _REV}),
    "assignment.get": _object({"assignment": _ASSIGNMENT}),
    "run.start": _object({"run": _RUN, "revision": _REV}),
    "run.report": _object({"run_id": _ID, "seq": _INT, "revision": _REV}),
    "run.submit": _object({"submission": _SUBMISSION, "revision": _REV}),
    "run.get": _object({"run": _RUN}),
    "submission.get": _object({"submission": _SUBMISSION}),
    "decision.make": _object({"decision_id": _ID, "verdict": {"enum": ["accept", "reject"]}, "revision": _REV}),
    "snapshot.get": _object({"watermark": _INT, "cursor": _INT, "auth_epoch": _INT,
                             "tasks": {"type": "array", "items": _TASK_FACTS}, "at": _TIME}),
    "events.open": _object({"cursor": _INT, "watermark": _INT}),
    "events.read": _object({"events": {"type": "array", "items": _EVENT}, "cursor": _INT, "more": {"type": "boolean"}}),
    "audit.read": _object({"audit": {"type": "array", "items": _object({
        "seq": _INT, "at": _TIME, "method": {"type": "string"}, "request_id": {"type": "string"},
        "outcome": {"type": "string"}, "reason": {"type": "string"}})}}),
}

#: Every error, for every method: a JSON-RPC error object whose ``data.reason`` names
#: the protocol's error (model.ERROR_CODES); a conflict carries ``current_revision``.
ERROR = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "code": {"type": "integer"},
        "message": {"type": "string"},
        "data": {"type": "object", "properties": {"reason": {"type": "string"},
                                                  "current_revision": _REV, "status": {"type": "string"}}},
    },
    "required": ["code", "message"],
}


_TABLE: list[tuple[str, Any, dict[str, Any], bool, bool, bool, str]] = [
    # name, command, params, mutating, cas, lease-bound, summary
    ("bridge.info", history.bridge_info, _params({}, mutating=False), False, False, False,
     "protocol version and method list"),
    ("principal.whoami", history.principal_whoami, _params({}, mutating=False), False, False, False,
     "the caller and the current auth epoch"),
    ("task.create", commands.task_create, _params(_TASK_FIELDS, _TASK_OPTIONS), True, False, False,
     "a new task (draft, or open with publish)"),
    ("task.publish", commands.task_publish, _params({"task_id": _ID, "expected_revision": _REV}), True, True, False,
     "draft -> open"),
    ("task.get", commands.task_get, _params({"task_id": _ID}, mutating=False), False, False, False,
     "the task with its assignments, submissions and children (read)"),
    ("task.discover", commands.task_discover,
     _params({}, {"limit": {"type": "integer", "minimum": 1, "maximum": 500}}, mutating=False), False, False, False,
     "tasks the caller may claim now"),
    ("task.cancel", commands.task_cancel, _params({"task_id": _ID, "expected_revision": _REV, "reason": _REASON}),
     True, True, False, "cancel; an active assignment ends"),
    ("task.createChild", commands.task_create_child,
     _params({"parent_id": _ID, "expected_revision": _REV, **_TASK_FIELDS},
             {**_TASK_OPTIONS, "grants": {"type": "array", "maxItems": 32, "items": _GRANT}}),
     True, True, False, "child task + relation + grants, atomically; parent revision unchanged"),
    ("grant.create", commands.grant_create,
     _params({"task_id": _ID, "expected_revision": _REV, "principal": _PRINCIPAL,
              "permissions": _PERMISSIONS}, {"lease_cap_ms": _LEASE}),
     True, True, False, "grant read / claim / decide on a task"),
    ("grant.revoke", commands.grant_revoke,
     _params({"task_id": _ID, "expected_revision": _REV, "grant_id": _ID, "reason": _REASON}), True, True, False,
     "revoke; an assignment holding the claim by it ends"),
    ("grant.list", commands.grant_list, _params({"task_id": _ID}, mutating=False), False, False, False,
     "a task's grants (read)"),
    ("binding.enable", commands.binding_enable, _params({}, {"lease_cap_ms": _LEASE}), True, False, False,
     "a new binding (always a new id)"),
    ("binding.disable", commands.binding_disable, _params({"binding_id": _ID, "reason": _REASON}), True, False,
     False, "disable; its active assignments end"),
    ("binding.list", commands.binding_list, _params({}, mutating=False), False, False, False,
     "the caller's bindings"),
    ("assignment.claim", commands.assignment_claim,
     _params({"task_id": _ID, "expected_revision": _REV, "binding_id": _ID}, {"lease_ms": _LEASE}),
     True, True, False, "an assignment with a lease (no run yet)"),
    ("assignment.renew", commands.assignment_renew,
     _params({"task_id": _ID, "expected_revision": _REV, "assignment_id": _ID}, {"lease_ms": _LEASE}),
     True, True, True, "extend the lease (capped by grant and binding)"),
    ("assignment.release", commands.assignment_release,
     _params({"task_id": _ID, "expected_revision": _REV, "assignment_id": _ID, "reason": _REASON}),
     True, True, True, "give the task back"),
    ("assignment.get", commands.assignment_get, _params({"assignment_id": _ID}, mutating=False), False, False,
     False, "one assignment"),
    ("run.start", commands.run_start,
     _params({"task_id": _ID, "expected_revision": _REV, "assignment_id": _ID}), True, True, True,
     "the assignment's unique run"),
    ("run.report", commands.run_report,
     _params({"task_id": _ID, "expected_revision": _REV, "run_id": _ID,
              "body": {"type": "object", "maxProperties": 32}}), True, True, True, "a progress report"),
    ("run.submit", commands.run_submit,
     _params({"task_id": _ID, "expected_revision": _REV, "run_id": _ID,
              "result": {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 20_000},
                                                          "extensions": _EXTENSIONS, "artifacts": _ARTIFACTS},
                         "required": ["summary"], "additionalProperties": False}}),
     True, True, True, "complete assignment and run, create the submission (one transaction)"),
    ("run.get", commands.run_get, _params({"run_id": _ID}, mutating=False), False, False, False,
     "a run with its reports"),
    ("submission.get", commands.submission_get, _params({"submission_id": _ID}, mutating=False), False, False,
     False, "a submission and its decision (read, now)"),
    ("decision.make", commands.decision_make,
     _params({"task_id": _ID, "expected_revision": _REV, "submission_id": _ID,
              "verdict": {"enum": ["accept", "reject"]}, "reason": _REASON}), True, True, False,
     "accept, or reject for a redo; one per submission"),
    ("snapshot.get", history.snapshot_get, _params({}, mutating=False), False, False, False,
     "all readable facts at watermark W"),
    ("events.open", history.events_open,
     _params({}, {"after": {"type": "integer", "minimum": 0}}, mutating=False), False, False, False,
     "start a history read"),
    ("events.read", history.events_read,
     _params({"cursor": {"type": "integer", "minimum": 0}},
             {"limit": {"type": "integer", "minimum": 1, "maximum": history.EVENTS_PAGE_MAX}}, mutating=False),
     False, False, False, "events after the cursor (readable tasks)"),
    ("audit.read", history.audit_read,
     _params({}, {"after": {"type": "integer", "minimum": 0},
                  "limit": {"type": "integer", "minimum": 1, "maximum": history.EVENTS_PAGE_MAX}}, mutating=False),
     False, False, False, "the caller's audit log"),
]

METHODS: dict[str, Method] = {
    name: Method(name, run, params, mutating, cas, lease, summary,
                 {"$schema": "https://json-schema.org/draft/2020-12/schema", **RESULTS[name]})
    for name, run, params, mutating, cas, lease, summary in _TABLE
}
