"""The swarm spec's own sections as frozen pydantic dataclasses: every key, its
type, default, range and meaning, stated once (``docs/spec.md`` is generated from
here: ``python -m corral.supervisor.spec.spec_doc``).

A section the supervisor uses as it is written (``[supervisor]``, ``[[groups]]``,
``[limits]``, ``[sandbox]``) is also its runtime object. An array whose entries
become something else shares a base with what they become, so both keep one
statement of each default and range: an ``[[actors]]`` entry with a ``count``
becomes that many ``ActorSpec``; an ``[[agents]]`` entry becomes an ``AgentSpec``
and the ``ActorSpec`` that runs it; a ``[[templates]]`` entry a ``TemplateSpec``.
The checks that need the whole spec or the disk (a group that exists, a workspace
inside the project root, a script that parses) are in supervisor/spec/spec_resolve.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from corral.core.loopback_url import NotLoopback, loopback_page
from corral.mailbox.codec import DEFAULT_MAX_FRAME
from corral.mailbox.control import DEFAULT_MAX_LONG_POLLS
from corral.sandbox.launcher import LaunchMode
from corral.supervisor.bridge.bridge_spec import BridgeSpec
from corral.supervisor.ledger.ledger_pg_cluster import PARTITION_NAME, is_postgres_url
from corral.supervisor.ledger.ledger_spec import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_RUNS_PER_AGENT,
    DEFAULT_POLL_S,
    DEFAULT_RETIRE_IDLE_S,
    node_problem,
    url_problem,
)
from corral.supervisor.mcp.mcp_spec import McpServerSpec
from corral.supervisor.models.model_spec import LocalModelSpec
from corral.supervisor.spec.spec_base import MIB, SECTION, problem
from corral.supervisor.tree.restart_policy import RestartType, Strategy

ROOT_GROUP = "root"
MAX_NAME_CHARS = 128
KNOWN_TEMPLATES = ("echo", "agent", "child", "session", "mcp", "model", "bridge_worker")
PolicyMode = Literal["auto", "confirm", "deny"]
#: The context limits' defaults, in tokens (seed 004 V1.21).
DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_AUTO_COMPACT = 64_000
DEFAULT_TOOL_OUTPUT = 12_000
#: Room kept in the window beside the auto limit and a reply's max_tokens.
CONTEXT_MARGIN_TOKENS = 256
#: How hard a reasoning model thinks (seed 004 V1.2); ``default`` sends the provider nothing.
ReasoningEffort = Literal["default", "low", "medium", "high"]
POLICIES: tuple[str, ...] = get_args(PolicyMode)
#: The key of a policy table that sets the approval of every tool it does not name
#: (``[policy] default = "auto"``: an unattended swarm). No tool may be called this.
POLICY_DEFAULT_KEY = "default"
#: The id of a group, an actor, an agent or a template.
SpecId = Annotated[StrictStr, Field(pattern=r"^[a-z][a-z0-9_-]{0,47}$")]
ToolGlob = Annotated[StrictStr, Field(min_length=1, max_length=200)]


def _name(value: str) -> str:
    if not 0 < len(value) <= MAX_NAME_CHARS or not value.isprintable():
        raise problem(f"must be 1..{MAX_NAME_CHARS} printable characters")
    return value


def _relative(scopes: tuple[str, ...]) -> tuple[str, ...]:
    for scope in scopes:
        if scope.startswith("/") or ".." in Path(scope).parts:
            raise problem(f"{scope!r} must be relative without '..'")
    return scopes


@dataclass(frozen=True, kw_only=True, config=SECTION)
class SupervisorSettings:
    """``[supervisor]``: how the supervisor talks to its actors and keeps its ledger."""

    transport: Literal["nng", "unix", "tcp"] = Field(
        default="nng",
        description="What actor links are made of: `nng` (nng Pair0 sockets in the home), `unix` (raw Unix stream"
        " sockets in the home: the measured fast path) or `tcp` (raw stream sockets on loopback, for a home whose"
        " path is too long for a socket; the control API then listens on loopback too).")
    launch: LaunchMode = Field(
        default=LaunchMode.FORKSERVER,
        description="How actor processes start: forked from a warm fork server, or each a fresh `exec`.")
    max_frame: StrictInt = Field(
        default=DEFAULT_MAX_FRAME, ge=1024, le=64 * MIB,
        description="Largest message, in bytes, between the supervisor and an actor or a control client.")
    inbox_size: StrictInt = Field(
        default=256, ge=1, le=100_000, description="Messages a mailbox holds before its senders wait.")
    synchronous: Literal["full", "normal"] = Field(
        default="full", description="SQLite `synchronous` of the ledger: `full` fsyncs every commit; `normal` may lose"
        " the last commits on a power cut (not on a crash of corral).")
    heartbeat_s: StrictFloat = Field(
        default=2.0, ge=0.05, le=3600,
        description="Seconds between the supervisor's own heartbeats: the endpoint's timestamp, the home-lock"
        " check and the full-disk probe.")
    stall_timeout_s: StrictFloat = Field(
        default=30.0, ge=0.5, le=86_400,
        description="An actor silent this long (no heartbeat, no message) is stalled: it is killed and restarted"
        " per its policy. It is reported as stalled from half of it.")
    max_long_polls: StrictInt = Field(
        default=DEFAULT_MAX_LONG_POLLS, ge=1, le=100_000,
        description="Control requests that wait (`events`, `wait`, a session poll...) held at once; past it they"
        " are refused at once, and `status` and `ping` still answer.")
    probes: StrictBool = Field(
        default=False,
        description="Register the load probes that bench/ drives: `bench.sink` (one-way tells counted, not stored)"
        " and `bench.emit_events` (ledger events at a set rate). Off, those methods do not exist.")


@dataclass(frozen=True, config=SECTION)
class GroupSpec:
    """A supervision group as the tree runs it."""

    id: str = Field(description="The group's id, named by an actor's or agent's `group`.")
    strategy: Strategy = Field(
        default=Strategy.ONE_FOR_ONE,
        description="Which members restart when one exits: `one_for_one` that one, `one_for_all` all of them,"
        " `rest_for_one` it and those declared after it.")
    max_restarts: StrictInt = Field(
        default=3, ge=0, le=1_000_000,
        description="Restarts allowed within `period_s`; one more stops the group (restart intensity, as in OTP).")
    period_s: StrictFloat = Field(
        default=5.0, ge=0.001, le=86_400,
        description="The window of `max_restarts`, in seconds.")


@dataclass(frozen=True, config=SECTION)
class GroupTable(GroupSpec):
    """``[[groups]]``: a supervision group. The ``root`` group always exists (one_for_one,
    3 restarts in 5 s; a ``[[groups]]`` entry with id ``root`` replaces it), and every
    MCP server, model and child gets a group of its own."""

    id: SpecId = Field(description="The group's id, named by an actor's or agent's `group`.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class Supervised:
    """How an actor (or an agent's actor) is supervised."""

    group: str = Field(default=ROOT_GROUP, description="The `[[groups]]` id it belongs to.")
    restart: RestartType = Field(
        default=RestartType.PERMANENT,
        description="`permanent`: always restarted; `transient`: only after an abnormal exit; `temporary`: never.")
    shutdown_timeout_ms: StrictInt = Field(
        default=2000, ge=1, le=3_600_000, description="Milliseconds it gets to stop when asked, before it is killed.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ActorOptions(Supervised):
    template: StrictStr = Field(
        description=f"What it runs: a built-in template ({', '.join(KNOWN_TEMPLATES)}) or a"
        " `package.module:Name` reference to an actor of your own (docs/extending.md).")
    backoff_base_ms: StrictInt = Field(
        default=20, ge=0, le=3_600_000,
        description="The delay before its second restart within a period, doubled for each further one (the first"
        " is immediate).")
    backoff_max_ms: StrictInt = Field(default=2000, ge=0, le=3_600_000, description="The longest restart delay.")
    backoff_jitter: StrictFloat = Field(
        default=0.2, ge=0, le=1, description="Each delay is spread by up to this fraction, up or down.")
    params: dict[str, Any] = Field(default_factory=dict, description="Passed to the actor as they are.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ActorSpec(ActorOptions):
    """An actor as the supervision tree runs it."""

    id: str
    #: Environment variables this actor gets despite the scrub (an agent's API key
    #: variable, declared by its provider config); nothing else passes.
    env_passthrough: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ActorTable(ActorOptions):
    """``[[actors]]``: plain actors under supervision."""

    id: SpecId = Field(description="The actor's id (with `count` above 1: `<id>-1`, `<id>-2`, ...).")
    count: StrictInt = Field(default=1, ge=1, le=10_000, description="How many identical actors to run.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class Permissions:
    policy: dict[str, PolicyMode] = Field(
        default_factory=dict,
        description="Per-tool approval (`auto`, `confirm` or `deny`), over the top-level `[policy]`. A key names"
        " a tool, a glob matching one, or `mcp.<server>.<tool or glob>`; a key that matches nothing is an error."
        " `default` sets every tool the tables do not name, over the tools' own defaults. `project.git_commit`"
        " always needs approval: `auto` for it is an error, and a glob's or the default's `auto` does not"
        " lower it.")
    tools: tuple[ToolGlob, ...] | None = Field(
        default=None,
        description="Globs of the tools it may use and is offered (`fs.*`, `mcp.git.*`); unset: all of them.")


#: An agent's own instructions, inline: a role, not a document (a longer one goes in a file).
MAX_INSTRUCTIONS_CHARS = 32 * 1024


@dataclass(frozen=True, kw_only=True, config=SECTION)
class AgentDefinition:
    """What an agent is told it is (issue 49): its own instructions, which lead the
    system prompt of every turn, before the project context."""

    instructions: StrictStr | None = Field(
        default=None, min_length=1, max_length=MAX_INSTRUCTIONS_CHARS,
        description="Its own instructions (a role, rules, a style): they lead the system prompt of every turn,"
        " before the project context; a delegate or a child gets its own agent's or template's. Part of the"
        " plan's context fingerprint, shown by `corral transcript`.")
    instructions_file: StrictStr | None = Field(
        default=None, min_length=1,
        description="A UTF-8 file of instructions, relative to the spec (at most 64 KiB), after `instructions`"
        " when both are set. Read again at every turn: an edit between a plan and its actions blocks them as"
        " an AGENTS.md edit does (docs/agents.md).")
    output: dict[str, Any] | StrictStr | None = Field(
        default=None,
        description="Its typed output: a JSON Schema of an object (an inline table), or `\"module:Class\"` naming"
        " a pydantic model in a tools module. The model is constrained to it where its provider allows, the final"
        " reply is checked against it (an invalid one gets the bounded repair, naming the field), and the run's"
        " `output` is the validated value (docs/agents.md).")

    @field_validator("output", mode="before")
    @classmethod
    def _output_form(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict | str):
            raise problem("must be a JSON Schema (a table) or a 'module:Class' naming a pydantic model")
        return value

    def definition_options(self) -> dict[str, Any]:
        """What a run of it carries in its options (absent: nothing set). ``output``
        is the resolved one here (``{"schema", "model"}``: supervisor/spec/spec_resolve.py)."""
        found: dict[str, Any] = {}
        if self.instructions is not None or self.instructions_file is not None:
            found["instructions"] = {"text": self.instructions or "", "file": self.instructions_file}
        if isinstance(self.output, dict):
            found["output"] = self.output
        return found


@dataclass(frozen=True, kw_only=True, config=SECTION)
class AgentOptions(AgentDefinition, Permissions):
    role: Literal["root", "specialist"] = Field(
        default="root", description="`specialist`: an agent that `agent.delegate` may hand work to (delegations go"
        " only to specialists); `root`: one that is not.")
    write_scopes: Annotated[tuple[StrictStr, ...], AfterValidator(_relative)] = Field(
        default=(".",), description="Paths, relative to its workspace and without `..`, that its file tools may write.")
    max_repairs: StrictInt = Field(
        default=2, ge=0, le=100,
        description="Times a run may ask the model to repair a plan it could not use, before the run fails.")
    max_provider_retries: StrictInt = Field(
        default=3, ge=0, le=100, description="Retries of a provider request that failed transiently.")
    retry_base_s: StrictFloat = Field(
        default=0.5, ge=0.001, le=3600, description="The first retry's delay; doubled for each further one.")
    retry_cap_s: StrictFloat = Field(default=30.0, ge=0.001, le=86_400, description="The longest retry delay.")
    context_window: StrictInt | None = Field(
        default=None, ge=256, le=10_000_000,
        description=f"The model's context, in tokens; unset: {DEFAULT_CONTEXT_WINDOW} (seed 004 V1.21;"
        " docs/long-tasks.md).")
    auto_compact_token_limit: StrictInt | None = Field(
        default=None, ge=64, le=10_000_000,
        description="Past this many tokens older turns are folded into a summary; below `context_window`; unset:"
        f" {DEFAULT_AUTO_COMPACT}, or 3/4 of a smaller `context_window`.")
    tool_output_token_limit: StrictInt | None = Field(
        default=None, ge=16, le=10_000_000,
        description="A longer tool output is cut in the prompt (the whole one is kept); unset:"
        f" {DEFAULT_TOOL_OUTPUT}, or the auto limit if that is smaller.")
    parallel_reads: tuple[StrictStr, ...] = Field(
        default=(),
        description="Exact names of read-only tools whose consecutive auto-approved calls may run at the same"
        " time; empty: reads run one after another.")
    allow_free_text: StrictBool = Field(
        default=True,
        description="Only `true`: an answer to its `user.input_request` may always be free text instead of one"
        " of the question's 2-3 options (seed 004 V1.23); neither the model nor a spec turns that off.")

    @field_validator("allow_free_text")
    @classmethod
    def _free_text_always(cls, value: bool) -> bool:
        # Seed 004 V1.23: "自由输入始终允许" (free input is always allowed).
        if not value:
            raise problem("free text is always allowed in an answer to user.input_request (seed 004 V1.23);"
                          " remove allow_free_text = false")
        return value
    deps: StrictStr | None = Field(
        default=None, min_length=1, max_length=300,
        description="Dependencies for its tools: a `\"module:function\"` called once in its process at start,"
        " before any tool runs; the value is `ctx.deps` in every tool (an async context manager is entered then"
        " and exited when the actor stops). Unset: `[tools] deps`. A factory that fails stops `corral up`"
        " (docs/extending.md).")

    @model_validator(mode="after")
    def _context_limits(self) -> AgentOptions:
        self.context_limits()
        return self

    def context_limits(self, max_output: int = 0) -> dict[str, int]:
        """The token limits with the seed's defaults (V1.21: 128,000 / 64,000 / 12,000),
        the auto limit below the window with room for a reply of ``max_output`` tokens
        and a fixed margin (each limit is above 0 by its field's bounds)."""
        window = self.context_window or DEFAULT_CONTEXT_WINDOW
        auto = self.auto_compact_token_limit or min(DEFAULT_AUTO_COMPACT, window * 3 // 4)
        tool_output = self.tool_output_token_limit or min(DEFAULT_TOOL_OUTPUT, auto)
        if auto >= window:
            raise problem(f"auto_compact_token_limit ({auto}) must be below context_window ({window})")
        if max_output and auto + max_output + CONTEXT_MARGIN_TOKENS > window:
            raise problem(f"auto_compact_token_limit ({auto}) leaves no room in context_window ({window}) for a"
                          f" reply of max_tokens ({max_output}) and a margin of {CONTEXT_MARGIN_TOKENS}")
        return {"window": window, "auto_compact": auto, "tool_output": tool_output}


@dataclass(frozen=True, kw_only=True, config=SECTION)
class AgentSpec(AgentOptions):
    """An agent as its runs get it: the provider settled, the workspace resolved."""

    id: str
    provider: str
    provider_config: dict[str, Any]
    workspace: Path


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ProviderKeys:
    """Which model plans the runs, and its settings (docs/providers.md)."""

    provider: StrictStr = Field(
        default="scripted", description="`scripted`, `openai`, `local`, or your own provider (`package.module:Name` or"
        " an entry-point name).")
    script: StrictStr | None = Field(
        default=None, description="scripted: a TOML or JSON script file, relative to the spec (or give `steps`).")
    steps: list[dict[str, Any]] | None = Field(
        default=None, description="scripted: the script inline, one table per loop (keys: `[[agents.steps]]`).")
    openai: dict[str, Any] | None = Field(
        default=None, description="openai: an OpenAI-compatible server (keys: `[agents.openai]`).")
    local: dict[str, Any] | None = Field(
        default=None, description="local: a GGUF model on this machine (keys: `[agents.local]`).")
    provider_config: dict[str, Any] | None = Field(
        default=None, description="Your own provider's settings, given to it as they are (not for the built-in ones).")
    reasoning_effort: ReasoningEffort | None = Field(
        default=None, description="`default`, `low`, `medium` or `high`: sent to an `openai` provider as"
        " `reasoning_effort` (`default`: not sent) and recorded with each provider turn; unset: the spec's"
        " top-level `reasoning_effort`. Other providers take only `default`.")
    web_search: StrictBool | Literal["inherit"] = Field(
        default="inherit", description="Whether its planning turns may use the provider's own web search (an"
        " `openai` provider sends `web_search_options`; summaries never search); each turn records it."
        " `inherit`: the spec's top-level `web_search`. A provider that cannot search refuses `true` at"
        " `corral up`.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class AgentTable(ProviderKeys, AgentOptions, Supervised):
    """``[[agents]]``: an LLM agent, one actor of its own."""

    id: SpecId = Field(description="The agent's id (also its actor's).")
    workspace: StrictStr = Field(
        default=".", description="Its working directory, relative to the project root and inside it (after symlinks).")

    @model_validator(mode="after")
    def _room_for_the_reply(self) -> AgentTable:
        settings = self.openai if self.provider == "openai" else self.local if self.provider == "local" else None
        max_output = (settings or {}).get("max_tokens")
        if isinstance(max_output, int) and not isinstance(max_output, bool) and max_output > 0:
            self.context_limits(max_output)
        return self


@dataclass(frozen=True, kw_only=True, config=SECTION)
class TemplateSpec(AgentDefinition, Permissions):
    """An isolated-child template as ``agent.spawn_isolated`` uses it."""

    id: str
    provider: str
    provider_config: dict[str, Any]


@dataclass(frozen=True, kw_only=True, config=SECTION)
class TemplateTable(ProviderKeys, AgentDefinition, Permissions):
    """``[[templates]]``: what an isolated child (``agent.spawn_isolated``) runs; each
    child is a fresh agent with its own run, session and write scopes."""

    id: SpecId = Field(description="The template's id, named by a child's `template`.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class SwarmLimits:
    """``[limits]``: what delegation and isolated children may do (docs/swarm.md)."""

    max_children_per_call: StrictInt = Field(
        default=3, ge=1, le=64, description="Children one `agent.spawn_isolated` call may start.")
    max_depth: StrictInt = Field(
        default=1, ge=1, le=16, description="How deep children and delegations may nest below a root run.")
    child_timeout_s: StrictFloat = Field(
        default=120.0, ge=0.1, le=7 * 86_400,
        description="A child still running after this long yields a failed result.")
    max_repairs_per_delivery: StrictInt = Field(
        default=1, ge=0, le=100,
        description="Accepted and checked, but not read: a delivery gets at most one repair (`repair_of`,"
        " repair depth 1).")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class SandboxSettings:
    """``[sandbox]``: how commands and process sessions are isolated (docs/sessions.md)."""

    mode: Literal["required", "allow-unsandboxed"] = Field(
        default="required", description="`required`: without bubblewrap commands fail closed; `allow-unsandboxed`: they"
        " run without it, and every receipt says so.")
    network: StrictBool = Field(default=False, description="Whether commands may use the network.")
    cpu_s: StrictInt | None = Field(
        default=None, ge=1, le=7 * 86_400,
        description="RLIMIT_CPU of a command, in seconds.")
    address_space_bytes: StrictInt | None = Field(
        default=None, ge=16 * MIB, le=1024**4, description="RLIMIT_AS of a command, in bytes.")
    open_files: StrictInt | None = Field(default=None, ge=16, le=1_048_576, description="RLIMIT_NOFILE of a command.")
    processes: StrictInt | None = Field(default=None, ge=1, le=1_000_000, description="RLIMIT_NPROC of a command.")


#: One verify command: a program and its arguments, no shell.
VerifyArgv = Annotated[tuple[Annotated[StrictStr, Field(min_length=1, max_length=4096)], ...],
                       Field(min_length=1)]
MAX_VERIFY_COMMANDS = 16


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ProjectTable:
    """``[project]``: the directory agents work in."""

    root: StrictStr = Field(
        default=".", description="Relative to the spec file. Never `/`, a system directory, your home directory or a"
        " directory holding it (after symlinks); checked whenever it is given or something works in it.")
    verify: tuple[VerifyArgv, ...] = Field(
        default=(), max_length=MAX_VERIFY_COMMANDS,
        description="The project's checks, each an argv list (`[[\"pytest\", \"-q\"]]`): `project.verify` runs them"
        " in order in the command sandbox, in the project root, and records a verification bound to the project"
        " revision (docs/project-context.md).")
    require_verification: StrictBool | None = Field(
        default=None, description="Whether a final reply of a run that changed sources needs a passed verification"
        " on the current project revision. Unset: true exactly when `verify` lists commands; true without"
        " commands is an error.")

    require_preview: StrictBool = Field(
        default=False, description="Whether a final reply of a run that changed sources also needs a"
        " `preview.validate` that passed after the project's latest change (docs/project-context.md).")
    preview_url: StrictStr | None = Field(
        default=None, description="The project's preview when it is not a process session of the run:"
        " `http://127.0.0.1:PORT/path` (exactly 127.0.0.1, and a port). `preview.validate` checks this page"
        " when no running process session of the run listens on a loopback port.")

    @field_validator("preview_url")
    @classmethod
    def _loopback_preview(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                loopback_page(value)
            except NotLoopback as exc:
                raise problem(f"preview_url {value[:120]!r} is not a loopback page: {exc}") from None
        return value

    @field_validator("require_verification")
    @classmethod
    def _needs_commands(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value and not info.data.get("verify"):
            raise problem("require_verification = true needs verify commands: list them in verify")
        return value

    @property
    def verification_required(self) -> bool:
        return bool(self.verify) if self.require_verification is None else self.require_verification


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ChaosTable:
    """``[chaos]``: what `corral chaos --scenario` and the effect tools use (docs/chaos.md)."""

    effects_file: StrictStr | None = Field(
        default=None,
        description="Where `effect.record` appends, relative to the spec; unset: `effects.log` in the home.")
    root_agent: StrictStr | None = Field(
        default=None, description="The agent a chaos episode starts; unset: the first agent with `role = \"root\"`.")
    task: StrictStr | None = Field(default=None, description="The task of a chaos episode; unset: `chaos run`.")
    workspace_files: dict[str, Any] = Field(default_factory=dict, description="Accepted, not read.")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ToolsTable:
    """``[tools]``: tools of your own (docs/extending.md)."""

    modules: tuple[Annotated[StrictStr, Field(min_length=1, max_length=4096)], ...] = Field(
        default=(), description="Modules holding `@corral.tool` functions: dotted names, or `.py` files relative to the"
        " spec. They are imported at load (a failure is a spec error), and with the `corral.tools` entry points.")
    deps: StrictStr | None = Field(
        default=None, min_length=1, max_length=300,
        description="The `deps` factory (`\"module:function\"`) of every agent that names none of its own.")


#: An environment variable's name, as ``headers_env`` names one.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class TelemetrySpec:
    """``[telemetry]``: OpenTelemetry traces of finished runs (docs/telemetry.md), with the
    ``telemetry`` extra (``pip install 'corral[telemetry]'``). The standard ``OTEL_*``
    variables of the supervisor's environment configure what this table leaves unset."""

    enabled: StrictBool | None = Field(
        default=None, description="`true`: export traces; `false`: never, whatever the environment says; unset:"
        " export when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set."
        " `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.")
    endpoint: StrictStr | None = Field(
        default=None, description="The OTLP/HTTP collector's base URL (`http://127.0.0.1:4318`); traces go to"
        " `<endpoint>/v1/traces`. Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`,"
        " else `http://localhost:4318`. No credentials in it: use `headers_env`.")
    service_name: StrictStr | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_CHARS,
        description="The traces' `service.name`; unset: `OTEL_SERVICE_NAME`, else `corral`.")
    headers_env: StrictStr | None = Field(
        default=None, description="The name of an environment variable of the supervisor holding the exporter's"
        " headers (`key=value,key2=value2`, e.g. an API key); unset: `OTEL_EXPORTER_OTLP_HEADERS`. The headers"
        " themselves never go in the spec.")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise problem("must be an http:// or https:// URL (OTLP over HTTP)")
        if parts.username is not None or parts.password is not None:
            raise problem("must not carry credentials; name a variable holding headers in headers_env")
        return endpoint

    @field_validator("headers_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not ENV_NAME.match(name):
            raise problem("must be the name of an environment variable (letters, digits, '_')")
        return name


@dataclass(frozen=True, kw_only=True, config=SECTION)
class LedgerSpec:
    """``[ledger]``: a PostgreSQL ledger shared by several supervisors, each a node
    of one swarm (docs/scale-out.md). ``corral up --ledger URL --node ID`` and
    ``$CORRAL_LEDGER_URL`` win over it; the home remembers the choice. (Declared
    here, not in supervisor/ledger/ledger_spec.py, which every ``corral`` command imports.)"""

    url: StrictStr | None = Field(
        default=None, description="`postgresql://USER@HOST/DB`; unset: the home's SQLite file. Keep the password"
        " in `PGPASSWORD` or `~/.pgpass`, not here.")
    node: StrictStr | None = Field(
        default=None, description="This supervisor's node id: 1-48 lowercase letters, digits, `-` or `_`; unset:"
        " the host name and a hash of the home.")
    lease_s: StrictFloat = Field(
        default=DEFAULT_LEASE_S, ge=0.5, le=3600,
        description="A node that misses its heartbeat this long is taken over by another.")
    retire_idle_s: StrictFloat = Field(
        default=DEFAULT_RETIRE_IDLE_S, ge=0.5, le=86_400,
        description="An adopted partition with no unfinished run this long is let go.")
    shared_queue: StrictBool = Field(
        default=True, description="A root run submitted to this node that it has no room for waits in the"
        " cluster's shared queue, and this node takes queued runs while it has room; false: every submit runs"
        " here, and this node takes none.")
    max_runs: StrictInt = Field(
        default=DEFAULT_MAX_RUNS, ge=0, le=100_000,
        description="Root runs pending or running on this node at once before new ones wait in the shared queue.")
    max_runs_per_agent: StrictInt = Field(
        default=DEFAULT_MAX_RUNS_PER_AGENT, ge=0, le=100_000,
        description="Runs of one agent pending or running on this node at once (its lane and those behind it).")
    queue_poll_s: StrictFloat = Field(
        default=DEFAULT_POLL_S, ge=0.05, le=60,
        description="How often a node with room looks at the shared queue (also when one of its runs ends).")
    concurrent_requests: StrictBool = Field(
        default=False, description="Experimental: the node's requests wait for the database side by side, each"
        " transaction on its own connection (docs/scale-out.md). Off by default: requests then run one at a time,"
        " as the crash soaks checked them.")

    @field_validator("url")
    @classmethod
    def _postgres(cls, url: str | None) -> str | None:
        if url is not None and not is_postgres_url(url):
            raise problem(url_problem(url))
        return url

    @field_validator("node")
    @classmethod
    def _node(cls, node: str | None) -> str | None:
        if node is not None and not PARTITION_NAME.match(node):
            raise problem(node_problem(node))
        return node


@dataclass(frozen=True, kw_only=True, config=SECTION)
class SpecFile:
    """A swarm spec, as written (``corral up --spec swarm.toml``). Every table is optional."""

    name: Annotated[StrictStr, AfterValidator(_name)] = Field(
        default="swarm", description=f"The swarm's name: 1 to {MAX_NAME_CHARS} printable characters.")
    supervisor: SupervisorSettings = Field(default_factory=SupervisorSettings)
    groups: list[GroupTable] = Field(default_factory=list)
    actors: list[ActorTable] = Field(default_factory=list)
    agents: list[AgentTable] = Field(default_factory=list)
    templates: list[TemplateTable] = Field(default_factory=list)
    limits: SwarmLimits = Field(default_factory=SwarmLimits)
    reasoning_effort: ReasoningEffort = Field(
        default="default", description="The `reasoning_effort` of every agent and template that does not set its"
        " own (an `openai` provider's only; others keep `default`).")
    web_search: StrictBool = Field(
        default=False, description="Provider-native web search for every agent and template whose `web_search` is"
        " `inherit` (off by default; only an `openai` provider can search).")
    policy: dict[str, PolicyMode] = Field(
        default_factory=dict, description="`[policy]`: per-tool approval for every agent (`\"fs.*\" = \"confirm\"`);"
        " an agent's or template's own `policy` wins. Without a key for it, a tool that writes files, changes"
        " the project or runs a command (`fs.write`, `fs.patch`, `project.changeset`, `project.restore`,"
        " `command.*`) asks a person (`confirm`, as seed 004 asks); `default = \"auto\"` is the one switch for"
        " an unattended swarm, and it never lowers `project.git_commit`.")
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    project: ProjectTable = Field(default_factory=ProjectTable)
    chaos: ChaosTable = Field(default_factory=ChaosTable)
    mcp_servers: list[McpServerSpec] = Field(default_factory=list)
    models: list[LocalModelSpec] = Field(default_factory=list)
    tools: ToolsTable = Field(default_factory=ToolsTable)
    bridge: BridgeSpec | None = None
    ledger: LedgerSpec | None = None
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec)
