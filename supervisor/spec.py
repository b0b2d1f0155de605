"""The swarm spec: a TOML file declaring groups, actors and agents.

Parsing is strict: an unknown key, a wrong type or an impossible value is a
``SpecError`` naming the exact place, and nothing starts.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.core.errors import CorralError
from corral.mailbox.codec import DEFAULT_MAX_FRAME
from corral.sandbox.launcher import LaunchMode
from corral.supervisor import bridge_spec, ledger_spec
from corral.supervisor.bounded_files import FileReadError, read_text_bounded
from corral.supervisor.mcp_spec import McpServerSpec, McpSpecError, parse_servers
from corral.supervisor.model_spec import LocalModelSpec, ModelRegistry, ModelSpecError
from corral.supervisor.restart_policy import RestartType, Strategy

ROOT_GROUP = "root"
_ID = re.compile(r"^[a-z][a-z0-9_-]{0,47}$")


class SpecError(CorralError, ValueError):
    """A spec that cannot run; the message names the exact place. Nothing started."""


@dataclass(frozen=True)
class GroupSpec:
    id: str
    strategy: Strategy = Strategy.ONE_FOR_ONE
    max_restarts: int = 3
    period_s: float = 5.0


@dataclass(frozen=True)
class ActorSpec:
    id: str
    template: str
    group: str = ROOT_GROUP
    restart: RestartType = RestartType.PERMANENT
    shutdown_timeout_ms: int = 2000
    backoff_base_ms: int = 20
    backoff_max_ms: int = 2000
    backoff_jitter: float = 0.2
    params: dict[str, Any] = field(default_factory=dict)
    #: Environment variables this actor gets despite the scrub (an agent's API key
    #: variable, declared by its provider config); nothing else passes.
    env_passthrough: tuple[str, ...] = ()


@dataclass(frozen=True)
class SupervisorSettings:
    transport: str = "ipc"
    launch: LaunchMode = LaunchMode.FORKSERVER
    max_frame: int = DEFAULT_MAX_FRAME
    inbox_size: int = 256
    synchronous: str = "full"
    heartbeat_s: float = 2.0
    #: An actor silent this long (no heartbeat, no message) is stalled: it is killed
    #: and restarted per its policy. Reported as stalled from half of it.
    stall_timeout_s: float = 30.0


POLICIES = ("auto", "confirm", "deny")


@dataclass(frozen=True)
class AgentSpec:
    id: str
    role: str  # root | specialist
    provider: str  # scripted | openai
    provider_config: dict[str, Any]
    workspace: Path
    write_scopes: tuple[str, ...]
    policy: dict[str, str]
    max_repairs: int = 2
    max_provider_retries: int = 3
    retry_base_s: float = 0.5
    retry_cap_s: float = 30.0
    #: Globs of the tools this agent may use and is offered; None: every tool.
    tools: tuple[str, ...] | None = None
    #: Token budget of the model's context (supervisor/compaction.py); None: no compaction.
    context_window: int | None = None
    auto_compact_token_limit: int | None = None
    tool_output_token_limit: int | None = None
    #: Read tools whose consecutive auto-approved calls may run in parallel (an
    #: exact allow list; supervisor/step_piggyback.py). Empty: reads run in order.
    parallel_reads: tuple[str, ...] = ()


@dataclass(frozen=True)
class TemplateSpec:
    """An isolated-child template for agent.spawn_isolated."""

    id: str
    provider: str
    provider_config: dict[str, Any]
    policy: dict[str, str]
    #: Globs of the tools a child of this template may use and is offered; None: every child tool.
    tools: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SandboxSettings:
    """How commands and process sessions are isolated (see corral.sandbox.bwrap)."""

    mode: str = "required"  # required | allow-unsandboxed
    network: bool = False
    cpu_s: int | None = None
    address_space_bytes: int | None = None
    open_files: int | None = None
    processes: int | None = None


@dataclass(frozen=True)
class SwarmLimits:
    max_children_per_call: int = 3
    max_depth: int = 1
    child_timeout_s: float = 120.0
    max_repairs_per_delivery: int = 1


@dataclass(frozen=True)
class SwarmSpec:
    name: str
    supervisor: SupervisorSettings
    groups: tuple[GroupSpec, ...]
    actors: tuple[ActorSpec, ...]
    raw: dict[str, Any] = field(default_factory=dict)
    source: str = "<embedded>"
    agents: tuple[AgentSpec, ...] = ()
    templates: tuple[TemplateSpec, ...] = ()
    policy: dict[str, str] = field(default_factory=dict)
    limits: SwarmLimits = SwarmLimits()
    project_root: Path = Path(".")
    effects_file: Path | None = None
    sandbox: SandboxSettings = SandboxSettings()
    mcp_servers: tuple[McpServerSpec, ...] = ()
    #: Local GGUF models, one ``model`` actor each (see supervisor/model_spec.py).
    models: tuple[LocalModelSpec, ...] = ()
    #: ``[tools] modules``, resolved (file paths absolute), plus the ``corral.tools``
    #: entry points: imported here, in the fork server and in every actor.
    tool_modules: tuple[str, ...] = ()
    #: ``[bridge]``: work for an agent-task bridge (supervisor/bridge_spec.py).
    bridge: bridge_spec.BridgeSpec | None = None
    #: ``[ledger]``: a PostgreSQL ledger shared by several nodes (supervisor/ledger_spec.py).
    ledger: ledger_spec.LedgerSpec | None = None

    def agent(self, agent_id: str) -> AgentSpec:
        for agent in self.agents:
            if agent.id == agent_id:
                return agent
        raise KeyError(agent_id)

    def template(self, template_id: str) -> TemplateSpec:
        for template in self.templates:
            if template.id == template_id:
                return template
        raise KeyError(template_id)

    def group(self, group_id: str) -> GroupSpec:
        for group in self.groups:
            if group.id == group_id:
                return group
        raise KeyError(group_id)

    def actor(self, actor_id: str) -> ActorSpec:
        for actor in self.actors:
            if actor.id == actor_id:
                return actor
        raise KeyError(actor_id)


KNOWN_TEMPLATES = {"echo", "agent", "child", "session", "mcp", "model", "bridge_worker"}

_TOP = {
    "name",
    "supervisor",
    "groups",
    "actors",
    "agents",
    "templates",
    "limits",
    "policy",
    "sandbox",
    "project",
    "chaos",
    "mcp_servers",
    "models",
    "tools",
    "bridge",
    "ledger",
}
_AGENT = {
    "id",
    "role",
    "provider",
    "script",
    "steps",
    "openai",
    "local",
    "provider_config",
    "workspace",
    "write_scopes",
    "policy",
    "max_repairs",
    "context_window",
    "auto_compact_token_limit",
    "tool_output_token_limit",
    "parallel_reads",
    "max_provider_retries",
    "retry_base_s",
    "retry_cap_s",
    "restart",
    "group",
    "shutdown_timeout_ms",
    "tools",
}
_TEMPLATE = {"id", "provider", "script", "steps", "openai", "local", "provider_config", "policy", "tools"}
_LIMITS = {"max_children_per_call", "max_depth", "child_timeout_s", "max_repairs_per_delivery"}
_SUPERVISOR = {"transport", "launch", "max_frame", "inbox_size", "synchronous", "heartbeat_s", "stall_timeout_s"}
_GROUP = {"id", "strategy", "max_restarts", "period_s"}
_ACTOR = {
    "id",
    "template",
    "count",
    "group",
    "restart",
    "shutdown_timeout_ms",
    "backoff_base_ms",
    "backoff_max_ms",
    "backoff_jitter",
    "params",
}


def _check_keys(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SpecError(f"{where}: unknown key {key!r}{hint}")


_MIB = 1024 * 1024
#: Every numeric value of a spec and its inclusive range, in one place. The key is
#: ``section.field``; an array's entries share their section (``agents[2].max_repairs``
#: is checked against ``agents.max_repairs``).
RANGES: dict[str, tuple[float, float]] = {
    "supervisor.max_frame": (1024, 64 * _MIB),
    "supervisor.inbox_size": (1, 100_000),
    "supervisor.heartbeat_s": (0.05, 3600),
    "supervisor.stall_timeout_s": (0.5, 86_400),
    "groups.max_restarts": (0, 1_000_000),
    "groups.period_s": (0.001, 86_400),
    "actors.count": (1, 10_000),
    "actors.shutdown_timeout_ms": (1, 3_600_000),
    "actors.backoff_base_ms": (0, 3_600_000),
    "actors.backoff_max_ms": (0, 3_600_000),
    "actors.backoff_jitter": (0, 1),
    "agents.max_repairs": (0, 100),
    "agents.context_window": (256, 10_000_000),
    "agents.auto_compact_token_limit": (64, 10_000_000),
    "agents.tool_output_token_limit": (16, 10_000_000),
    "agents.max_provider_retries": (0, 100),
    "agents.retry_base_s": (0.001, 3600),
    "agents.retry_cap_s": (0.001, 86_400),
    "agents.shutdown_timeout_ms": (1, 3_600_000),
    "limits.max_children_per_call": (1, 64),
    "limits.max_depth": (1, 16),
    "limits.child_timeout_s": (0.1, 7 * 86_400),
    "limits.max_repairs_per_delivery": (0, 100),
    "sandbox.cpu_s": (1, 7 * 86_400),
    "sandbox.address_space_bytes": (16 * _MIB, 1024**4),
    "sandbox.open_files": (16, 1_048_576),
    "sandbox.processes": (1, 1_000_000),
}
#: No string in a spec may exceed this (a 50 MB name once broke every `status`).
MAX_STRING_CHARS = 256 * 1024
MAX_NAME_CHARS = 128


def _get(where: str, table: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise SpecError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    if kind in (int, float):
        bounds = RANGES.get(f"{where.split('[')[0]}.{key}")
        if not math.isfinite(value) or (bounds is not None and not bounds[0] <= value <= bounds[1]):
            low, high = bounds if bounds is not None else (-math.inf, math.inf)
            raise SpecError(f"{where}.{key}: must be a finite number between {low:g} and {high:g}, got {value}")
    return value


def _check_values(node: Any, where: str = "spec") -> None:
    """NaN and infinity nowhere; no string past MAX_STRING_CHARS, wherever it is."""
    if isinstance(node, float) and not math.isfinite(node):
        raise SpecError(f"{where}: NaN and infinity are not accepted")
    if isinstance(node, str) and len(node) > MAX_STRING_CHARS:
        raise SpecError(f"{where}: a string of {len(node)} characters; the limit is {MAX_STRING_CHARS}")
    if isinstance(node, dict):
        for key, item in node.items():
            _check_values(item, f"{where}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            _check_values(item, f"{where}[{index}]")


def _enum(where: str, enum_type: Any, value: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        choices = ", ".join(item.value for item in enum_type)
        raise SpecError(f"{where}: {value!r} is not one of {choices}") from None


def _check_id(where: str, value: str) -> str:
    if not _ID.match(value):
        raise SpecError(f"{where}: id {value!r} must match {_ID.pattern}")
    return value


def parse_spec(data: dict[str, Any], source: str = "<embedded>") -> SwarmSpec:
    from corral.supervisor.spec_providers import provider_settings  # it imports this module
    _check_keys("spec", data, _TOP)
    _check_values(data)
    name = _get("spec", data, "name", str, "swarm")
    if not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise SpecError(f"spec.name: must be 1..{MAX_NAME_CHARS} printable characters")

    sup_table = _get("spec", data, "supervisor", dict, {})
    _check_keys("supervisor", sup_table, _SUPERVISOR)
    transport = _get("supervisor", sup_table, "transport", str, "ipc")
    if transport not in ("ipc", "tcp"):
        raise SpecError(f"supervisor.transport: {transport!r} is not ipc or tcp (loopback)")
    synchronous = _get("supervisor", sup_table, "synchronous", str, "full")
    if synchronous not in ("full", "normal"):
        raise SpecError("supervisor.synchronous: must be 'full' or 'normal'")
    settings = SupervisorSettings(
        transport=transport,
        launch=_enum("supervisor.launch", LaunchMode, _get("supervisor", sup_table, "launch", str, "forkserver")),
        max_frame=_get("supervisor", sup_table, "max_frame", int, DEFAULT_MAX_FRAME),
        inbox_size=_get("supervisor", sup_table, "inbox_size", int, 256),
        synchronous=synchronous,
        heartbeat_s=_get("supervisor", sup_table, "heartbeat_s", float, 2.0),
        stall_timeout_s=_get("supervisor", sup_table, "stall_timeout_s", float, 30.0),
    )

    groups: dict[str, GroupSpec] = {ROOT_GROUP: GroupSpec(ROOT_GROUP)}
    for index, table in enumerate(_get("spec", data, "groups", list, [])):
        where = f"groups[{index}]"
        if not isinstance(table, dict):
            raise SpecError(f"{where}: expected a table")
        _check_keys(where, table, _GROUP)
        if "id" not in table:
            raise SpecError(f"{where}: missing id")
        group = GroupSpec(
            id=_check_id(f"{where}.id", _get(where, table, "id", str, "")),
            strategy=_enum(f"{where}.strategy", Strategy, _get(where, table, "strategy", str, "one_for_one")),
            max_restarts=_get(where, table, "max_restarts", int, 3),
            period_s=_get(where, table, "period_s", float, 5.0),
        )
        if group.id in groups and group.id != ROOT_GROUP:
            raise SpecError(f"{where}: duplicate group id {group.id!r}")
        groups[group.id] = group

    actors: list[ActorSpec] = []
    seen: set[str] = set()
    for index, table in enumerate(_get("spec", data, "actors", list, [])):
        where = f"actors[{index}]"
        if not isinstance(table, dict):
            raise SpecError(f"{where}: expected a table")
        _check_keys(where, table, _ACTOR)
        for required in ("id", "template"):
            if required not in table:
                raise SpecError(f"{where}: missing {required}")
        base_id = _check_id(f"{where}.id", _get(where, table, "id", str, ""))
        template = _get(where, table, "template", str, "")
        if template not in KNOWN_TEMPLATES:
            _user_template(f"{where}.template", template)
        count = _get(where, table, "count", int, 1)
        group_id = _get(where, table, "group", str, ROOT_GROUP)
        if group_id not in groups:
            raise SpecError(f"{where}.group: no group {group_id!r} is declared")
        common = dict(
            template=template,
            group=group_id,
            restart=_enum(f"{where}.restart", RestartType, _get(where, table, "restart", str, "permanent")),
            shutdown_timeout_ms=_get(where, table, "shutdown_timeout_ms", int, 2000),
            backoff_base_ms=_get(where, table, "backoff_base_ms", int, 20),
            backoff_max_ms=_get(where, table, "backoff_max_ms", int, 2000),
            backoff_jitter=_get(where, table, "backoff_jitter", float, 0.2),
            params=_get(where, table, "params", dict, {}),
        )
        for n in range(1, count + 1):
            actor_id = base_id if count == 1 else f"{base_id}-{n}"
            if actor_id in seen:
                raise SpecError(f"{where}: duplicate actor id {actor_id!r}")
            seen.add(actor_id)
            actors.append(ActorSpec(id=actor_id, **common))
    base = Path(source).parent if source != "<embedded>" else Path.cwd()
    project_table = _get("spec", data, "project", dict, {})
    _check_keys("project", project_table, {"root"})
    project_root = (base / _get("project", project_table, "root", str, ".")).resolve()
    if "root" in project_table:
        _check_project_root(project_root)  # a root given explicitly is checked even without agents
    chaos_table = _get("spec", data, "chaos", dict, {})
    _check_keys("chaos", chaos_table, {"effects_file", "root_agent", "task", "workspace_files"})
    effects = _get("chaos", chaos_table, "effects_file", str, "")
    policy = _policy("policy", _get("spec", data, "policy", dict, {}))
    tool_modules = _tool_modules(_get("spec", data, "tools", dict, {}), base)
    try:
        models = ModelRegistry.parse(data.get("models", []), base)
    except ModelSpecError as exc:
        raise SpecError(str(exc)) from None

    agents: list[AgentSpec] = []
    for index, table in enumerate(_get("spec", data, "agents", list, [])):
        where = f"agents[{index}]"
        if not isinstance(table, dict):
            raise SpecError(f"{where}: expected a table")
        _check_keys(where, table, _AGENT)
        if "id" not in table:
            raise SpecError(f"{where}: missing id")
        agent_id = _check_id(f"{where}.id", _get(where, table, "id", str, ""))
        if agent_id in seen:
            raise SpecError(f"{where}: id {agent_id!r} is already used by an actor or agent")
        seen.add(agent_id)
        role = _get(where, table, "role", str, "root")
        if role not in ("root", "specialist"):
            raise SpecError(f"{where}.role: must be 'root' or 'specialist'")
        provider, provider_config = provider_settings(where, table, base, models)
        workspace = (project_root / _get(where, table, "workspace", str, ".")).resolve()
        if workspace != project_root and project_root not in workspace.parents:
            raise SpecError(f"{where}.workspace: {workspace} is outside the project root {project_root}")
        scopes = _get(where, table, "write_scopes", list, ["."])
        if not all(isinstance(scope, str) for scope in scopes):
            raise SpecError(f"{where}.write_scopes: must be a list of relative paths")
        for scope in scopes:
            if scope.startswith("/") or ".." in Path(scope).parts:
                raise SpecError(f"{where}.write_scopes: {scope!r} must be relative without '..'")
        agent = AgentSpec(
            id=agent_id,
            role=role,
            provider=provider,
            provider_config=provider_config,
            workspace=workspace,
            write_scopes=tuple(scopes),
            policy=_policy(f"{where}.policy", _get(where, table, "policy", dict, {})),
            max_repairs=_get(where, table, "max_repairs", int, 2),
            context_window=_get(where, table, "context_window", int, None),
            auto_compact_token_limit=_get(where, table, "auto_compact_token_limit", int, None),
            tool_output_token_limit=_get(where, table, "tool_output_token_limit", int, None),
            parallel_reads=_parallel_reads(where, table),
            max_provider_retries=_get(where, table, "max_provider_retries", int, 3),
            retry_base_s=_get(where, table, "retry_base_s", float, 0.5),
            retry_cap_s=_get(where, table, "retry_cap_s", float, 30.0),
            tools=_tool_globs(where, table),
        )
        agents.append(agent)
        group_id = _get(where, table, "group", str, ROOT_GROUP)
        if group_id not in groups:
            raise SpecError(f"{where}.group: no group {group_id!r} is declared")
        actors.append(
            ActorSpec(
                id=agent_id,
                template="agent",
                group=group_id,
                restart=_enum(f"{where}.restart", RestartType, _get(where, table, "restart", str, "permanent")),
                shutdown_timeout_ms=_get(where, table, "shutdown_timeout_ms", int, 2000),
                params={"agent_id": agent_id},
                env_passthrough=provider_env(provider, provider_config),
            )
        )

    templates: list[TemplateSpec] = []
    for index, table in enumerate(_get("spec", data, "templates", list, [])):
        where = f"templates[{index}]"
        if not isinstance(table, dict):
            raise SpecError(f"{where}: expected a table")
        _check_keys(where, table, _TEMPLATE)
        if "id" not in table:
            raise SpecError(f"{where}: missing id")
        provider, provider_config = provider_settings(where, table, base, models)
        templates.append(
            TemplateSpec(
                id=_check_id(f"{where}.id", _get(where, table, "id", str, "")),
                provider=provider,
                provider_config=provider_config,
                policy=_policy(f"{where}.policy", _get(where, table, "policy", dict, {})),
                tools=_tool_globs(where, table),
            )
        )

    limits_table = _get("spec", data, "limits", dict, {})
    _check_keys("limits", limits_table, _LIMITS)
    limits = SwarmLimits(
        max_children_per_call=_get("limits", limits_table, "max_children_per_call", int, 3),
        max_depth=_get("limits", limits_table, "max_depth", int, 1),
        child_timeout_s=_get("limits", limits_table, "child_timeout_s", float, 120.0),
        max_repairs_per_delivery=_get("limits", limits_table, "max_repairs_per_delivery", int, 1),
    )
    sandbox_table = _get("spec", data, "sandbox", dict, {})
    _check_keys("sandbox", sandbox_table, {"mode", "network", "cpu_s", "address_space_bytes", "open_files",
                                           "processes"})
    sandbox = SandboxSettings(
        mode=_get("sandbox", sandbox_table, "mode", str, "required"),
        network=_get("sandbox", sandbox_table, "network", bool, False),
        cpu_s=_get("sandbox", sandbox_table, "cpu_s", int, None),
        address_space_bytes=_get("sandbox", sandbox_table, "address_space_bytes", int, None),
        open_files=_get("sandbox", sandbox_table, "open_files", int, None),
        processes=_get("sandbox", sandbox_table, "processes", int, None),
    )
    if sandbox.mode not in ("required", "allow-unsandboxed"):
        raise SpecError("sandbox.mode: must be 'required' or 'allow-unsandboxed'")
    mcp_servers = _mcp_servers(data, project_root, groups, actors, seen)
    _model_actors(models, groups, actors, seen)
    bridge = None
    if "bridge" in data:
        try:
            bridge = bridge_spec.parse(data["bridge"], {agent.id for agent in agents})
        except bridge_spec.BridgeSpecError as exc:
            raise SpecError(str(exc)) from None
        if bridge_spec.ACTOR_ID in seen:
            raise SpecError(f"bridge: actor id {bridge_spec.ACTOR_ID!r} is already used")
        seen.add(bridge_spec.ACTOR_ID)
        _service_actor(groups, actors, bridge_spec.ACTOR_ID, "bridge_worker", 10, 60.0, bridge.actor_params(),
                       env_passthrough=(bridge.token_env,))
    ledger = None
    if "ledger" in data:
        try:
            ledger = ledger_spec.parse(data["ledger"])
        except ledger_spec.LedgerSpecError as exc:
            raise SpecError(str(exc)) from None
    if "root" not in project_table and (agents or any(server.command for server in mcp_servers)):
        # An implicit root matters once something works in it: agents, or a stdio
        # server (its working directory lies under it). An explicit one was checked above.
        _check_project_root(project_root)
    # Keys are checked once the whole catalog is known (MCP servers come last).
    policy_tables = [("policy", policy)]
    policy_tables += [(f"agents[{i}].policy", agent.policy) for i, agent in enumerate(agents)]
    policy_tables += [(f"templates[{i}].policy", template.policy) for i, template in enumerate(templates)]
    _check_policy_keys(policy_tables, {server.id for server in mcp_servers})
    return SwarmSpec(
        name,
        settings,
        tuple(groups.values()),
        tuple(actors),
        data,
        source,
        tuple(agents),
        tuple(templates),
        policy,
        limits,
        project_root,
        (base / effects).resolve() if effects else None,
        sandbox,
        mcp_servers,
        models.all(),
        tool_modules,
        bridge,
        ledger,
    )


def _user_template(where: str, template: str) -> None:
    """A user template is a ``module:Name`` reference; only its form is checked here:
    it is imported in its actor, where a failure counts against restart intensity."""
    from corral.actors.user_code import check_syntax, is_reference
    from corral.core.errors import UserCodeError

    if not is_reference(template):
        raise SpecError(
            f"{where}: unknown template {template!r} ({', '.join(sorted(KNOWN_TEMPLATES))},"
            " or a 'package.module:Name' reference)"
        )
    try:
        check_syntax(template)
    except UserCodeError as exc:
        raise SpecError(f"{where}: {exc}") from None

def _mcp_servers(
    data: dict[str, Any],
    project_root: Path,
    groups: dict[str, GroupSpec],
    actors: list[ActorSpec],
    seen: set[str],
) -> tuple[McpServerSpec, ...]:
    """Each MCP server is an actor of its own group (see supervisor/mcp_spec.py)."""
    try:
        servers = parse_servers(data.get("mcp_servers", []), project_root)
    except McpSpecError as exc:
        raise SpecError(str(exc)) from None
    for server in servers:
        if server.actor_id in seen:
            raise SpecError(f"mcp_servers: actor id {server.actor_id!r} is already used")
        seen.add(server.actor_id)
        # One group per server: a flapping server exhausts its own intensity only.
        _service_actor(groups, actors, server.actor_id, "mcp", server.max_restarts, server.period_s,
                       server.actor_params(), server.env_names)
    return servers


#: A project root may not be one of these, nor lie inside the first group.
_SYSTEM_TREES = (
    "/etc", "/proc", "/sys", "/dev", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr",
)
_SYSTEM_DIRS = ("/", "/var", "/opt", "/srv", "/run", "/home", "/tmp", "/mnt", "/media")


def _check_project_root(root: Path) -> None:
    """Agents read and write under the project root: never the whole machine, the
    user's home directory or a system directory (after symlinks are resolved)."""
    real = root.resolve()
    home = Path.home().resolve()
    if str(real) in _SYSTEM_DIRS or real == home:
        raise SpecError(f"project.root: {real} is {'your home directory' if real == home else 'a system directory'};"
                        " give the project's own directory")
    if real in home.parents:
        raise SpecError(f"project.root: {real} contains your home directory {home}; give the project's own directory")
    for tree in _SYSTEM_TREES:
        top = Path(tree).resolve()
        if real == top or top in real.parents:
            raise SpecError(f"project.root: {real} lies in the system directory {tree}")


def provider_env(provider: str, config: dict[str, Any]) -> tuple[str, ...]:
    if provider in ("scripted", "local"):
        return ()
    # openai reads OPENAI_API_KEY unless told otherwise; a user provider names its variable.
    name = config.get("api_key_env", "OPENAI_API_KEY" if provider == "openai" else "")
    return (name,) if isinstance(name, str) and name else ()


def _policy(where: str, table: dict[str, Any]) -> dict[str, str]:
    for tool, mode in table.items():
        if mode not in POLICIES:
            raise SpecError(f"{where}.{tool}: policy must be one of {', '.join(POLICIES)}, got {mode!r}")
    return dict(table)


def _tool_modules(table: dict[str, Any], base: Path) -> tuple[str, ...]:
    """Import the user's tool modules now: a module that fails to import is a spec
    error naming it, and nothing starts."""
    from corral.actors.user_code import import_tool_module, tool_entry_points
    from corral.core.errors import UserCodeError

    _check_keys("tools", table, {"modules"})
    entries = _get("tools", table, "modules", list, [])
    if not all(isinstance(entry, str) and 0 < len(entry) <= 4096 for entry in entries):
        raise SpecError("tools.modules: must be a list of module names or .py file paths")
    resolved = [str((base / entry).resolve()) if entry.endswith(".py") else entry for entry in entries]
    for entry in [*resolved, *tool_entry_points()]:
        try:
            import_tool_module(entry)
        except UserCodeError as exc:
            raise SpecError(f"tools.modules: {exc}") from None
    return tuple(dict.fromkeys([*resolved, *tool_entry_points()]))


def _tool_globs(where: str, table: dict[str, Any]) -> tuple[str, ...] | None:
    if "tools" not in table:
        return None
    globs = _get(where, table, "tools", list, [])
    if not all(isinstance(glob, str) and 0 < len(glob) <= 200 for glob in globs):
        raise SpecError(f"{where}.tools: must be a list of tool names or globs (e.g. \"fs.*\", \"mcp.git.*\")")
    return tuple(globs)


def _parallel_reads(where: str, table: dict[str, Any]) -> tuple[str, ...]:
    """Exact names of read-only tools (no globs: the list is strict)."""
    from corral.actors.tools.registry import all_tools

    names = _get(where, table, "parallel_reads", list, [])
    tools = all_tools()
    for name in names:
        tool = tools.get(name) if isinstance(name, str) else None
        if tool is None or tool.schema.effect_class != "read":
            raise SpecError(f"{where}.parallel_reads: {name!r} is not a read-only tool (only reads run in parallel)")
    return tuple(names)


def known_tool_names() -> list[str]:
    """Every tool name a policy key may name: the one tool catalog."""
    from corral.actors.tools.registry import all_tools

    return sorted(all_tools())


def _check_policy_keys(tables: list[tuple[str, dict[str, str]]], mcp_ids: set[str]) -> None:
    """A misspelled key must not fail open: every key names a known tool, a glob that
    matches one, or a tool of a declared MCP server (``mcp.<server>.<tool or glob>``)."""
    known = known_tool_names()
    for where, table in tables:
        for key in table:
            server = key[4:].partition(".")[0] if key.startswith("mcp.") else None
            if key in known or (server in mcp_ids and key.count(".") >= 2):
                continue
            if any(ch in key for ch in "*?[") and any(fnmatch.fnmatchcase(name, key) for name in known):
                continue
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise SpecError(f"{where}.{key}: no tool {key!r}{hint}")


def _model_actors(
    models: ModelRegistry, groups: dict[str, GroupSpec], actors: list[ActorSpec], seen: set[str]
) -> None:
    """One ``model`` actor per model, each in a group of its own: a model that
    cannot load exhausts its own restart intensity, not the agents'."""
    for model in models.all():
        if model.actor_id in seen:
            raise SpecError(f"models: actor id {model.actor_id!r} is already used")
        seen.add(model.actor_id)
        _service_actor(groups, actors, model.actor_id, "model", model.max_restarts, model.period_s,
                       model.actor_params())


def _service_actor(
    groups: dict[str, GroupSpec],
    actors: list[ActorSpec],
    actor_id: str,
    template: str,
    max_restarts: int,
    period_s: float,
    params: dict[str, Any],
    env_passthrough: tuple[str, ...] = (),
) -> None:
    """A service actor (an MCP server, a model) in a one_for_one group of its own."""
    groups[actor_id] = GroupSpec(actor_id, Strategy.ONE_FOR_ONE, max_restarts, period_s)
    actors.append(
        ActorSpec(
            id=actor_id,
            template=template,
            group=actor_id,
            restart=RestartType.PERMANENT,
            shutdown_timeout_ms=5000,
            backoff_base_ms=200,
            backoff_max_ms=5000,
            params=params,
            env_passthrough=env_passthrough,
        )
    )


def load_spec(path: Path) -> SwarmSpec:
    try:
        text = read_text_bounded(path, "spec")
    except FileReadError as exc:
        raise SpecError(str(exc)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    spec = parse_spec(data, str(path))
    return spec


def empty_spec() -> SwarmSpec:
    return parse_spec({})
