"""Intent contracts: the user's bound intent, validated, identified and versioned.

A run may start with a contract in either form:

* an envelope (``schema_version`` "1.0", ``contract_ref``, ``contract_version``,
  ``source``, ``source_message_refs``, ``snapshot_sha256``, ``updated_at``) with
  its projection (``projection``, or ``task_contract_lite`` when the source is
  ``task-contract-lite``);
* a bare TaskContractLite (the projection alone), whose identity is derived from
  its content (``tcl-<hash>``, version 1).

The projection has exactly seven fields. ``snapshot_sha256`` is the lowercase
SHA-256 of its canonical JSON (RFC 8785: keys sorted recursively, array order
kept). The four wire schemas (2020-12) ship in ``corral/defaults/intent`` and are
enforced with ``jsonschema``. Pure functions, except ``store``/``latest``.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource

from corral.core import strict_json

SCHEMAS = ("task-contract-lite", "envelope", "continuity-snapshot", "decision-receipt")
MAX_SAFE_INTEGER = strict_json.MAX_SAFE_INTEGER


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

    def binding(self) -> dict[str, Any]:
        return {
            "status": "bound",
            "contract_ref": self.contract_ref,
            "contract_version": self.contract_version,
            "snapshot_sha256": self.snapshot_sha256,
        }


@functools.cache
def schema(name: str) -> dict[str, Any]:
    text = resources.files("corral").joinpath(f"defaults/intent/{name}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _registry() -> Registry:
    resources_ = [(schema(name)["$id"], Resource.from_contents(schema(name))) for name in SCHEMAS]
    return Registry().with_resources(resources_)


def validate(name: str, value: Any) -> None:
    """Raise ContractError(schema) with the first problem, by its JSON path."""
    validator = jsonschema.Draft202012Validator(schema(name), registry=_registry())
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(part) for part in errors[0].absolute_path) or "(top)"
        raise ContractError("schema", f"{name} at {where}: {errors[0].message}")


def _check_numbers(value: Any, where: str = "$") -> None:
    """JSON numbers are safe integers only (no floats, nothing past 2^53 - 1)."""
    try:
        strict_json.check_numbers(value, where)
    except strict_json.StrictJsonError as exc:
        raise ContractError(exc.code, exc.message) from None


def canonical_sha256(projection: dict[str, Any]) -> str:
    _check_numbers(projection)
    return strict_json.sha256(projection)


def parse_json_strict(text: str) -> Any:
    """Contract text with duplicate keys, invalid Unicode or non-finite numbers refused."""
    try:
        return strict_json.loads(text)
    except strict_json.StrictJsonError as exc:
        raise ContractError("bad-json" if exc.code == "invalid-unicode" else exc.code, exc.message) from None


def parse(value: Any) -> Contract:
    """An envelope or a bare TaskContractLite; ContractError if it cannot bind."""
    if not isinstance(value, dict):
        raise ContractError("schema", "a contract is a JSON object")
    _check_numbers(value)
    if "schema_version" not in value and "objective" in value:
        validate("task-contract-lite", value)
        digest = canonical_sha256(value)
        return Contract(f"tcl-{digest[:16]}", 1, digest, value, "task-contract-lite")
    validate("envelope", value)
    key = "task_contract_lite" if value["source"] == "task-contract-lite" else "projection"
    projection: dict[str, Any] = value[key]
    digest = canonical_sha256(projection)
    if digest != value["snapshot_sha256"]:
        raise ContractError("hash-mismatch", "snapshot_sha256 does not match the canonical projection")
    return Contract(value["contract_ref"], int(value["contract_version"]), digest, projection, value["source"])


def store(ledger: Any, contract: Contract) -> None:
    """Keep a contract version once. The same projection again is accepted; other
    content at the same version is a collision, and a version below the latest is
    refused (ContractError either way; nothing is written)."""
    same = ledger.one(
        "SELECT snapshot_sha256 FROM intent_contracts WHERE contract_ref = ? AND contract_version = ?",
        contract.contract_ref,
        contract.contract_version,
    )
    if same is not None:
        if same["snapshot_sha256"] != contract.snapshot_sha256:
            raise ContractError(
                "collision", f"{contract.contract_ref} v{contract.contract_version} exists with other content"
            )
        return
    newest = latest(ledger, contract.contract_ref)
    if newest is not None and contract.contract_version < newest:
        raise ContractError(
            "version-backwards",
            f"{contract.contract_ref} v{contract.contract_version} is below the latest version v{newest}",
        )
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO intent_contracts (contract_ref, contract_version, snapshot_sha256, projection, source,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (
                contract.contract_ref,
                contract.contract_version,
                contract.snapshot_sha256,
                json.dumps(contract.projection),
                contract.source,
                time.time(),
            ),
        )


def latest(ledger: Any, contract_ref: str) -> int | None:
    row = ledger.one("SELECT MAX(contract_version) AS v FROM intent_contracts WHERE contract_ref = ?", contract_ref)
    return int(row["v"]) if row is not None and row["v"] is not None else None


def load(ledger: Any, binding: dict[str, Any]) -> dict[str, Any] | None:
    """The projection of a bound run's contract, else None."""
    if binding.get("status") != "bound":
        return None
    row = ledger.one(
        "SELECT projection FROM intent_contracts WHERE contract_ref = ? AND contract_version = ?",
        binding["contract_ref"],
        binding["contract_version"],
    )
    projection: dict[str, Any] | None = json.loads(row["projection"]) if row is not None else None
    return projection


def utc_ms(at: float | None = None) -> str:
    moment = time.time() if at is None else at
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment * 1000) % 1000:03d}Z"
