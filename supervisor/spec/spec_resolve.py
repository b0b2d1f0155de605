"""Reading a swarm spec: the whole file validated in one pass against the sections
of supervisor/spec/spec_models.py, then what needs the whole spec or the disk (a group
that exists, ids used once, a workspace inside a sane project root, a script that
parses, tool modules that import, policy keys that name tools), and the
``SwarmSpec`` the supervisor runs. ``corral.supervisor.spec.swarm_spec.parse_spec`` imports
this module when a spec is first parsed, so a ``corral`` command that parses none
never imports pydantic.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.actors.tools.registry import all_tools, builtin_tools
from corral.core.mcp_credentials import credentials_file
from corral.supervisor.bridge import bridge_spec
from corral.supervisor.mcp.mcp_spec import resolve_servers, split_tool_name, trusted_path
from corral.supervisor.models.model_spec import ModelRegistry
from corral.supervisor.spec.spec_base import Reader, SpecError, check_values, did_you_mean, spec_path
from corral.supervisor.spec.spec_models import (
    KNOWN_TEMPLATES,
    POLICIES,
    POLICY_DEFAULT_KEY,
    ROOT_GROUP,
    ActorOptions,
    ActorSpec,
    AgentDefinition,
    AgentOptions,
    AgentSpec,
    AgentTable,
    GroupSpec,
    Permissions,
    SpecFile,
    TemplateSpec,
)
from corral.supervisor.spec.spec_providers import provider_settings
from corral.supervisor.spec.swarm_spec import SwarmSpec, provider_env
from corral.supervisor.tree.restart_policy import RestartType, Strategy

if TYPE_CHECKING:
    from corral.actors.tools.base import Tool
    from corral.actors.tools.declare import UserTool

#: The whole file in one validation; its places are named as the sections are
#: (``supervisor.heartbeat_s``, ``agents[1].max_repairs``), a top-level key from ``spec``.
_READER = Reader(SpecFile, "spec", bare_sections=True)


def parse(data: dict[str, Any], source: str) -> SwarmSpec:
    """The spec ``data`` (read from ``source``, or ``<embedded>``) as the supervisor runs it."""
    check_values(data)
    doc = _READER.read(data)
    base = Path(source).parent if source != "<embedded>" else Path.cwd()
    if source != "<embedded>":
        from corral.actors.user_code import add_search_roots

        add_search_roots(base)  # user modules are found here by file, never via sys.path
    tree = _Tree.of(doc)
    explicit_root = "root" in data.get("project", {})
    project_root = spec_path(base, doc.project.root)
    if explicit_root:
        _check_project_root(project_root)  # a root given explicitly is checked even without agents
    tool_modules, user_tools = _tool_modules(doc.tools.modules, base)
    tools = all_tools(user_tools)  # the one catalog the checks below judge names against
    models = ModelRegistry.build(doc.models, base)
    agents = _agents(doc, tree, base, models, project_root)
    for index, table in enumerate(doc.agents):
        _check_parallel_reads(f"agents[{index}]", table.parallel_reads, tools)
    templates = _templates(doc, base, models)
    mcp_servers = resolve_servers(doc.mcp_servers, project_root, os.environ.get("PATH", ""))
    server_path = trusted_path(os.environ.get("PATH", ""), project_root)
    for server in mcp_servers:
        # One group per server: a flapping server exhausts its own intensity only.
        tree.service(f"mcp_servers: actor id {server.actor_id!r} is already used", server.actor_id, "mcp",
                     server.max_restarts, server.period_s,
                     server.actor_params(credentials_file(os.environ), server_path))
    for model in models.all():
        # A model that cannot load exhausts its own restart intensity, not the agents'.
        tree.service(f"models: actor id {model.actor_id!r} is already used", model.actor_id, "model",
                     model.max_restarts, model.period_s, model.actor_params())
    if doc.bridge is not None:
        bridge_spec.check_agent(doc.bridge, {agent.id for agent in agents})
        tree.service(f"bridge: actor id {bridge_spec.ACTOR_ID!r} is already used", bridge_spec.ACTOR_ID,
                     "bridge_worker", 10, 60.0, doc.bridge.actor_params(), (doc.bridge.token_env,))
    if not explicit_root and (agents or any(server.command for server in mcp_servers)):
        # An implicit root (the spec's directory) matters once something works in it
        # or must stay outside it: agents, or a stdio server's program and cwd.
        # An explicit one was checked above.
        _check_project_root(project_root)
    # Keys are checked once the whole catalog is known (MCP servers come last).
    policy_tables: list[tuple[str, Mapping[str, str]]] = [("policy", doc.policy)]
    policy_tables += [(f"agents[{i}].policy", agent.policy) for i, agent in enumerate(agents)]
    policy_tables += [(f"templates[{i}].policy", template.policy) for i, template in enumerate(templates)]
    # A server declared with enabled = false still names its tools in policies.
    mcp_ids = {server.id for server in doc.mcp_servers}
    _check_policy_keys(policy_tables, mcp_ids, tools)
    _check_mandatory_approval(policy_tables, tools)
    tool_lists = [(f"agents[{i}].tools", agent.tools) for i, agent in enumerate(agents)]
    tool_lists += [(f"templates[{i}].tools", template.tools) for i, template in enumerate(templates)]
    _check_tool_globs(tool_lists, mcp_ids, tools)
    effects = doc.chaos.effects_file
    return SwarmSpec(
        name=doc.name,
        supervisor=doc.supervisor,
        groups=tuple(tree.groups.values()),
        actors=tuple(tree.actors),
        raw=data,
        source=source,
        agents=agents,
        templates=templates,
        policy=dict(doc.policy),
        limits=doc.limits,
        project_root=project_root,
        effects_file=spec_path(base, effects) if effects else None,
        sandbox=doc.sandbox,
        mcp_servers=mcp_servers,
        models=models.all(),
        tool_modules=tool_modules,
        user_tools=user_tools,
        bridge=doc.bridge,
        ledger=doc.ledger,
        telemetry=doc.telemetry,
    )


@dataclass
class _Tree:
    """The groups and actors a spec declares, gathered as they are found; an actor
    id is used once (actors, agents, servers, models and the bridge worker share them)."""

    groups: dict[str, GroupSpec]
    actors: list[ActorSpec] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, doc: SpecFile) -> _Tree:
        """``[[groups]]`` and ``[[actors]]``, each actor ``count`` times (``<id>-1``, ...)."""
        tree = cls({ROOT_GROUP: GroupSpec(ROOT_GROUP)})
        for index, group in enumerate(doc.groups):
            if group.id in tree.groups and group.id != ROOT_GROUP:
                raise SpecError(f"groups[{index}]: duplicate group id {group.id!r}")
            tree.groups[group.id] = GroupSpec(group.id, group.strategy, group.max_restarts, group.period_s)
        for index, table in enumerate(doc.actors):
            where = f"actors[{index}]"
            if table.template not in KNOWN_TEMPLATES:
                _user_template(f"{where}.template", table.template)
            tree.check_group(where, table.group)
            options = _options(table, ActorOptions)
            for n in range(1, table.count + 1):
                actor_id = table.id if table.count == 1 else f"{table.id}-{n}"
                tree.claim(actor_id, f"{where}: duplicate actor id {actor_id!r}")
                tree.actors.append(ActorSpec(id=actor_id, **options))
        return tree

    def claim(self, actor_id: str, taken: str) -> None:
        if actor_id in self.seen:
            raise SpecError(taken)
        self.seen.add(actor_id)

    def check_group(self, where: str, group_id: str) -> None:
        if group_id not in self.groups:
            raise SpecError(f"{where}.group: no group {group_id!r} is declared")

    def service(self, taken: str, actor_id: str, template: str, max_restarts: int, period_s: float,
                params: dict[str, Any], env_passthrough: tuple[str, ...] = ()) -> None:
        """A service actor (an MCP server, a model, the bridge worker) in a one_for_one
        group of its own; ``taken`` is the error when its id is already used."""
        self.claim(actor_id, taken)
        self.groups[actor_id] = GroupSpec(actor_id, Strategy.ONE_FOR_ONE, max_restarts, period_s)
        self.actors.append(ActorSpec(
            id=actor_id, template=template, group=actor_id, restart=RestartType.PERMANENT, shutdown_timeout_ms=5000,
            backoff_base_ms=200, backoff_max_ms=5000, params=params, env_passthrough=env_passthrough,
        ))


def _agents(doc: SpecFile, tree: _Tree, base: Path, models: ModelRegistry, project_root: Path
            ) -> tuple[AgentSpec, ...]:
    """Each ``[[agents]]`` entry: its provider settled, and the actor that runs it."""
    agents = []
    for index, table in enumerate(doc.agents):
        where = f"agents[{index}]"
        tree.claim(table.id, f"{where}: id {table.id!r} is already used by an actor or agent")
        settings = provider_settings(where, table, base, models, doc.reasoning_effort, doc.web_search)
        agent = _agent(where, table, settings, project_root, base)
        agents.append(agent)
        tree.check_group(where, table.group)
        tree.actors.append(ActorSpec(
            id=agent.id, template="agent", group=table.group, restart=table.restart,
            shutdown_timeout_ms=table.shutdown_timeout_ms, params={"agent_id": agent.id},
            env_passthrough=provider_env(agent.provider, agent.provider_config),
        ))
    return tuple(agents)


def _templates(doc: SpecFile, base: Path, models: ModelRegistry) -> tuple[TemplateSpec, ...]:
    return tuple(
        TemplateSpec(id=table.id, provider=table.provider, **_options(table, Permissions),
                     **_definition(f"templates[{index}]", table, base),
                     provider_config=provider_settings(f"templates[{index}]", table, base, models,
                                                       doc.reasoning_effort, doc.web_search))
        for index, table in enumerate(doc.templates)
    )


def _agent(where: str, table: AgentTable, provider_config: dict[str, Any], project_root: Path, base: Path
           ) -> AgentSpec:
    workspace = (project_root / table.workspace).resolve()
    if workspace != project_root and project_root not in workspace.parents:
        raise SpecError(f"{where}.workspace: {workspace} is outside the project root {project_root}")
    return AgentSpec(id=table.id, provider=table.provider, provider_config=provider_config, workspace=workspace,
                     **{**_options(table, AgentOptions), **_definition(where, table, base)})


def _definition(where: str, table: AgentDefinition, base: Path) -> dict[str, Any]:
    """Its instructions, the file's path made absolute (after symlinks) and read once
    now, so a missing or oversized file stops `corral up` rather than a run."""
    from corral.actors.agent_instructions import InstructionsError, read_file

    found: dict[str, Any] = {"instructions": table.instructions, "instructions_file": None, "output": None}
    if table.instructions_file is not None:
        path = spec_path(base, table.instructions_file)
        try:
            read_file(str(path))
        except InstructionsError as exc:
            raise SpecError(f"{where}.instructions_file: {exc}") from None
        found["instructions_file"] = str(path)
    if table.output is not None:
        found["output"] = _output(f"{where}.output", table.output)
    return found


def _output(where: str, value: dict[str, Any] | str) -> dict[str, Any]:
    """The typed output settled: a schema checked, a model loaded (and pinned, as
    user code is at `corral up`) and its schema taken."""
    from corral.actors.typed_output import OutputSpecError, resolve
    from corral.actors.user_code import pin_reference

    try:
        settled = resolve(value)
    except OutputSpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    if settled.model is not None:
        pin_reference(settled.model)
    return {"schema": settled.schema, "model": settled.model}


def _options(table: Any, kind: type[Any]) -> dict[str, Any]:
    """The fields a table shares with what it becomes (its base ``kind``), as they are."""
    return {item.name: getattr(table, item.name) for item in dataclasses.fields(kind)}


def _user_template(where: str, template: str) -> None:
    """A user template is a ``module:Name`` reference; only its form is checked here:
    it is imported in its actor, where a failure counts against restart intensity."""
    from corral.actors.user_code import check_syntax, is_reference, pin_reference
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
    pin_reference(template)  # loaded now, while `corral up` pins user code; its actor reports a failure


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


def _tool_modules(modules: tuple[str, ...], base: Path) -> tuple[tuple[str, ...], dict[str, UserTool]]:
    """Import the user's tool modules now, and the catalog of the tools in them: a
    module that fails to import, or a tool name declared twice or taken by a
    built-in, is a spec error naming it, and nothing starts."""
    from corral.actors.tools.declare import ToolDeclarationError
    from corral.actors.user_code import tool_catalog, tool_entry_points, tool_module_name
    from corral.core.errors import UserCodeError

    entry_points = tool_entry_points()  # once: it reads every installed distribution's metadata
    try:
        # The names each process imports them by: private names for user files.
        resolved = [tool_module_name(str(spec_path(base, entry)) if entry.endswith(".py") else entry)
                    for entry in modules]
        entries = tuple(dict.fromkeys([*resolved, *(tool_module_name(entry) for entry in entry_points)]))
        return entries, tool_catalog(entries, reserved=builtin_tools())
    except (UserCodeError, ToolDeclarationError) as exc:
        raise SpecError(f"tools.modules: {exc}") from None


def _check_parallel_reads(where: str, names: tuple[str, ...], tools: Mapping[str, Tool]) -> None:
    """Exact names of read-only tools (no globs: the list is strict)."""
    for name in names:
        tool = tools.get(name)
        if tool is None or tool.schema.effect_class != "read":
            raise SpecError(f"{where}.parallel_reads: {name!r} is not a read-only tool (only reads run in parallel)")


def _check_policy_keys(
    tables: list[tuple[str, Mapping[str, str]]], mcp_ids: set[str], tools: Mapping[str, Tool]
) -> None:
    """A misspelled key must not fail open: every key names a known tool, a glob that
    matches one, or a tool of a declared MCP server (``mcp.<server>.<tool or glob>``)."""
    # A tool's permission (``agent.action_history``'s ``agent.audit``, seed 004 V1.6) is
    # a key too.
    permissions = {getattr(tool, "permission", None) for tool in tools.values()}
    known = sorted({*tools, *(str(name) for name in permissions if name)})
    for where, table in tables:
        for key in table:
            if key == POLICY_DEFAULT_KEY:
                continue
            if key in (RETIRED_PLAN_TOOL, "plan.*"):
                raise SpecError(f"{where}.{key}: {RETIRED_PLAN_HINT}; no policy applies to the plan")
            if not _names_a_tool(key, known, mcp_ids):
                raise SpecError(f"{where}.{key}: no tool {key!r}{_hint(key, known)}")


def _check_mandatory_approval(tables: list[tuple[str, Mapping[str, str]]], tools: Mapping[str, Tool]) -> None:
    """A tool whose approval is mandatory (``min_policy``: project.git_commit) named with
    a weaker policy is an error, not a silent override. A glob that matches it (``"*" =
    "auto"``) is not: the run layer never goes below the tool's floor."""
    floors = {name: str(getattr(tool, "min_policy", "auto")) for name, tool in tools.items()}
    for where, table in tables:
        for key, mode in table.items():
            floor = POLICIES.index(floors.get(key, "auto"))  # POLICIES: weakest first
            if POLICIES.index(mode) < floor:
                raise SpecError(f"{where}.{key}: {key} always needs a person's approval: its policy may be"
                                f" {' or '.join(repr(m) for m in POLICIES[floor:])}, not {mode!r}")


#: The plan update was a tool before seed 004 V1.17 was followed to the letter.
RETIRED_PLAN_TOOL = "plan.update"
RETIRED_PLAN_HINT = (
    "plan.update is no longer a tool: an agent keeps its plan in its answer's planUpdate, beside its actions"
    " (update_agent_plan with native function calls); remove it from tools (docs/long-tasks.md)"
)


def _check_tool_globs(
    lists: list[tuple[str, tuple[str, ...] | None]], mcp_ids: set[str], tools: Mapping[str, Tool]
) -> None:
    """A ``tools`` entry that matches nothing would offer the agent nothing and fail
    its runs later with ``unknown tool``: it is an error here, with a hint."""
    known = sorted(tools)
    for where, globs in lists:
        for index, pattern in enumerate(globs or ()):
            if pattern == RETIRED_PLAN_TOOL:
                raise SpecError(f"{where}[{index}]: {RETIRED_PLAN_HINT}")
            if not _names_a_tool(pattern, known, mcp_ids):
                raise SpecError(f"{where}[{index}]: no tool matches {pattern!r}{_hint(pattern, known)}")


def _names_a_tool(key: str, known: list[str], mcp_ids: set[str]) -> bool:
    """``key`` is a known tool, a glob matching one, or names a declared MCP server's
    tools (``mcp.<server>.<tool or glob>``, or a glob over the servers), whose names
    are only known once the server runs."""
    if key in known:
        return True
    is_glob = any(ch in key for ch in "*?[")
    if is_glob and any(fnmatch.fnmatchcase(name, key) for name in known):
        return True
    if key.startswith("mcp."):
        parts = split_tool_name(key, mcp_ids)
        if parts is not None and parts[0] in mcp_ids:
            return True
        # ``mcp.*`` or ``mcp.g*``: some declared server's tools may match.
        return is_glob and any(fnmatch.fnmatchcase(f"mcp.{ident}.tool", key) for ident in mcp_ids)
    return False


def _hint(key: str, known: list[str]) -> str:
    """A did-you-mean against the tool names and their families (``weather.*``), so a
    misspelled glob gets a glob back; otherwise the families to choose from."""
    families = sorted({f"{name.rpartition('.')[0]}.*" for name in known if "." in name})
    candidates = families + known if any(ch in key for ch in "*?[") else known + families
    return did_you_mean(key, candidates) or f" (tools: {', '.join(families)} or one of their names)"
