"""MCP tool catalogs: what a server offers, its fingerprint, and a run's pin.

Pure logic (no I/O but the ledger), tested directly. A server's catalog is the
list of tools it exposes after the spec's allow/deny lists, each with its input
schema, its effect (spec first, then the server's annotations) and corral's
policy. Fingerprints are SHA-256 over RFC 8785 canonical JSON of the name and the
schema, so the same catalog has the same fingerprint on every machine.

A run pins the catalog of every server when it first sees it. A call whose tool
changed since (its schema, or it vanished) fails closed: no silent schema drift.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import rfc8785

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.mcp.mcp_spec import McpServerSpec

#: Longest tool name corral accepts from a server (the full name is mcp.<server>.<tool>).
MAX_TOOL_NAME = 64


def canonical_sha256(value: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def tool_fingerprint(name: str, input_schema: dict[str, Any]) -> str:
    return canonical_sha256({"name": name, "input_schema": input_schema})


@dataclass(frozen=True)
class CatalogTool:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    effect: str
    policy: str
    fingerprint: str

    @property
    def full_name(self) -> str:
        return f"mcp.{self.server}.{self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "name": self.name,
            "full_name": self.full_name,
            "description": self.description,
            "input_schema": self.input_schema,
            "effect": self.effect,
            "policy": self.policy,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CatalogTool:
        return cls(
            server=data["server"],
            name=data["name"],
            description=data["description"],
            input_schema=data["input_schema"],
            effect=data["effect"],
            policy=data["policy"],
            fingerprint=data["fingerprint"],
        )


def build_catalog(server: McpServerSpec, offered: list[dict[str, Any]]) -> tuple[list[CatalogTool], list[str]]:
    """The exposed tools of a server, and the offered names that were skipped (and why)."""
    tools: list[CatalogTool] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for entry in offered:
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_TOOL_NAME or "\x00" in name:
            skipped.append(f"{str(name)[:40]!r}: not a usable tool name")
            continue
        if name in seen:
            skipped.append(f"{name}: offered twice")
            continue
        seen.add(name)
        if not server.exposes(name):
            continue
        schema = entry.get("input_schema")
        if not isinstance(schema, dict):
            schema = {"type": "object"}
        annotations = entry.get("annotations") or {}
        effect = server.effect_of(name, annotations)
        tools.append(
            CatalogTool(
                server=server.id,
                name=name,
                description=str(entry.get("description") or "")[:2000],
                input_schema=schema,
                effect=effect,
                policy=server.policy_of(name, effect),
                fingerprint=tool_fingerprint(name, schema),
            )
        )
    tools.sort(key=lambda tool: tool.name)
    return tools, skipped


def catalog_fingerprint(tools: list[CatalogTool]) -> str:
    return canonical_sha256([{"name": tool.name, "input_schema": tool.input_schema} for tool in tools])


# -- a run's pin ----------------------------------------------------------------------


def pinned(ledger: Ledger, run_id: str) -> dict[str, list[CatalogTool]]:
    rows = ledger.all("SELECT server, tools FROM mcp_pins WHERE run_id = ?", run_id)
    return {row["server"]: [CatalogTool.from_dict(item) for item in json.loads(row["tools"])] for row in rows}


def pin(ledger: Ledger, run_id: str, server: str, tools: list[CatalogTool]) -> list[CatalogTool]:
    """Pin a server's catalog for a run once; returns what is pinned (the first wins)."""
    fingerprint = catalog_fingerprint(tools)
    with ledger.tx() as db:
        row = db.execute("SELECT tools FROM mcp_pins WHERE run_id = ? AND server = ?", (run_id, server)).fetchone()
        if row is not None:
            return [CatalogTool.from_dict(item) for item in json.loads(row["tools"])]
        db.execute(
            "INSERT INTO mcp_pins (run_id, server, fingerprint, tools, pinned_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, server, fingerprint, json.dumps([tool.as_dict() for tool in tools]), __import__("time").time()),
        )
        ledger.event("mcp-catalog-pinned", run_id, server=server, fingerprint=fingerprint, tools=len(tools))
    return tools


def drift(pinned_tool: CatalogTool, live: list[CatalogTool] | None) -> str | None:
    """Why a pinned tool may not be called on the live catalog, or None."""
    if live is None:
        return f"MCP server {pinned_tool.server!r} is not ready"
    for tool in live:
        if tool.name == pinned_tool.name:
            if tool.fingerprint != pinned_tool.fingerprint:
                return (
                    f"the schema of {pinned_tool.full_name} changed since this run pinned the catalog"
                    f" ({pinned_tool.fingerprint[:12]} -> {tool.fingerprint[:12]}); failing closed"
                )
            return None
    return f"{pinned_tool.full_name} is no longer offered by its server; failing closed"
