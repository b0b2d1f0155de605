"""``[[mcp_servers]]`` in a swarm spec: MCP servers as supervised tool sources.

Parsing is as strict as the rest of the spec (supervisor/spec/spec_base.py): an
unknown key, a wrong type or an impossible value is a ``SpecError`` naming the
place. Secrets never sit in the spec: headers and env values name credentials
(``${NAME}``) of the user's private credentials file (corral/core/mcp_credentials.py),
which only the server's actor reads, so the ledger and the logs see the template
alone. The host's environment is never a credential fallback (seed 004 V1.22).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import Field, StrictFloat, StrictInt, StrictStr, field_validator, model_validator
from pydantic.dataclasses import dataclass

from corral.core.mcp_credentials import CredentialsError, credentials_file, read_credentials
from corral.core.redact import register_secret
from corral.supervisor.spec.spec_base import SECTION, Reader, SpecError, problem, spec_path, spec_program
from corral.supervisor.tree.restart_policy import RestartType

EFFECTS = ("read", "idempotent", "external")
APPROVALS = ("auto", "confirm", "writes", "deny")
Effect = Literal["read", "idempotent", "external"]
Approval = Literal["auto", "confirm", "writes", "deny"]
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_Entry = Annotated[StrictStr, Field(min_length=1, max_length=4096)]
_Strings = Annotated[tuple[_Entry, ...], Field(max_length=256)]
_Table = dict[Annotated[StrictStr, Field(max_length=256)], Annotated[StrictStr, Field(max_length=8192)]]

#: The old name, still caught by callers.
McpSpecError = SpecError


@dataclass(frozen=True, kw_only=True, config=SECTION)
class McpToolSettings:
    """``[mcp_servers.tools.<tool>]``: one tool's settings, over its server's."""

    effect: Effect | None = Field(default=None, description="This tool's effect class, over the server's `effect`.")
    approval: Approval | None = Field(default=None, description="This tool's approval, over the server's `approval`.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class McpServerSpec:
    """``[[mcp_servers]]``: an MCP server whose tools agents may call as
    ``mcp.<id>.<tool>``; one actor (``mcp-<id>``) in a group of its own (docs/mcp.md)."""

    id: Annotated[StrictStr, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = Field(
        description="The server's id: its tools are `mcp.<id>.<tool>`.")
    command: _Strings = Field(
        default=(), description="A stdio server: the program and its arguments (or give `url`). A program with a"
        " `/` is a path relative to the spec (it must exist and be executable); a bare name (`uvx`) is looked up"
        " on PATH, and `python` is the interpreter corral runs on. With `cwd` unset the server runs in the spec's"
        " directory, so a relative path among the arguments is relative to the spec too.")
    url: StrictStr | None = Field(
        default=None, max_length=2048, description="A Streamable HTTP server: its http(s) URL (or give `command`).")
    cwd: StrictStr | None = Field(
        default=None, max_length=4096, description="A stdio server's working directory, relative to the spec; unset:"
        " the spec's directory.")
    env: _Table = Field(
        default_factory=dict, description="A stdio server's environment; `${NAME}` in a value is the credential"
        " NAME of the private file ~/.config/corral/mcp-credentials.toml (mode 0600), never a variable of the"
        " host's environment; expanded in the server's actor only (the spec and the ledger keep the template).")
    headers: _Table = Field(
        default_factory=dict, description="HTTP headers of a url server, with `${NAME}` expanded as in `env`.")
    allow: _Strings = Field(default=("*",), description="Globs of the server's tools that are offered.")
    deny: _Strings = Field(default=(), description="Globs of its tools that are never offered, over `allow`.")
    #: None: the spec is silent, so the tool's annotations decide (then external).
    effect: Effect | None = Field(
        default=None, description="The effect class of its tools; unset: each tool's annotations decide (read-only,"
        " idempotent), else `external`.")
    approval: Approval = Field(
        default="confirm",
        description="`confirm` (the default, as seed 004 says): every tool asks a person; `writes`: reads and"
        " idempotent tools run, others ask; `auto` or `deny` for all of them.")
    startup_timeout_s: StrictFloat = Field(
        default=20.0, ge=0.5, le=600,
        description="Seconds to start and list its tools.")
    call_timeout_s: StrictFloat = Field(default=60.0, ge=0.1, le=3600, description="Seconds for one tool call.")
    tools: dict[StrictStr, McpToolSettings] = Field(
        default_factory=dict, description="Per-tool settings, by the tool's name on the server.")
    restart: RestartType = Field(
        default=RestartType.PERMANENT, description="Accepted, not read: a server's actor is always restarted.")
    max_restarts: StrictInt = Field(
        default=5, ge=0, le=1000,
        description="Restarts of its actor allowed within `period_s`.")
    period_s: StrictFloat = Field(default=30.0, ge=0.1, le=86_400, description="The window of `max_restarts`.")

    @field_validator("command")
    @classmethod
    def _a_program(cls, command: tuple[str, ...]) -> tuple[str, ...]:
        if not command:
            raise problem("must name a program")
        return command

    @field_validator("url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        parsed = urlparse(url or "")
        if url is not None and (parsed.scheme not in ("http", "https") or not parsed.hostname):
            raise problem(f"{url!r} is not an http(s) URL")
        return url

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if bool(self.command) == (self.url is not None):
            raise problem("give exactly one of command (stdio) or url (Streamable HTTP)")
        return self

    @property
    def actor_id(self) -> str:
        return f"mcp-{self.id}"

    @property
    def credential_names(self) -> tuple[str, ...]:
        """The credentials its ``env`` and ``headers`` name."""
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

    def actor_params(self, credentials_file: Path) -> dict[str, Any]:
        """What the actor needs: templates and where the credentials are, never an
        expanded secret."""
        return {
            "server": {
                "id": self.id,
                "command": list(self.command),
                "url": self.url,
                "cwd": self.cwd,
                "env": dict(self.env),
                "headers": dict(self.headers),
                "startup_timeout_s": self.startup_timeout_s,
                "credentials_file": str(credentials_file),
            }
        }


_READER = Reader(McpServerSpec)


def parse_server(where: str, table: Any) -> McpServerSpec:
    """One ``[[mcp_servers]]`` table read alone, its places named from ``where``."""
    return _READER.read(table, root=where)


def resolve_servers(servers: list[McpServerSpec], base: Path) -> tuple[McpServerSpec, ...]:
    """Ids unique; a stdio server's program path and working directory resolved
    against ``base``, the spec's directory, as every path of a spec is."""
    base = base.resolve()  # named in messages
    seen: set[str] = set()
    resolved: list[McpServerSpec] = []
    for index, server in enumerate(servers):
        where = f"mcp_servers[{index}]"
        if server.id in seen:
            raise SpecError(f"{where}.id: duplicate server id {server.id!r}")
        seen.add(server.id)
        if server.command:
            cwd = spec_path(base, server.cwd or ".")
            if not cwd.is_dir():
                raise SpecError(f"{where}.cwd: {cwd} is not a directory (a relative cwd is relative to the spec's"
                                f" directory {base})")
            program, *args = server.command
            server = dataclasses.replace(server, cwd=str(cwd), command=(_program(where, program, base), *args))
        resolved.append(server)
    return tuple(resolved)


def _program(where: str, program: str, base: Path) -> str:
    """A bare name stays a name (PATH finds it when the server starts); a path is
    the spec's, checked now where it points, so a typo stops ``corral up`` instead
    of every start. It is run by the path written, made absolute (a venv's python
    is a symlink that finds its venv through its own name)."""
    if "/" not in program and not program.startswith("~"):
        return program
    written, path = spec_program(base, program)
    relative = "" if Path(program).expanduser().is_absolute() else f" (relative to the spec's directory {base})"
    if not path.is_file():
        raise SpecError(f"{where}.command: no program {program!r} at {path}{relative}")
    if not os.access(path, os.X_OK):
        raise SpecError(f"{where}.command: {path} is not executable; `chmod +x` it, or start it with an"
                        f" interpreter (command = [\"python\", {json.dumps(program)}])")
    return str(written)


def register_mcp_credentials(servers: tuple[McpServerSpec, ...]) -> None:
    """The credentials the servers name become secrets of this process too: the
    supervisor relays and records what servers answer, and one may echo a token.
    A file that cannot be read registers nothing: the server's actor reports it."""
    names = {name for server in servers for name in server.credential_names}
    if not names:
        return
    path = credentials_file(os.environ)
    try:
        credentials = read_credentials(path)
    except CredentialsError:
        return
    for name in sorted(names):
        register_secret(credentials.get(name) or "")


def split_tool_name(name: str) -> tuple[str, str] | None:
    """``mcp.<server>.<tool>`` -> (server, tool); None for any other name."""
    if not name.startswith("mcp."):
        return None
    server, sep, tool = name[4:].partition(".")
    if not sep or not server or not tool:
        return None
    return server, tool
