"""MCP tool catalogs: what a server offers, its fingerprint, and a run's pin.

Pure logic (no I/O but the ledger), tested directly. A server's catalog is the
list of tools it exposes after the spec's allow/deny lists, each with its input
and output schemas, its annotations, its effect (spec first, then the server's
annotations) and corral's policy. Fingerprints are SHA-256 over RFC 8785 canonical
JSON, so the same catalog has the same fingerprint on every machine. A tool's
fingerprint binds everything the model or a policy reads of it (name, description,
schemas, annotations, execution metadata); a catalog's binds the server's config,
its initialize info, its instructions and every tool (seed 004 V1.22: "catalog
identity 绑定 server 配置指纹、initialize server info、instructions 指纹、过滤后的工具名称、
description、input/output schema、annotations 与 execution metadata").

A catalog past a hard limit, with a duplicate or unusable name, a schema that is
not a valid object schema, or a tool that requires task-mode calls is refused
whole (``CatalogRefused``): no part of it is offered ("重复公开 action identity、
非法 schema、required task support 或目录超限失败关闭").

A run pins the catalog of every server when it first sees it. A call whose tool
or catalog changed since (a schema, a description, the instructions; or the tool
vanished) fails closed: no silent drift.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import rfc8785

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.mcp.mcp_spec import McpServerSpec

#: Longest tool name corral accepts from a server (the full name is mcp.<server>.<tool>).
MAX_TOOL_NAME = 64
#: Hard limits of one server's catalog (after allow/deny) and of all a run sees.
#: Chosen to hold every server corral's tests and docs use many times over while
#: keeping one run's tool list a bounded part of a 128,000-token window.
MAX_SERVER_TOOLS = 128
MAX_RUN_TOOLS = 256
MAX_DESCRIPTION = 4_000
MAX_SCHEMA_BYTES = 32 * 1024
MAX_INSTRUCTIONS = 8_000
MAX_SERVER_CATALOG_BYTES = 256 * 1024
MAX_RUN_CATALOG_BYTES = 512 * 1024


class CatalogRefused(Exception):
    """A server's catalog that is offered in no part, and why."""


def canonical_sha256(value: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def _identity(entry: dict[str, Any]) -> dict[str, Any]:
    """What a tool's fingerprint binds: all a model or a policy reads of it."""
    return {
        "name": entry["name"],
        "description": entry.get("description") or "",
        "input_schema": entry.get("input_schema"),
        "output_schema": entry.get("output_schema"),
        "annotations": entry.get("annotations") or {},
        "execution": entry.get("execution"),
    }


def tool_fingerprint(entry: dict[str, Any]) -> str:
    return canonical_sha256(_identity(entry))


@dataclass(frozen=True)
class CatalogTool:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    effect: str
    policy: str
    fingerprint: str
    output_schema: dict[str, Any] | None = None
    #: The server's hints, as it gave them (None: not declared).
    annotations: dict[str, Any] = field(default_factory=dict)
    execution: dict[str, Any] | None = None

    @property
    def full_name(self) -> str:
        return f"mcp.{self.server}.{self.name}"

    @property
    def read_only(self) -> bool:
        """Read-only for the collaboration rules (seed 004 V1.32: "MCP 只有同时声明
        readOnlyHint=true 与 destructiveHint=false 才视为只读"): both hints declared so,
        and the spec did not class it otherwise. Incomplete hints are not."""
        hints = self.annotations
        return self.effect == "read" and hints.get("read_only") is True and hints.get("destructive") is False

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "name": self.name,
            "full_name": self.full_name,
            "description": self.description,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
            "annotations": self.annotations,
            "execution": self.execution,
            "effect": self.effect,
            "policy": self.policy,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CatalogTool:
        # A pin written before annotations were kept has none: never read-only.
        return cls(
            server=data["server"],
            name=data["name"],
            description=data["description"],
            input_schema=data["input_schema"],
            effect=data["effect"],
            policy=data["policy"],
            fingerprint=data["fingerprint"],
            output_schema=data.get("output_schema"),
            annotations=dict(data.get("annotations") or {}),
            execution=data.get("execution"),
        )


def _size(value: Any) -> int:
    return len(rfc8785.dumps(value))


def _schema_problem(what: str, schema: Any) -> str | None:
    """Why ``schema`` is not a usable object schema, or None."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return f"its {what} is not a JSON Schema of type object"
    try:
        size = _size(schema)
    except (TypeError, ValueError, rfc8785.CanonicalizationError) as exc:
        return f"its {what} is not JSON ({exc})"
    if size > MAX_SCHEMA_BYTES:
        return f"its {what} is {size} bytes, past {MAX_SCHEMA_BYTES}"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its {what} is not valid JSON Schema ({exc.message[:200]})"
    return None


def _tool_problem(entry: dict[str, Any]) -> str | None:
    description = entry.get("description") or ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        return f"its description is past {MAX_DESCRIPTION} characters"
    problem = _schema_problem("input schema", entry.get("input_schema"))
    if problem is None and entry.get("output_schema") is not None:
        problem = _schema_problem("output schema", entry.get("output_schema"))
    if problem is None and (entry.get("execution") or {}).get("task_support") == "required":
        problem = "it requires task-mode calls, which corral does not make"
    return problem


def build_catalog(server: McpServerSpec, offered: list[dict[str, Any]]) -> list[CatalogTool]:
    """The exposed tools of a server; ``CatalogRefused`` when any part of what it
    offers breaks a rule: then nothing of it is offered."""
    tools: list[CatalogTool] = []
    seen: set[str] = set()
    for entry in offered:
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_TOOL_NAME or not name.isprintable():
            raise CatalogRefused(f"a tool name {str(name)[:40]!r} is not usable (1-{MAX_TOOL_NAME} printable"
                                 " characters)")
        if name in seen:
            raise CatalogRefused(f"the tool {name!r} is offered twice")
        seen.add(name)
        if not server.exposes(name):
            continue
        problem = _tool_problem(entry)
        if problem is not None:
            raise CatalogRefused(f"the tool {name!r}: {problem}")
        annotations = dict(entry.get("annotations") or {})
        effect = server.effect_of(name, annotations)
        tools.append(
            CatalogTool(
                server=server.id,
                name=name,
                description=str(entry.get("description") or ""),
                input_schema=entry["input_schema"],
                effect=effect,
                policy=server.policy_of(name, effect),
                fingerprint=tool_fingerprint(entry),
                output_schema=entry.get("output_schema"),
                annotations=annotations,
                execution=entry.get("execution"),
            )
        )
    if len(tools) > MAX_SERVER_TOOLS:
        raise CatalogRefused(f"{len(tools)} tools offered, past {MAX_SERVER_TOOLS} per server (narrow it with"
                             " `allow`/`deny`)")
    size = catalog_bytes(tools)
    if size > MAX_SERVER_CATALOG_BYTES:
        raise CatalogRefused(f"its catalog is {size} bytes, past {MAX_SERVER_CATALOG_BYTES} per server")
    tools.sort(key=lambda tool: tool.name)
    return tools


def catalog_bytes(tools: Iterable[CatalogTool]) -> int:
    return sum(_size(tool.as_dict()) for tool in tools)


def check_instructions(instructions: str) -> None:
    if len(instructions) > MAX_INSTRUCTIONS:
        raise CatalogRefused(f"its instructions are {len(instructions)} characters, past {MAX_INSTRUCTIONS}")


def config_fingerprint(server: McpServerSpec) -> str:
    """The server's spec as resolved (program, cwd, templates, lists, approvals)."""
    from pydantic import TypeAdapter

    return canonical_sha256(TypeAdapter(McpServerSpec).dump_python(server, mode="json"))


def catalog_fingerprint(
    tools: list[CatalogTool], *, config: str = "", server_info: dict[str, str] | None = None, instructions: str = ""
) -> str:
    return canonical_sha256({
        "config": config,
        "server_info": server_info or {},
        "instructions_sha256": hashlib.sha256(instructions.encode()).hexdigest(),
        "tools": sorted([tool.name, tool.fingerprint] for tool in tools),
    })


# -- a run's pin ----------------------------------------------------------------------


def pinned(ledger: Ledger, run_id: str) -> dict[str, list[CatalogTool]]:
    rows = ledger.all("SELECT server, tools FROM mcp_pins WHERE run_id = ?", run_id)
    return {row["server"]: [CatalogTool.from_dict(item) for item in json.loads(row["tools"])] for row in rows}


def pinned_fingerprint(ledger: Ledger, run_id: str, server: str) -> str | None:
    row = ledger.one("SELECT fingerprint FROM mcp_pins WHERE run_id = ? AND server = ?", run_id, server)
    return None if row is None else str(row["fingerprint"])


def read_only_tools(ledger: Ledger, run_id: str) -> frozenset[str]:
    """The full names of a run's pinned MCP tools that count as read-only (V1.32)."""
    return frozenset(tool.full_name for tools in pinned(ledger, run_id).values() for tool in tools if tool.read_only)


def pin(ledger: Ledger, run_id: str, server: str, tools: list[CatalogTool], fingerprint: str = "") -> list[CatalogTool]:
    """Pin a server's catalog (its fingerprint, by default of the tools alone) for a
    run once; returns what is pinned (the first wins)."""
    fingerprint = fingerprint or catalog_fingerprint(tools)
    with ledger.tx() as db:
        row = db.execute("SELECT tools FROM mcp_pins WHERE run_id = ? AND server = ?", (run_id, server)).fetchone()
        if row is not None:
            return [CatalogTool.from_dict(item) for item in json.loads(row["tools"])]
        db.execute(
            "INSERT INTO mcp_pins (run_id, server, fingerprint, tools, pinned_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, server, fingerprint, json.dumps([tool.as_dict() for tool in tools]), time.time()),
        )
        ledger.event("mcp-catalog-pinned", run_id, server=server, fingerprint=fingerprint, tools=len(tools))
    return tools


def drift(
    pinned_tool: CatalogTool, live: list[CatalogTool] | None, pinned_catalog: str | None = None,
    live_catalog: str | None = None,
) -> str | None:
    """Why a pinned tool may not be called on the live catalog, or None: both its
    own fingerprint and (when given) its catalog's must still match."""
    if live is None:
        return f"MCP server {pinned_tool.server!r} is not ready"
    for tool in live:
        if tool.name == pinned_tool.name:
            if tool.fingerprint != pinned_tool.fingerprint:
                return (
                    f"{pinned_tool.full_name} changed since this run pinned the catalog (its description, schemas"
                    f" or annotations: {pinned_tool.fingerprint[:12]} -> {tool.fingerprint[:12]}); failing closed"
                )
            if pinned_catalog and live_catalog and pinned_catalog != live_catalog:
                return (
                    f"the catalog of MCP server {pinned_tool.server!r} changed since this run pinned it (its"
                    f" instructions, server info, config or tools: {pinned_catalog[:12]} -> {live_catalog[:12]});"
                    " failing closed"
                )
            return None
    return f"{pinned_tool.full_name} is no longer offered by its server; failing closed"
