"""The MCP layer on the supervisor: server actors' catalogs, runs' pins, and calls.

Each ``[[mcp_servers]]`` entry is an ``mcp`` actor (see actors/mcp_actor.py),
supervised like any other. When it has initialized its session it reports the
server's tools (``mcp.ready``); this service turns them into catalog entries
(``mcp.<server>.<tool>``, effect, policy, fingerprint).

A call is an ordinary durable action. ``action.prepare`` validates the arguments
against the pinned input schema (invalid arguments fail the action before it is
executing: the server is never called); policy applies as for every tool; and
``mcp.call`` (from the agent, once ``executing`` is committed) relays the request
to the server's actor. When the outcome of an external call cannot be known (the
actor died mid-call, the call timed out), the action becomes
``needs-reconciliation`` right here: it is never sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from corral.actors.providers.plan_parse import wire_tool_name
from corral.actors.tools.validation import validation_error
from corral.core.redact import summarize
from corral.mailbox.errors import ChannelClosed, DeadlineExceeded, MailboxFull, RemoteError
from corral.mailbox.protocol import Ack, ActionPrepare, ClaimedRun, McpAnswer, McpCall, McpFailed, McpReady
from corral.supervisor.errors import BadRequest, NotFound, SupervisorError
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.mcp.mcp_catalog import (
    MAX_RUN_CATALOG_BYTES,
    MAX_RUN_TOOLS,
    CatalogRefused,
    CatalogTool,
    build_catalog,
    catalog_bytes,
    catalog_fingerprint,
    check_instructions,
    config_fingerprint,
    drift,
    pin,
    pinned,
    pinned_fingerprint,
)
from corral.supervisor.mcp.mcp_spec import McpServerSpec, split_tool_name
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_core import POLICY_STRICTNESS
from corral.supervisor.runs.run_feature import ClaimRefused, RunFeature
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.service_part import ServicePart
from corral.supervisor.tree.actor_state import ActorState
from corral.supervisor.tree.readiness import ReportedReadiness
from corral.supervisor.tree.supervision_tree import ActorSlot, SupervisionTree

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.mcp")

#: Lines of a failed server's stderr kept and shown (its actor bounds them too).
TAIL_LINES = 10
#: A run's first claim waits this long at most for servers still starting.
CLAIM_WAIT_S = 15.0
#: Above the call timeout: time for the actor to answer that it timed out.
RELAY_SLACK_S = 5.0


@dataclass
class ServerState(ReportedReadiness):
    spec: McpServerSpec
    tools: list[CatalogTool] | None = None
    fingerprint: str = ""
    instructions: str = ""
    server_info: dict[str, str] = field(default_factory=dict)
    error: str = ""
    #: Where the server's stderr goes, and its last lines when it last failed
    #: (redacted by its actor; kept in memory, shown with the error).
    log: str = ""
    stderr_tail: list[str] = field(default_factory=list)
    #: The catalog it reported was refused (CatalogRefused): the server offers nothing.
    refused: bool = False
    #: The actor incarnation that reported the catalog: a restart must report again.
    incarnation: int = -1
    readies: int = 0
    failures: int = 0
    calls: int = 0
    changed: trio.Event = field(default_factory=trio.Event)

    def failure(self) -> str:
        """The last error as a person reads it: the cause, the server's log file
        and the last lines of its stderr ('' while nothing failed)."""
        if not self.error:
            return ""
        lines = [self.error]
        if self.log:
            lines.append(f"  log: {self.log}")
        if self.stderr_tail:
            lines.append(f"  its stderr ended with ({len(self.stderr_tail)} lines):")
            lines += [f"    {line}" for line in self.stderr_tail]
        elif self.log:
            lines.append("  its stderr was empty")
        return "\n".join(lines)


class McpService:
    def __init__(
        self,
        ledger: Ledger,
        tree: SupervisionTree,
        runs: RunService,
        home: Path,
        servers: Iterable[McpServerSpec],
    ) -> None:
        self.ledger = ledger
        #: The server actors: their slots, and the relay of a call to one.
        self.tree = tree
        #: Owner checks, policy and the prepare of an MCP tool's action.
        self.runs = runs
        #: Where a call's sidecar (the full result) goes: ``transcripts/RUN/``.
        self.home = home
        self.servers: dict[str, ServerState] = {spec.id: ServerState(spec) for spec in servers}
        self._pin_cache: dict[str, dict[str, list[CatalogTool]]] = {}

    # -- server state ---------------------------------------------------------------

    def _slot(self, server: str) -> ActorSlot | None:
        state = self.servers.get(server)
        return None if state is None else self.tree.slots.get(state.spec.actor_id)

    def live_tools(self, server: str) -> list[CatalogTool] | None:
        """The catalog of a server whose current incarnation reported it, else None."""
        state = self.servers.get(server)
        return state.tools if state is not None and state.ready_in(self._slot(server)) else None

    def server_status(self, server: str) -> str:
        state = self.servers[server]
        slot = self._slot(server)
        if self.live_tools(server) is not None:
            return "ready"
        if state.refused and state.ready_in(slot):
            return "failed"
        if slot is None or slot.state in (ActorState.ESCALATED, ActorState.STOPPED):
            return "failed" if state.error else "stopped"
        return "starting" if not state.error else "restarting"

    async def ready(self, slot: ActorSlot, request: McpReady) -> Ack:
        state = self._own_server(slot, request.server)
        state.incarnation, state.stderr_tail = slot.incarnation, []
        server_info = {k: v[:200] for k, v in request.server_info.items()}
        try:
            check_instructions(request.instructions)
            tools = build_catalog(state.spec, request.tools)
        except CatalogRefused as exc:
            # Offered in no part: the server is failed until it reports a usable one.
            state.tools, state.fingerprint, state.refused = None, "", True
            state.error = summarize(f"its catalog is refused: {exc}", 500)
            state.failures += 1
            with self.ledger.tx(fsync=False):
                self.ledger.event("mcp-server-failed", state.spec.id, error=state.error, log=state.log)
            log.error("mcp server %s: %s", state.spec.id, state.error)
            state.notify()
            return Ack()
        fingerprint = catalog_fingerprint(tools, config=config_fingerprint(state.spec), server_info=server_info,
                                          instructions=request.instructions)
        changed = bool(state.fingerprint) and fingerprint != state.fingerprint
        state.tools, state.fingerprint, state.refused = tools, fingerprint, False
        state.instructions = request.instructions
        state.server_info = server_info
        state.error = ""
        state.readies += 1
        with self.ledger.tx(fsync=False):
            self.ledger.event(
                "mcp-server-ready",
                state.spec.id,
                fingerprint=fingerprint,
                tools=len(tools),
                changed=changed,
            )
        log.info("mcp server %s ready: %d tools, catalog %s", state.spec.id, len(tools), fingerprint[:12])
        state.notify()
        return Ack()

    async def failed(self, slot: ActorSlot, request: McpFailed) -> Ack:
        state = self._own_server(slot, request.server)
        state.error = summarize(request.error, 500)
        state.log = request.log[:4096]
        state.stderr_tail = [line[:2048] for line in request.stderr_tail[-TAIL_LINES:]]
        state.failures += 1
        with self.ledger.tx(fsync=False):
            # The stderr lines stay out of the ledger: the log file holds them.
            self.ledger.event("mcp-server-failed", state.spec.id, error=state.error, log=state.log)
        state.notify()
        return Ack()

    def _own_server(self, slot: ActorSlot, server: str) -> ServerState:
        state = self.servers.get(server)
        if state is None or state.spec.actor_id != slot.id:
            raise BadRequest(f"actor {slot.id} does not own MCP server {server!r}")
        return state

    async def _wait_ready(self, server: str, deadline: float, after: int = -1) -> list[CatalogTool] | None:
        """The live catalog once the server is ready (see ReportedReadiness.wait_ready)."""
        ready = await self.servers[server].wait_ready(lambda: self._slot(server), deadline, after)
        return self.live_tools(server) if ready else None

    # -- a run's catalog ---------------------------------------------------------------

    async def run_catalog(self, run_id: str) -> list[CatalogTool]:
        """Every MCP tool this run may see, pinning each server's catalog once.

        A server that is down, whose catalog was refused, or whose tools would take
        the run past its limits (MAX_RUN_TOOLS, MAX_RUN_CATALOG_BYTES) or give two
        tools one public name, is left out when it is optional, and stops the run
        before it plans (``RequiredServerDown``) when it is required (seed 004
        V1.22: "required server 初始化或列目录失败时阻止 planning，optional server 只从当前
        目录移除并在 MCP 状态中报告安全错误摘要")."""
        pins = dict(self._pins(run_id))
        deadline = trio.current_time() + CLAIM_WAIT_S
        out: list[CatalogTool] = []
        names: set[str] = set()
        size = 0
        for server in self.servers:
            state = self.servers[server]
            if server not in pins:
                live = await self._wait_ready(
                    server, max(deadline, trio.current_time() + state.spec.startup_timeout_s)
                    if state.spec.required else deadline)
                why = (state.error or self.server_status(server)) if live is None else _run_limits(live, names, size)
                if live is None or why is not None:
                    why = why or "not ready"
                    with self.ledger.tx(fsync=False):
                        self.ledger.event("mcp-server-unavailable", run_id, server=server, error=why,
                                          log=state.log, required=state.spec.required)
                    if state.spec.required:
                        raise RequiredServerDown(
                            f"the required MCP server {server!r} is not usable: {summarize(why, 300)}")
                    continue
                pins[server] = pin(self.ledger, run_id, server, live, state.fingerprint)
                self._pin_cache[run_id] = pins
            out.extend(pins[server])
            names.update(_public_names(pins[server]))
            size += catalog_bytes(pins[server])
        return out

    async def add_catalog(self, run: ClaimedRun) -> None:
        """A run an agent just claimed: the MCP tools (pinned) and instructions it gets."""
        if self.servers:
            tools = await self.run_catalog(run.run_id)
            run.mcp_tools = [tool.as_dict() for tool in tools]
            run.mcp_instructions = {
                server: state.instructions for server, state in self.servers.items() if state.instructions
            }

    def _pins(self, run_id: str) -> dict[str, list[CatalogTool]]:
        """A run's pins; cached, since a pin never changes once written."""
        pins = self._pin_cache.get(run_id)
        if pins is None:
            pins = pinned(self.ledger, run_id)
            if len(self._pin_cache) >= 256:
                self._pin_cache.pop(next(iter(self._pin_cache)))
            self._pin_cache[run_id] = pins
        return pins

    def _pinned_tool(self, run_id: str, full_name: str) -> CatalogTool:
        parts = split_tool_name(full_name, self.servers)
        if parts is None or parts[0] not in self.servers:
            raise NotFound(f"no MCP server for tool {full_name!r}")
        for tool in self._pins(run_id).get(parts[0], []):
            if tool.name == parts[1]:
                return tool
        raise NotFound(f"{full_name} is not in this run's MCP catalog")

    def prepare(self, slot: ActorSlot, request: ActionPrepare) -> Any:
        """A prepare route (RunService.prepare_call): an MCP tool's action, checked
        against the run's pinned catalog; None for any other tool."""
        if split_tool_name(request.tool, self.servers) is None:
            return None
        return self._prepare(slot, request, request.tool)

    def _prepare(self, slot: ActorSlot, request: ActionPrepare, name: str) -> Any:
        run_service = self.runs
        run = run_service.run_of(slot, request.run_id)
        tool_input = request.input
        loop, index = request.loop, request.index
        problem: str | None = None
        try:
            tool = self._pinned_tool(run["run_id"], name)
        except NotFound as exc:
            tool, problem = None, str(exc)
        policy = run_service.policy_for(run, name) if tool is not None else "deny"
        if tool is not None:
            # The server's approval rule and the agent's policy: the stricter wins.
            policy = max(policy, tool.policy, key=POLICY_STRICTNESS.index)
        if tool is not None and problem is None:
            problem = validation_error(name, tool.input_schema, tool_input)
        return run_service.prepare_checked(
            run,
            loop,
            index,
            name,
            tool_input,
            rerunnable=tool is not None and tool.effect in ("read", "idempotent"),
            policy=policy,
            problem=problem,
        )

    # -- calls -------------------------------------------------------------------------

    async def call(self, slot: ActorSlot, request: McpCall) -> McpAnswer:
        """From the agent, after ``executing`` is committed: relay one tools/call;
        the answer (the server actor's, or the relay's own failure) checked into
        its reply record here, once."""
        action = action_store.get_action(self.ledger, request.action_id)
        self.runs.run_of(slot, action["run_id"])
        if action["phase"] != ActionPhase.EXECUTING:
            raise SupervisorError(f"action {request.action_id} is {action['phase']}, not executing", code="conflict")
        return msgspec.convert(await self.relay(action, request.arguments), McpAnswer)

    async def relay(self, action: Any, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = self._pinned_tool(action["run_id"], action["tool"])
        state = self.servers[tool.server]
        rerunnable = tool.effect in ("read", "idempotent")
        attempts = 2 if rerunnable else 1
        failed_incarnation = -1
        for attempt in range(attempts):
            live = await self._wait_ready(
                tool.server, trio.current_time() + state.spec.startup_timeout_s, after=failed_incarnation
            )
            why = drift(tool, live, pinned_fingerprint(self.ledger, action["run_id"], tool.server), state.fingerprint)
            if why is not None and live is None and state.error:
                why = f"{why}: {state.failure()}"
            if why is not None:
                # Nothing was sent: a clean failure, whatever the effect.
                return {"ok": False, "code": "mcp-unavailable" if live is None else "mcp-catalog-changed", "error": why}
            state.calls += 1
            incarnation = state.incarnation
            try:
                answer = await self.tree.request(
                    state.spec.actor_id,
                    {
                        "op": "call",
                        "action_id": action["action_id"],
                        "tool": tool.name,
                        "arguments": arguments,
                        "timeout_s": state.spec.call_timeout_s,
                        "idempotency_key": action["action_id"] if tool.effect == "idempotent" else "",
                        "sidecar": str(
                            self.home / "transcripts" / action["run_id"] / f"{action['action_id']}.mcp.json"
                        ),
                    },
                    state.spec.call_timeout_s + RELAY_SLACK_S,
                )
            except RemoteError as exc:
                if exc.code in ("mcp-error", "mcp-busy", "result-too-large", "bad-request"):
                    return {"ok": False, "code": exc.code, "error": exc.message}
                unknown = f"{exc.code}: {exc.message}"
            except (ChannelClosed, DeadlineExceeded, MailboxFull, KeyError) as exc:
                unknown = f"the MCP server's actor went away mid-call ({type(exc).__name__})"
            else:
                return answer
            if not rerunnable:
                return self._unknown_outcome(action, tool, unknown)
            failed_incarnation = incarnation
            log.warning("mcp %s: attempt %d of a %s tool failed: %s", tool.full_name, attempt + 1, tool.effect, unknown)
        return {"ok": False, "code": "mcp-failed", "error": unknown}

    def _unknown_outcome(self, action: Any, tool: CatalogTool, why: str) -> dict[str, Any]:
        """An external call whose outcome cannot be proven is never sent again."""
        reason = f"{tool.full_name}: {summarize(why, 200)}; the outcome is unknown"
        with self.ledger.tx():
            action_store.move_action(self.ledger, action["action_id"], ActionPhase.NEEDS_RECONCILIATION, reason=reason)
            run_store.set_run_status(
                self.ledger, action["run_id"], RunStatus.NEEDS_RECONCILIATION, self.runs.features, reason
            )
        return {"ok": False, "code": "outcome-unknown", "error": reason}

    # -- control ------------------------------------------------------------------------

    async def list_servers(self, params: dict[str, Any]) -> dict[str, Any]:
        servers = []
        for server_id, state in self.servers.items():
            slot = self._slot(server_id)
            servers.append(
                {
                    "id": server_id,
                    "transport": "http" if state.spec.url else "stdio",
                    "status": self.server_status(server_id),
                    "actor": state.spec.actor_id,
                    "restarts": slot.restarts if slot is not None else 0,
                    "fingerprint": state.fingerprint,
                    "server_info": state.server_info,
                    "error": state.failure(),
                    "log": state.log,
                    "stderr_tail": state.stderr_tail,
                    "calls": state.calls,
                    "required": state.spec.required,
                    "tools": [tool.as_dict() for tool in state.tools or []],
                }
            )
        return {"servers": servers}

    def status_section(self) -> list[dict[str, Any]]:
        return [
            {
                "id": server_id,
                "status": self.server_status(server_id),
                "required": state.spec.required,
                "tools": len(state.tools or []),
                "fingerprint": state.fingerprint[:16],
                "error": state.failure(),
                "log": state.log,
            }
            for server_id, state in self.servers.items()
        ]

    def show_section(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.ledger.all("SELECT server, fingerprint, pinned_at FROM mcp_pins WHERE run_id = ?", run_id)
        return [dict(row) for row in rows]

    async def debug_call(self, params: dict[str, Any]) -> dict[str, Any]:
        """``corral mcp call``: one call as a run of its own, through policy and the ledger."""
        server, tool_name = params.get("server"), params.get("tool")
        arguments = params.get("arguments", {})
        if not isinstance(server, str) or server not in self.servers:
            raise NotFound(f"no MCP server {server!r}; try: {', '.join(sorted(self.servers)) or 'none is declared'}")
        if not isinstance(tool_name, str) or not isinstance(arguments, dict):
            raise BadRequest("tool must be a string and arguments a map")
        approve = params.get("approve") is True
        live = await self._wait_ready(server, trio.current_time() + self.servers[server].spec.startup_timeout_s)
        if live is None:
            raise SupervisorError(
                f"MCP server {server!r} is not ready: {self.servers[server].failure() or 'still starting'}",
                code="unavailable")
        full = f"mcp.{server}.{tool_name}"
        tool = next((item for item in live if item.name == tool_name), None)
        if tool is None:
            raise NotFound(f"{full} is not offered (or not allowed); try: corral mcp list")
        problem = validation_error(full, tool.input_schema, arguments)
        if problem is not None:
            raise BadRequest(problem)
        if tool.policy == "deny":
            raise SupervisorError(f"{full} is denied by the spec's approval rule", code="refused")
        if tool.policy == "confirm" and not approve:
            raise SupervisorError(
                f"{full} needs approval (effect {tool.effect}); repeat with --approve to approve it yourself",
                code="needs-approval",
            )
        run_id = run_store.create_run(
            self.ledger,
            self.runs.features,
            agent_id="cli",
            task=f"corral mcp call {full}",
            provider="none",
            provider_config={},
            kind="cli",
        )
        run_store.set_run_status(self.ledger, run_id, RunStatus.RUNNING, self.runs.features)
        pin(self.ledger, run_id, server, live, self.servers[server].fingerprint)
        row = action_store.prepare_action(
            self.ledger,
            run_id,
            0,
            0,
            full,
            arguments,
            self.runs.features,
            rerunnable=tool.effect != "external",
            policy="auto",
            raw_sha256=self.runs.keep_raw_input(run_id, 0, 0, arguments),
        )
        note = "approved at the CLI (--approve)" if tool.policy == "confirm" else ""
        action_store.move_action(self.ledger, row["action_id"], ActionPhase.EXECUTING, reason=note)
        action = action_store.get_action(self.ledger, row["action_id"])
        answer = await self.relay(action, arguments)
        if answer.get("code") != "outcome-unknown":
            ok = bool(answer.get("ok")) and not answer.get("result", {}).get("is_error")
            summary = f"{full}: {'ok' if ok else 'failed'}"
            action_store.finish_action(
                self.ledger, row["action_id"], ok, answer, summary, None if ok else summary, self.runs.features
            )
            run_store.set_run_status(
                self.ledger, run_id, RunStatus.COMPLETED if ok else RunStatus.FAILED, self.runs.features, summary
            )
        return {"run_id": run_id, "action_id": row["action_id"], **answer}


class RequiredServerDown(ClaimRefused):
    """A required server that a run cannot have: the run does not plan."""


def _public_names(tools: list[CatalogTool]) -> set[str]:
    """The names a tool is known by: its full name and the one a provider sees."""
    return {name for tool in tools for name in (tool.full_name, wire_tool_name(tool.full_name))}


def _run_limits(live: list[CatalogTool], names: set[str], size: int) -> str | None:
    """Why a server's catalog cannot join what the run already has, or None."""
    clash = sorted(_public_names(live) & names)
    if clash:
        return f"its tool {clash[0]!r} has the public name of another server's tool; its catalog is refused"
    if len({tool.name for tool in live}) + len({n for n in names if n.startswith("mcp.")}) > MAX_RUN_TOOLS:
        return f"its tools would take the run past {MAX_RUN_TOOLS} MCP tools; its catalog is refused"
    if size + catalog_bytes(live) > MAX_RUN_CATALOG_BYTES:
        return f"its catalog would take the run past {MAX_RUN_CATALOG_BYTES} bytes of MCP tools; refused"
    return None


class McpPins(RunFeature):
    """What an MCP tool's action shows a person (its effect class, from the run's
    pinned catalog), whether or not this spec starts MCP servers: an older run's
    actions keep theirs."""

    def tool_effect(self, ledger: Ledger, run_id: str, tool: str) -> str | None:
        if not tool.startswith("mcp."):
            return None
        for tools in pinned(ledger, run_id).values():
            for pinned_tool in tools:
                if pinned_tool.full_name == tool:
                    return str(pinned_tool.effect)
        return None


class McpFeature(McpPins):
    """MCP servers' part in runs: a claimed run gets its catalog, an MCP tool is
    prepared through its server, ``show`` lists the servers' calls."""

    def __init__(self, service: McpService) -> None:
        self.service = service

    async def on_claim(self, claimed: ClaimedRun) -> None:
        await self.service.add_catalog(claimed)

    def prepare_route(self, slot: ActorSlot, request: ActionPrepare) -> Any:
        return self.service.prepare(slot, request)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"mcp": self.service.show_section(run_id)}


def run_feature(service: McpService) -> McpPins:
    """The MCP feature of a supervisor: its servers' part when the spec has any."""
    return McpFeature(service) if service.servers else McpPins()


class McpPart(ServicePart):
    """MCP servers' section of ``corral status``."""

    status_name = "mcp"

    def __init__(self, service: McpService) -> None:
        self.service = service

    def status(self) -> Any:
        return self.service.status_section()


def service_part(service: McpService) -> McpPart | None:
    return McpPart(service) if service.servers else None


def install(sup: Supervisor) -> McpService:
    service = McpService(sup.ledger, sup.tree, sup.runs, sup.home, sup.spec.mcp_servers)
    sup.control_methods["mcp.list"] = service.list_servers
    if not service.servers:
        return service
    sup.methods.mcp = service
    sup.control_methods["mcp.call"] = service.debug_call
    return service
