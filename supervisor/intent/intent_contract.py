"""Intent contracts: the user's bound intent, validated, identified and versioned.

A run may start with a contract in one of the forms seed 000 names:

* a provider document ``{"envelope": {...}, "projection": {...}}``: the envelope
  (wire 1.0: ``schema_version``, ``contract_ref``, ``contract_version``,
  ``source`` = ``user-intent-plugin``, ``source_message_refs``,
  ``snapshot_sha256``, ``updated_at``) names the projection's identity and hash;
* a bare TaskContractLite (the seven-field projection alone), whose identity is
  derived from its content: ``lite:<first 20 hex of its hash>``, version 1.

corral's earlier flat shape (the projection inside the envelope, as
``projection``) is still read. A ``task-contract-lite`` envelope is refused: its
ref and version would be the caller's choice, which the seed forbids.

``snapshot_sha256`` is the SHA-256 of the projection's canonical JSON (RFC 8785:
keys sorted recursively, array order kept, numbers as ECMAScript prints them).
The wire schemas ship in ``corral/defaults/intent``; the checks they cannot say
(trimmed text, template placeholders, the hash, path rules) are here.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import re
import time
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import jsonschema
import rfc8785
from referencing import Registry, Resource

from corral.core import strict_json
from corral.supervisor.intent.intent_scope import ScopeError, path_like_notes, scope_of
from corral.supervisor.intent.intent_shell import js_trim

if TYPE_CHECKING:
    from corral.supervisor.ledger.port import Ledger

SCHEMAS = ("task-contract-lite", "contract-envelope", "provider-contract", "continuity-snapshot",
           "decision-receipt")
MAX_SAFE_INTEGER = strict_json.MAX_SAFE_INTEGER
PROVIDER = "user-intent-plugin"
LITE = "task-contract-lite"
#: The reference guard's `init` template: a contract still holding one is not ready to bind.
PLACEHOLDERS = frozenset({
    "Replace with the exact user-requested outcome.",
    "Replace with the primary object being changed or delivered.",
    "Replace with non-negotiable requirements.",
})
_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[Zz]|([+-]\d{2}:\d{2}))", re.ASCII
)


class ContractError(ValueError):
    """A contract that cannot bind; ``code`` names the rule it broke."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Contract:
    contract_ref: str
    contract_version: int
    snapshot_sha256: str
    projection: dict[str, Any]
    source: str
    #: The provider's envelope as sent (None for a bare TaskContractLite).
    envelope: dict[str, Any] | None = None

    def binding(self) -> dict[str, Any]:
        """What a run keeps of its contract (with its options), and ``show`` prints:
        its identity, and a warning for each scope entry that looks like a path but
        limits nothing (``scope_warnings``, only when there is one)."""
        warnings = path_like_notes(self.projection)
        return {
            "status": "bound",
            "contract_ref": self.contract_ref,
            "contract_version": self.contract_version,
            "snapshot_sha256": self.snapshot_sha256,
            "source": self.source,
            **({"scope_warnings": warnings} if warnings else {}),
        }

    def document(self) -> dict[str, Any]:
        """The contract as seed 000 sends it: ``{envelope, projection}``, or the bare
        TaskContractLite (which any guard turns back into the same identity)."""
        if self.envelope is None:
            return self.projection
        return {"envelope": self.envelope, "projection": self.projection}


# -- the wire schemas -------------------------------------------------------------------------


@functools.cache
def schema(name: str) -> dict[str, Any]:
    text = resources.files("corral").joinpath(f"defaults/intent/{name}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _registry() -> Registry:
    return Registry().with_resources([(schema(name)["$id"], Resource.from_contents(schema(name))) for name in SCHEMAS])


def is_date_time(value: object) -> bool:
    """An RFC 3339 date-time (fractional seconds optional, any offset); the format
    applies to strings only, as JSON Schema says."""
    if not isinstance(value, str):
        return True
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(part) for part in match.group(1, 2, 3, 4, 5, 6))
    try:
        datetime.datetime(year, month, day, hour, minute, min(second, 59))  # 60: a leap second
    except ValueError:
        return False
    offset = match.group(8)
    return second <= 60 and (offset is None or (int(offset[1:3]) <= 23 and int(offset[4:6]) <= 59))


@functools.cache
def _formats() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    checker.checks("date-time")(is_date_time)
    return checker


def validate(name: str, value: Any) -> None:
    """Raise ContractError(schema) with the first problem, by its JSON path."""
    validator = jsonschema.Draft202012Validator(schema(name), registry=_registry(), format_checker=_formats())
    errors = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        where = "/".join(str(part) for part in errors[0].absolute_path) or "(top)"
        raise ContractError("schema", f"{name} at {where}: {errors[0].message}")


# -- canonical JSON ---------------------------------------------------------------------------


def _check_numbers(value: Any, where: str = "$") -> None:
    """Integers past 2^53 - 1 cannot be hashed alike by every language (a JSON parser
    in JavaScript rounds them), and NaN/Infinity are not JSON: both are refused."""
    for leaf, path in strict_json.leaves(value, where):
        if isinstance(leaf, bool):
            continue
        if isinstance(leaf, int) and abs(leaf) > MAX_SAFE_INTEGER:
            raise ContractError("unsafe-number", f"{path}: {leaf} is past 2^53 - 1")
        if isinstance(leaf, float) and not math.isfinite(leaf):
            raise ContractError("unsafe-number", f"{path}: {leaf} is not a finite number")


def canonical(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes: floats and -0 as ECMAScript prints them."""
    _check_numbers(value)
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, UnicodeError) as exc:
        raise ContractError("unsafe-number" if "integer" in str(exc).lower() else "bad-json", str(exc)) from None


def canonical_sha256(value: Any) -> str:
    import hashlib

    return hashlib.sha256(canonical(value)).hexdigest()


def parse_json_strict(text: str | bytes) -> Any:
    """Contract text: duplicate keys, invalid Unicode and non-finite numbers refused."""
    try:
        value = strict_json.loads(text)
    except strict_json.StrictJsonError as exc:
        raise ContractError(exc.code, exc.message) from None
    _check_numbers(value)
    return value


# -- parsing ------------------------------------------------------------------------------------


def _readiness(value: Any, where: str = "$") -> None:
    """Every string trimmed non-empty where the wire says non-empty, no placeholder left."""
    for leaf, path in strict_json.leaves(value, where):
        if isinstance(leaf, str) and js_trim(leaf) in PLACEHOLDERS:
            raise ContractError("placeholder", f"{path} is still the template's placeholder text")


def _blank_strings(value: Any, where: str) -> str | None:
    if isinstance(value, str):
        return where if not js_trim(value) else None
    if isinstance(value, dict):
        return next((w for k, v in value.items() if (w := _blank_strings(v, f"{where}.{k}"))), None)
    if isinstance(value, list):
        return next((w for i, v in enumerate(value) if (w := _blank_strings(v, f"{where}[{i}]"))), None)
    return None


def check_projection(projection: Any) -> dict[str, Any]:
    validate("task-contract-lite", projection)
    blank = _blank_strings(projection, "projection")
    if blank:
        raise ContractError("schema", f"{blank} must not be empty or only whitespace")
    _readiness(projection, "projection")
    try:
        scope_of(projection)
    except ScopeError as exc:
        raise ContractError("scope-syntax", str(exc)) from None
    checked: dict[str, Any] = projection
    return checked


def _check_envelope(envelope: dict[str, Any]) -> None:
    if not js_trim(str(envelope.get("contract_ref", ""))):
        raise ContractError("schema", "contract_ref must not be empty or only whitespace")
    blank = _blank_strings(envelope.get("source_message_refs"), "envelope.source_message_refs")
    if blank:
        raise ContractError("schema", f"{blank} must not be empty or only whitespace")


def parse(value: Any) -> Contract:
    """A contract document (any accepted form); ContractError if it cannot bind."""
    if isinstance(value, (str, bytes)):
        value = parse_json_strict(value)
    if not isinstance(value, dict):
        raise ContractError("schema", "a contract is a JSON object")
    _check_numbers(value)
    if "envelope" in value and "projection" in value:
        validate("provider-contract", value)
        envelope, projection = dict(value["envelope"]), value["projection"]
    elif "schema_version" in value and "contract_ref" in value:
        if value.get("source") == LITE or "task_contract_lite" in value:
            raise ContractError(
                "fallback-envelope",
                "a task-contract-lite envelope carries a ref and version its sender chose; send the bare"
                " TaskContractLite (its identity comes from its content) or a provider document",
            )
        if "projection" not in value:
            raise ContractError("schema", "a user-intent-plugin envelope needs its projection (send"
                                          " {\"envelope\": ..., \"projection\": ...})")
        # corral's earlier flat shape: read as the provider document it stands for.
        envelope = {k: v for k, v in value.items() if k != "projection"}
        projection = value["projection"]
        validate("provider-contract", {"envelope": envelope, "projection": projection})
    else:
        projection = check_projection(value)
        digest = canonical_sha256(projection)
        return Contract(f"lite:{digest[:20]}", 1, digest, projection, LITE)
    _check_envelope(envelope)
    check_projection(projection)
    digest = canonical_sha256(projection)
    if digest != envelope["snapshot_sha256"]:
        raise ContractError("hash-mismatch", "snapshot_sha256 does not match the canonical projection")
    return Contract(envelope["contract_ref"], int(envelope["contract_version"]), digest, projection, PROVIDER,
                    envelope)


# -- the ledger -------------------------------------------------------------------------------


def store(ledger: Ledger, contract: Contract) -> None:
    """Keep a contract version once, in one transaction. The same projection again
    is accepted; other content at a stored version is a collision; any version
    below the ref's newest is refused, even one stored earlier: a ref's versions
    never go backwards, whatever path leads there (ContractError; nothing written)."""
    with ledger.tx() as db:
        rows = db.execute(
            "SELECT contract_version, snapshot_sha256 FROM intent_contracts WHERE contract_ref = ?",
            (contract.contract_ref,),
        ).fetchall()
        versions = {int(row[0]): row[1] for row in rows}
        newest = max(versions) if versions else None
        if newest is not None and contract.contract_version < newest:
            raise ContractError(
                "version-backwards",
                f"{contract.contract_ref} v{contract.contract_version} is below the newest version v{newest}",
            )
        if contract.contract_version in versions:
            if versions[contract.contract_version] != contract.snapshot_sha256:
                raise ContractError(
                    "collision", f"{contract.contract_ref} v{contract.contract_version} exists with other content"
                )
            return
        db.execute(
            "INSERT INTO intent_contracts (contract_ref, contract_version, snapshot_sha256, projection, source,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (
                contract.contract_ref,
                contract.contract_version,
                contract.snapshot_sha256,
                # The document as sent (envelope and projection); rows stored before
                # this hold the bare projection, and load() reads both.
                json.dumps({"envelope": contract.envelope, "projection": contract.projection}),
                contract.source,
                time.time(),
            ),
        )


def latest(ledger: Ledger, contract_ref: str) -> int | None:
    row = ledger.one("SELECT MAX(contract_version) AS v FROM intent_contracts WHERE contract_ref = ?", contract_ref)
    return int(row["v"]) if row is not None and row["v"] is not None else None


def load_contract(ledger: Ledger, binding: dict[str, Any]) -> Contract | None:
    """The stored contract a binding names, else None."""
    if binding.get("status") != "bound":
        return None
    row = ledger.one(
        "SELECT snapshot_sha256, projection, source FROM intent_contracts WHERE contract_ref = ?"
        " AND contract_version = ?",
        binding["contract_ref"],
        binding["contract_version"],
    )
    if row is None:
        return None
    stored = json.loads(row["projection"])
    if set(stored) == {"envelope", "projection"}:
        envelope, projection = stored["envelope"], stored["projection"]
    else:
        envelope, projection = None, stored
    source = PROVIDER if row["source"] == PROVIDER else LITE
    if source == PROVIDER and envelope is None:
        # Stored before envelopes were kept: what the ledger knows of it.
        envelope = {"schema_version": "1.0", "contract_ref": binding["contract_ref"],
                    "contract_version": int(binding["contract_version"]), "source": PROVIDER,
                    "source_message_refs": [], "snapshot_sha256": row["snapshot_sha256"],
                    "updated_at": utc_ms(0)}
    return Contract(binding["contract_ref"], int(binding["contract_version"]), row["snapshot_sha256"], projection,
                    source, envelope)


def load(ledger: Ledger, binding: dict[str, Any]) -> dict[str, Any] | None:
    """The projection of a bound run's contract, else None."""
    contract = load_contract(ledger, binding)
    return contract.projection if contract is not None else None


def utc_ms(at: float | None = None) -> str:
    moment = time.time() if at is None else at
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment * 1000) % 1000:03d}Z"
