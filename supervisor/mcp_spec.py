"""``[[mcp_servers]]`` in a swarm spec: MCP servers as supervised tool sources.

Parsing is as strict as the rest of the spec: an unknown key, a wrong type or an
impossible value is a ``SpecError`` naming the place. Secrets never sit in the
spec: headers and env values name environment variables (``${NAME}``), which only
the server's actor expands, so the ledger and the logs see the template alone.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

EFFECTS = ("read", "idempotent", "external")
APPROVALS = ("auto", "confirm", "writes", "deny")
_ID = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_SERVER_KEYS = {
    "id",
    "command",
    "url",
    "cwd",
    "env",
    "headers",
    "allow",
    "deny",
    "effect",
    "approval",
    "startup_timeout_s",
    "call_timeout_s",
    "tools",
    "restart",
    "max_restarts",
    "period_s",
}
_TOOL_KEYS = {"effect", "approval"}


class McpSpecError(ValueError):
    """Raised as the spec's own SpecError by the caller."""


@dataclass(frozen=True)
class McpToolSettings:
    effect: str | None = None
    approval: str | None = None


@dataclass(frozen=True)
class McpServerSpec:
    id: str
    command: tuple[str, ...] = ()
    url: str | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    allow: tuple[str, ...] = ("*",)
    deny: tuple[str, ...] = ()
    #: None: the spec is silent, so the tool's annotations decide (then external).
    effect: str | None = None
    approval: str = "writes"
    startup_timeout_s: float = 20.0
    call_timeout_s: float = 60.0
    tools: dict[str, McpToolSettings] = field(default_factory=dict)
    max_restarts: int = 5
    period_s: float = 30.0

    @property
    def actor_id(self) -> str:
        return f"mcp-{self.id}"

    @property
    def env_names(self) -> tuple[str, ...]:
        """Environment variables the server's actor may see despite the scrub."""
        names: set[str] = set()
        for value in (*self.env.values(), *self.headers.values()):
            names.update(_VAR.findall(value))
        return tuple(sorted(names))

    def exposes(self, tool: str) -> bool:
        allowed = any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.allow)
        return allowed and not any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.deny)

    def effect_of(self, tool: str, annotations: dict[str, Any]) -> str:
        """Per-tool spec, then the server's spec, then the tool's own hints."""
        override = self.tools.get(tool)
        if override is not None and override.effect is not None:
            return override.effect
        if self.effect is not None:
            return self.effect
        if annotations.get("read_only"):
            return "read"
        if annotations.get("idempotent") and not annotations.get("destructive"):
            return "idempotent"
        return "external"

    def policy_of(self, tool: str, effect: str) -> str:
        """corral's policy (auto | confirm | deny) for one tool of this server."""
        override = self.tools.get(tool)
        approval = override.approval if override is not None and override.approval else self.approval
        if approval == "writes":
            return "auto" if effect in ("read", "idempotent") else "confirm"
        return approval

    def actor_params(self) -> dict[str, Any]:
        """What the actor needs: templates only, never an expanded secret."""
        return {
            "server": {
                "id": self.id,
                "command": list(self.command),
                "url": self.url,
                "cwd": self.cwd,
                "env": dict(self.env),
                "headers": dict(self.headers),
                "startup_timeout_s": self.startup_timeout_s,
            }
        }


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) and 0 < len(item) <= 4096 for item in value):
        raise McpSpecError(f"{where}: expected a list of non-empty strings")
    if len(value) > 256:
        raise McpSpecError(f"{where}: at most 256 entries")
    return tuple(value)


def _string_map(where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 256 and len(v) <= 8192 for k, v in value.items()
    ):
        raise McpSpecError(f"{where}: expected a table of strings")
    return dict(value)


def _seconds(where: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise McpSpecError(f"{where}: expected a finite number of seconds")
    if not low <= value <= high:
        raise McpSpecError(f"{where}: must be between {low:g} and {high:g}, got {value}")
    return float(value)


def _choice(where: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise McpSpecError(f"{where}: {value!r} is not one of {', '.join(choices)}")
    return str(value)


def _check_keys(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise McpSpecError(f"{where}: unknown key {key!r}{hint}")


def _url(where: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > 2048:
        raise McpSpecError(f"{where}: expected a URL")
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise McpSpecError(f"{where}: {value!r} is not an http(s) URL")
    return value


def parse_server(where: str, table: Any) -> McpServerSpec:
    if not isinstance(table, dict):
        raise McpSpecError(f"{where}: expected a table")
    _check_keys(where, table, _SERVER_KEYS)
    raw_id = table.get("id")
    if not isinstance(raw_id, str) or not _ID.match(raw_id):
        raise McpSpecError(f"{where}.id: must match {_ID.pattern}")
    has_command, has_url = "command" in table, "url" in table
    if has_command == has_url:
        raise McpSpecError(f"{where}: give exactly one of command (stdio) or url (Streamable HTTP)")
    command = _strings(f"{where}.command", table["command"]) if has_command else ()
    if has_command and not command:
        raise McpSpecError(f"{where}.command: must name a program")
    tools: dict[str, McpToolSettings] = {}
    tools_table = table.get("tools", {})
    if not isinstance(tools_table, dict):
        raise McpSpecError(f"{where}.tools: expected a table of tool names")
    for name, settings in tools_table.items():
        tool_where = f"{where}.tools.{name}"
        if not isinstance(settings, dict):
            raise McpSpecError(f"{tool_where}: expected a table")
        _check_keys(tool_where, settings, _TOOL_KEYS)
        tools[name] = McpToolSettings(
            effect=_choice(f"{tool_where}.effect", settings["effect"], EFFECTS) if "effect" in settings else None,
            approval=(
                _choice(f"{tool_where}.approval", settings["approval"], APPROVALS) if "approval" in settings else None
            ),
        )
    max_restarts = table.get("max_restarts", 5)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or not 0 <= max_restarts <= 1000:
        raise McpSpecError(f"{where}.max_restarts: must be an integer between 0 and 1000")
    cwd = table.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or len(cwd) > 4096):
        raise McpSpecError(f"{where}.cwd: expected a path")
    return McpServerSpec(
        id=raw_id,
        command=command,
        url=_url(f"{where}.url", table["url"]) if has_url else None,
        cwd=cwd,
        env=_string_map(f"{where}.env", table.get("env", {})),
        headers=_string_map(f"{where}.headers", table.get("headers", {})),
        allow=_strings(f"{where}.allow", table.get("allow", ["*"])),
        deny=_strings(f"{where}.deny", table.get("deny", [])),
        effect=_choice(f"{where}.effect", table["effect"], EFFECTS) if "effect" in table else None,
        approval=_choice(f"{where}.approval", table.get("approval", "writes"), APPROVALS),
        startup_timeout_s=_seconds(f"{where}.startup_timeout_s", table.get("startup_timeout_s", 20.0), 0.5, 600),
        call_timeout_s=_seconds(f"{where}.call_timeout_s", table.get("call_timeout_s", 60.0), 0.1, 3600),
        tools=tools,
        max_restarts=max_restarts,
        period_s=_seconds(f"{where}.period_s", table.get("period_s", 30.0), 0.1, 86400),
    )


def parse_servers(value: Any, project_root: Path) -> tuple[McpServerSpec, ...]:
    if not isinstance(value, list):
        raise McpSpecError("mcp_servers: expected an array of tables ([[mcp_servers]])")
    servers: list[McpServerSpec] = []
    seen: set[str] = set()
    for index, table in enumerate(value):
        server = parse_server(f"mcp_servers[{index}]", table)
        if server.id in seen:
            raise McpSpecError(f"mcp_servers[{index}].id: duplicate server id {server.id!r}")
        seen.add(server.id)
        if server.command:
            cwd = (project_root / (server.cwd or ".")).resolve()
            server = McpServerSpec(**{**server.__dict__, "cwd": str(cwd)})
        servers.append(server)
    return tuple(servers)


def split_tool_name(name: str) -> tuple[str, str] | None:
    """``mcp.<server>.<tool>`` -> (server, tool); None for any other name."""
    if not name.startswith("mcp."):
        return None
    server, sep, tool = name[4:].partition(".")
    if not sep or not server or not tool:
        return None
    return server, tool
