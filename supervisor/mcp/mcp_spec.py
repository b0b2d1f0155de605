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
import os
import re
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator
from pydantic.dataclasses import dataclass

from corral.core.mcp_credentials import CredentialsError, credentials_file, read_credentials
from corral.core.redact import register_secret
from corral.supervisor.spec.spec_base import SECTION, Reader, SpecError, problem
from corral.supervisor.tree.restart_policy import RestartType

EFFECTS = ("read", "idempotent", "external")
APPROVALS = ("auto", "confirm", "writes", "deny")
Effect = Literal["read", "idempotent", "external"]
Approval = Literal["auto", "confirm", "writes", "deny"]
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_Entry = Annotated[StrictStr, Field(min_length=1, max_length=4096)]
_Strings = Annotated[tuple[_Entry, ...], Field(max_length=256)]
_Table = dict[Annotated[StrictStr, Field(max_length=256)], Annotated[StrictStr, Field(max_length=8192)]]
#: Bounds of a command with its arguments, and of an env or headers table, in all
#: (seed 004 V1.22: "命令、参数、env 名和值都受数量、字符和总字节上限约束"); each entry
#: has its own bound above.
MAX_TABLE_ENTRIES = 64
MAX_TOTAL_BYTES = 64 * 1024

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Headers the HTTP transport owns (hop-by-hop ones, Host, the body's length).
_TRANSPORT_HEADERS = frozenset({
    "host", "content-length", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade",
})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: The old name, still caught by callers.
McpSpecError = SpecError


@dataclass(frozen=True, kw_only=True, config=SECTION)
class McpToolSettings:
    """``[mcp_servers.tools.<tool>]``: one tool's settings, over its server's."""

    effect: Effect | None = Field(default=None, description="This tool's effect class, over the server's `effect`.")
    approval: Approval | None = Field(default=None, description="This tool's approval, over the server's `approval`.")
    enabled: StrictBool = Field(
        default=True, description="`false`: never offered, whatever `allow` says (the last word on the tool).")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class McpServerSpec:
    """``[[mcp_servers]]``: an MCP server whose tools agents may call as
    ``mcp.<id>.<tool>``; one actor (``mcp-<id>``) in a group of its own (docs/mcp.md)."""

    id: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] = Field(
        description="The server's id, 1-64 ASCII letters, digits, dots, underscores or hyphens (seed 004 V1.22):"
        " its tools are `mcp.<id>.<tool>`.")
    enabled: StrictBool = Field(
        default=True, description="`false`: the server is declared but not started, and offers no tool.")
    required: StrictBool = Field(
        default=False, description="`true`: a run cannot plan without it: when it fails to start or to list its"
        " tools (or its catalog is refused), a run that would use it fails before its first provider turn, naming"
        " the server and why. `false` (optional): such a server is left out of the run's catalog, and `corral"
        " status` / `corral mcp list` say why.")
    command: _Strings = Field(
        default=(), description="A stdio server: the program and its arguments (or give `url`). The program is a"
        " bare name (`uvx`), found at `corral up` on the absolute PATH entries outside the project (its resolved"
        " file must be outside the project too); `python` is the interpreter corral runs on. Name a script by"
        " absolute path among the arguments.")
    url: StrictStr | None = Field(
        default=None, max_length=2048, description="A Streamable HTTP server: its https:// URL (or give `command`);"
        " http:// only to 127.0.0.1, localhost or [::1] with `allow_insecure_localhost`. No user information,"
        " fragment or control character.")
    allow_insecure_localhost: StrictBool = Field(
        default=False, description="`true`: a url server on 127.0.0.1, localhost or [::1] may be plain http://.")
    cwd: StrictStr | None = Field(
        default=None, max_length=4096, description="A stdio server's working directory: an existing absolute"
        " directory outside the project; unset: the directory of the resolved program.")
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
        description="`confirm` (the default, as seed 004 says): every tool asks a person; `writes`: read-only"
        " tools run, others (idempotent ones too) ask; `auto` or `deny` for all of them.")
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
        _total(sum(len(part.encode()) for part in command))
        return command

    @field_validator("env", "headers")
    @classmethod
    def _bounded_table(cls, table: dict[str, str]) -> dict[str, str]:
        if len(table) > MAX_TABLE_ENTRIES:
            raise problem(f"{len(table)} entries; at most {MAX_TABLE_ENTRIES}")
        _total(sum(len(name.encode()) + len(value.encode()) for name, value in table.items()))
        return table

    @field_validator("url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is None:
            return url
        if _CONTROL.search(url):
            raise problem(f"{url!r} holds a control character")
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise problem(f"{url!r} is not an http(s) URL")
        if parsed.username is not None or parsed.password is not None:
            raise problem("a URL with user information is refused: give credentials in `headers`")
        if parsed.fragment or url.endswith("#"):
            raise problem(f"{url!r} has a fragment (#...): leave it out")
        return url

    @field_validator("headers")
    @classmethod
    def _user_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name.lower() in _TRANSPORT_HEADERS:
                raise problem(f"{name!r} is set by the transport, never by the spec")
            if not _TOKEN.fullmatch(name) or _CONTROL.search(value):
                raise problem(f"header {name!r} has a bad name or a control character in its value")
        return headers

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if bool(self.command) == (self.url is not None):
            raise problem("give exactly one of command (stdio) or url (Streamable HTTP)")
        parsed = urlparse(self.url or "")
        if self.url is not None and parsed.scheme == "http":
            # Seed 004 V1.22: https only; plain http to this machine when asked for.
            if not self.allow_insecure_localhost:
                raise problem(f"url: {self.url!r} must be https:// (plain http:// only to 127.0.0.1, localhost or"
                              " [::1], with allow_insecure_localhost = true)")
            if parsed.hostname not in _LOOPBACK:
                raise problem(f"url: allow_insecure_localhost allows http:// only for 127.0.0.1, localhost or [::1],"
                              f" not {parsed.hostname!r}")
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
        """``allow``, then ``deny``, then the tool's own ``enabled`` (seed 004 V1.22:
        "disabledTools 在 allowlist 后应用；tools.<toolName>.enabled=false 最终禁用")."""
        allowed = any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.allow)
        settings = self.tools.get(tool)
        enabled = settings is None or settings.enabled
        return allowed and enabled and not any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.deny)

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
            # Seed 004 V1.22: only a read-only tool runs unasked; an idempotent one still
            # changes something, so it asks like every other.
            return "auto" if effect == "read" else "confirm"
        return approval

    def actor_params(self, credentials_file: Path, path: str = "") -> dict[str, Any]:
        """What the actor needs: templates and where the credentials are, never an
        expanded secret; ``path``: the trusted PATH a stdio server gets."""
        return {
            "server": {
                "id": self.id,
                "path": path,
                "command": list(self.command),
                "url": self.url,
                "cwd": self.cwd,
                "env": dict(self.env),
                "headers": dict(self.headers),
                "startup_timeout_s": self.startup_timeout_s,
                "credentials_file": str(credentials_file),
            }
        }


def _total(size: int) -> None:
    if size > MAX_TOTAL_BYTES:
        raise problem(f"{size} bytes in all; at most {MAX_TOTAL_BYTES}")


_READER = Reader(McpServerSpec)


def parse_server(where: str, table: Any) -> McpServerSpec:
    """One ``[[mcp_servers]]`` table read alone, its places named from ``where``."""
    return _READER.read(table, root=where)


def resolve_servers(
    servers: list[McpServerSpec], project_root: Path, path_env: str
) -> tuple[McpServerSpec, ...]:
    """Ids unique; a stdio server's program found and its working directory fixed
    now, so a wrong one stops ``corral up`` instead of every start (seed 004 V1.22:
    a bare program name from a trusted PATH outside the project, an explicit cwd an
    existing absolute directory outside it, an unset one the program's directory).
    Paths are judged after resolution (symlinks followed) and by inode, never by
    string prefix."""
    seen: set[str] = set()
    resolved: list[McpServerSpec] = []
    for index, server in enumerate(servers):
        where = f"mcp_servers[{index}]"
        if server.id in seen:
            raise SpecError(f"{where}.id: duplicate server id {server.id!r}")
        overlap = next((other for other in seen if _overlap(other, server.id)), None)
        if overlap is not None:
            raise SpecError(f"{where}.id: {server.id!r} and {overlap!r}: one, with a dot, begins the other, so"
                            f" their tools could have the same name (mcp.a.b.c); rename one")
        seen.add(server.id)
        if not server.enabled:
            continue
        if server.command:
            program, *args = server.command
            run_as, real = _program(where, program, project_root, path_env)
            cwd = _cwd(where, server.cwd, project_root) if server.cwd is not None else real.parent
            server = dataclasses.replace(server, cwd=str(cwd), command=(run_as, *args))
        resolved.append(server)
    return tuple(resolved)


def _overlap(one: str, other: str) -> bool:
    return other.startswith(one + ".") or one.startswith(other + ".")


def trusted_path(path_env: str, project_root: Path) -> str:
    """The PATH a stdio server gets: the absolute entries of ``path_env`` that are
    existing directories outside the project, in order (the ones its program was
    looked for in)."""
    return os.pathsep.join(entry for entry in path_env.split(os.pathsep) if _trusted_dir(entry, project_root))


def _program(where: str, program: str, project_root: Path, path_env: str) -> tuple[str, Path]:
    """What to run (``python``/``python3`` stay names: the actor runs them as the
    interpreter corral runs on; any other is the PATH hit, run by that name, since a
    venv's ``bin/python`` finds its venv through its own link) and where it really is."""
    if "/" in program or program.startswith("~"):
        raise SpecError(
            f"{where}.command: {program!r} is a path; give a bare program name found on PATH outside the project"
            f" (command = [\"python\", \"/abs/path/server.py\"], or put the program's directory on PATH)"
        )
    if program in ("python", "python3"):
        return program, Path(sys.executable).resolve()
    found = shutil.which(program, path=trusted_path(path_env, project_root))
    if found is None:
        raise SpecError(
            f"{where}.command: no program {program!r} on a trusted PATH (the absolute PATH entries outside the"
            f" project {project_root}); install it outside the project or put its directory on PATH"
        )
    real = Path(found).resolve()
    if _inside(real, project_root):
        raise SpecError(f"{where}.command: {program!r} ({found}) resolves to {real}, inside the project"
                        f" {project_root}; a server's program must live outside the project")
    return found, real


def _cwd(where: str, cwd: str, project_root: Path) -> Path:
    path = Path(cwd)
    if not path.is_absolute():
        raise SpecError(f"{where}.cwd: {cwd!r} is not an absolute path; give an existing absolute directory"
                        f" outside the project, or leave cwd unset (the program's directory)")
    real = path.resolve()
    if not real.is_dir():
        raise SpecError(f"{where}.cwd: {cwd} is not an existing directory")
    if _inside(real, project_root):
        raise SpecError(f"{where}.cwd: {cwd} is inside the project {project_root}; a server runs in a directory"
                        f" outside it (unset: the program's directory)")
    return real


def _trusted_dir(entry: str, project_root: Path) -> bool:
    """A PATH entry corral searches: absolute, an existing directory, outside the project."""
    if not entry or not Path(entry).is_absolute():
        return False
    try:
        real = Path(entry).resolve()
        return real.is_dir() and not _inside(real, project_root)
    except OSError:
        return False  # a directory this user cannot look into (another user's home): not searched


def _inside(real: Path, root: Path) -> bool:
    """``real`` (resolved) is ``root`` or below it, compared by device and inode."""
    try:
        info = root.stat()
    except OSError:
        return False
    for candidate in (real, *real.parents):
        try:
            here = candidate.stat()
        except OSError:
            continue
        if (here.st_dev, here.st_ino) == (info.st_dev, info.st_ino):
            return True
    return False


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


def split_tool_name(name: str, servers: Iterable[str] = ()) -> tuple[str, str] | None:
    """``mcp.<server>.<tool>`` -> (server, tool); None for any other name. A server
    id may hold dots: among ``servers`` the one the name begins with is it (the spec
    refuses two ids of which one begins the other), and a name of none is None;
    without them, the first dot ends it."""
    if not name.startswith("mcp."):
        return None
    rest = name[4:]
    known = tuple(servers)
    if known:
        return next(((server, rest[len(server) + 1:]) for server in known
                     if rest.startswith(server + ".") and len(rest) > len(server) + 1), None)
    server, sep, tool = rest.partition(".")
    if not sep or not server or not tool:
        return None
    return server, tool
