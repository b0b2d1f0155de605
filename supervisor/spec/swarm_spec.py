"""The swarm spec: a TOML file declaring groups, actors and agents.

Parsing is strict: an unknown key, a wrong type or an impossible value is a
``SpecError`` naming the exact place, and nothing starts. Every key, type,
default and range is a field of the pydantic dataclasses in supervisor/spec/spec_models.py
(and mcp_spec, model_spec and bridge_spec for their sections); supervisor/spec/spec_resolve.py
reads a spec against them and builds the ``SwarmSpec`` below. The reference page
is generated from them: ``python -m corral.supervisor.spec.spec_doc > docs/spec.md``.

This module is what the rest of corral imports, and it stays light: every ``corral``
command imports it, most never parse a spec, and pydantic with the sections costs
~100 ms of CPU to import. The sections are imported when a spec is first parsed,
or when one of their names is taken from here.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core import nesting
from corral.supervisor.spec.bounded_files import FileReadError, read_text_bounded
from corral.supervisor.spec.spec_base import MAX_STRING_CHARS, SpecError

if TYPE_CHECKING:
    from corral.actors.tools.declare import UserTool
    from corral.supervisor.bridge.bridge_spec import BridgeSpec
    from corral.supervisor.mcp.mcp_spec import McpServerSpec
    from corral.supervisor.models.model_spec import LocalModelSpec
    from corral.supervisor.spec.spec_models import (
        KNOWN_TEMPLATES,
        MAX_NAME_CHARS,
        POLICIES,
        ROOT_GROUP,
        ActorSpec,
        AgentSpec,
        GroupSpec,
        LedgerSpec,
        SandboxSettings,
        SupervisorSettings,
        SwarmLimits,
        TelemetrySpec,
        TemplateSpec,
    )

__all__ = [
    "KNOWN_TEMPLATES", "MAX_NAME_CHARS", "MAX_STRING_CHARS", "POLICIES", "ROOT_GROUP", "ActorSpec", "AgentSpec",
    "GroupSpec", "SandboxSettings", "SpecError", "SupervisorSettings", "SwarmLimits", "SwarmSpec", "TemplateSpec",
    "empty_spec", "load_spec", "parse_spec", "provider_env",
]
#: Names of supervisor/spec/spec_models.py taken from here, imported on first use.
_FROM_MODELS = frozenset({
    "KNOWN_TEMPLATES", "MAX_NAME_CHARS", "POLICIES", "ROOT_GROUP", "ActorSpec", "AgentSpec", "GroupSpec",
    "SandboxSettings", "SupervisorSettings", "SwarmLimits", "TemplateSpec",
})


def __getattr__(name: str) -> Any:
    if name in _FROM_MODELS:
        from corral.supervisor.spec import spec_models

        return getattr(spec_models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, kw_only=True)
class SwarmSpec:
    """A spec as the supervisor runs it: every section read, checked and resolved."""

    name: str
    supervisor: SupervisorSettings
    groups: tuple[GroupSpec, ...]
    actors: tuple[ActorSpec, ...]
    raw: dict[str, Any]
    source: str
    agents: tuple[AgentSpec, ...]
    templates: tuple[TemplateSpec, ...]
    policy: dict[str, str]
    limits: SwarmLimits
    project_root: Path
    effects_file: Path | None
    sandbox: SandboxSettings
    mcp_servers: tuple[McpServerSpec, ...]
    #: Local GGUF models, one ``model`` actor each (see supervisor/models/model_spec.py).
    models: tuple[LocalModelSpec, ...]
    #: ``[tools] modules``, resolved (file paths absolute), plus the ``corral.tools``
    #: entry points: imported here, in the fork server and in every actor.
    tool_modules: tuple[str, ...]
    #: The ``@corral.tool`` functions found in ``tool_modules``, by name: the catalog
    #: of the user's tools, built once where the modules were imported (nothing
    #: registers itself; ``registry.all_tools`` joins it to the built-ins).
    user_tools: Mapping[str, UserTool]
    #: ``[bridge]``: work for an agent-task bridge (supervisor/bridge/bridge_spec.py).
    bridge: BridgeSpec | None
    #: ``[ledger]``: a PostgreSQL ledger shared by several nodes (supervisor/ledger/ledger_spec.py).
    ledger: LedgerSpec | None
    #: ``[telemetry]``: OpenTelemetry traces of finished runs (supervisor/telemetry/).
    telemetry: TelemetrySpec

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


def parse_spec(data: dict[str, Any], source: str = "<embedded>") -> SwarmSpec:
    """``data`` (a spec's TOML, as a dict) as the supervisor runs it; ``source`` is the
    file it came from, which relative paths in it are relative to."""
    from corral.supervisor.spec import spec_resolve  # pydantic and the sections, once a spec is parsed
    from corral.supervisor.spec.script_tools import check_spec_scripts
    from corral.supervisor.spec.spec_deps import resolve_deps

    spec = spec_resolve.parse(data, source)
    check_spec_scripts(spec)  # once the whole catalog is known (user tools, MCP servers)
    return resolve_deps(spec)  # the tools' deps factories, loaded (pinned) now


def provider_env(provider: str, config: dict[str, Any]) -> tuple[str, ...]:
    if provider in ("scripted", "local"):
        return ()
    # openai reads OPENAI_API_KEY unless told otherwise; a user provider names its variable.
    name = config.get("api_key_env", "OPENAI_API_KEY" if provider == "openai" else "")
    return (name,) if isinstance(name, str) and name else ()


#: Arrays and inline tables nest at most this deep in a spec: tomllib recurses once
#: per level, and 5,000 levels raised RecursionError out of it (issue 32).
MAX_SPEC_DEPTH = 32


def load_spec(path: Path) -> SwarmSpec:
    try:
        text = read_text_bounded(path, "spec")
    except FileReadError as exc:
        raise SpecError(str(exc)) from None
    try:
        nesting.check_toml(text, MAX_SPEC_DEPTH)
        data = tomllib.loads(text)
    except nesting.TooDeep as exc:
        raise SpecError(f"{path}: arrays or inline tables {exc}") from None
    except RecursionError:  # the depth check above should make this unreachable
        raise SpecError(f"{path}: nested too deeply to parse") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    return parse_spec(data, str(path))


def empty_spec() -> SwarmSpec:
    return parse_spec({})
