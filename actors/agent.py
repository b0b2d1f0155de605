"""The agent template: one lane, runs one run at a time, asks the ledger what's next.

The agent holds no state a crash could lose. For every step it asks the supervisor
(``run.next_step``, derived from committed rows), does that one thing, and reports
it back; a side effect only starts after ``action.begin`` answered ``execute``,
which the supervisor sends only once ``executing`` is on disk.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import logging
import os
from pathlib import Path
from typing import Any

import trio

from corral.actors import project_context
from corral.actors.providers.base import (
    MAX_RESPONSE_CHARS,
    ErrorKind,
    PlanError,
    Provider,
    ProviderError,
    ProviderRequest,
    ProviderResponse,
    ToolSchema,
    history_digest,
)
from corral.actors.providers.registry import make_provider
from corral.actors.runtime import ActorContext, is_shutdown
from corral.actors.tools.base import ActionParked, Tool, ToolContext, ToolError, validate_input
from corral.actors.tools.mcp import mcp_tools
from corral.actors.tools.registry import all_tools
from corral.core import failpoints
from corral.core.redact import summarize
from corral.mailbox.envelope import Kind
from corral.mailbox.errors import RemoteError

log = logging.getLogger("corral.agent")

#: What a model is asked when its older turns are folded into a summary.
SUMMARY_TASK = (
    "Summarise the conversation so far for yourself, to continue the same task: what was done, what was"
    " found (names, numbers, paths), what is still open. Reply with the summary as your final reply."
)

#: The supervisor's answer while its disk is full; the agent waits and asks again.
STORAGE_FULL = "disk-full"
STORAGE_RETRY_S = 1.0


def _unsafe_effect_order() -> bool:
    return os.environ.get("CORRAL_TEST_UNSAFE_EFFECT_ORDER") == "1"


async def run(ctx: ActorContext) -> int:
    wake = trio.Event()
    woken = [wake]

    async def listen() -> None:
        async for envelope in ctx.channel.inbox:
            if is_shutdown(envelope):
                ctx.shutdown.set()
                return
            if envelope.kind is Kind.TELL and envelope.body.get("op") == "wake":
                woken[0].set()
            elif envelope.kind is Kind.REQUEST:
                await ctx.channel.reply(envelope, {"agent": ctx.actor_id, "ok": True})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen)
        while not ctx.shutdown.is_set():
            woken[0] = trio.Event()
            try:
                answer = await ctx.call("run.claim")
            except RemoteError as exc:
                if exc.code != STORAGE_FULL:
                    raise
                await trio.sleep(STORAGE_RETRY_S)
                continue
            claimed = answer["run"]
            if claimed is None:
                if ctx.params.get("exit_when_idle") and not answer.get("parked"):
                    break  # an isolated child ends with its run
                await woken[0].wait()
                continue
            await Lane(ctx, claimed).drive()
        nursery.cancel_scope.cancel()
    return 0


def with_known_ids(schema: ToolSchema, known: dict[str, list[str]]) -> ToolSchema:
    """``schema`` with the string fields that name a spec id turned into enums
    (``"agent.delegate/agent_id"``: the specialists). Only what is offered changes:
    the supervisor validates against the tool's own schema."""
    mine = {where.partition("/")[2]: ids for where, ids in known.items() if where.startswith(schema.name + "/") and ids}
    if not mine:
        return schema  # most tools name no spec id: nothing to copy
    changed = copy.deepcopy(schema.input_schema)
    for path, ids in mine.items():
        node: Any = changed
        for part in path.split("/"):
            node = node.get("properties", {}).get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get("type") == "array":
                node = node.get("items")
        if isinstance(node, dict) and node.get("type") == "string":
            node["enum"] = list(ids)
    return schema if changed == schema.input_schema else dataclasses.replace(schema, input_schema=changed)


class Lane:
    """Drives one run until it ends or parks (which releases the lane)."""

    def __init__(self, ctx: ActorContext, run: dict[str, Any]) -> None:
        self.ctx = ctx
        self.run = run
        self.run_id: str = run["run_id"]
        self.tools: dict[str, Tool] = all_tools()
        self.tools.update(mcp_tools(run.get("mcp_tools")))
        globs = run.get("tool_globs")
        if globs is not None:
            # Only the agent's allow list is offered; the supervisor refuses the rest.
            self.tools = {
                name: tool for name, tool in self.tools.items() if any(fnmatch.fnmatchcase(name, g) for g in globs)
            }
        # Every remaining tool stays parseable, so a call outside the run's tool set
        # (a child spawning, say) gets a recorded, explained denial; but the model is
        # only offered what the run may use.
        self.schemas: tuple[ToolSchema, ...] = tuple(tool.schema for tool in self.tools.values())
        allowed = run.get("allowed_tools")
        self.offered = tuple(
            with_known_ids(schema, run.get("known_ids") or {})
            for schema in self.schemas
            if allowed is None or schema.name in allowed
        )
        self.provider: Provider | None = None
        #: The repository's instructions, references and skills (read from inside the
        #: workspace only, at the lane's first provider turn: a lane that only runs
        #: actions never walks the tree).
        self.project: str | None = None
        #: The next step, when the last step's reply carried it (no extra round trip).
        self.next: dict[str, Any] | None = None
        #: The run's observations as far as provider steps sent them: each turn
        #: brings only the new ones (``history_from`` says where they start).
        self.history: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.ctx.call(method, run_id=self.run_id, **params)

    async def step_call(self, method: str, **params: Any) -> dict[str, Any]:
        """A step whose reply also carries the next step (see supervisor/step_piggyback.py)."""
        if _unsafe_effect_order():
            return await self.call(method, **params)  # the broken build keeps its own order
        answer = await self.call(method, want_next=True, history_have=len(self.history), **params)
        self.next = answer.get("next")
        return answer

    def project_context(self) -> str:
        if self.project is None:
            self.project = project_context.load(Path(self.run.get("workspace") or ".")).prompt()
        return self.project

    def get_provider(self) -> Provider:
        if self.provider is None:
            self.provider = make_provider(self.run["provider"], self.run["provider_config"])
        return self.provider

    async def drive(self) -> None:
        while True:
            do = "next_step"
            try:
                step, self.next = self.next, None
                if step is None:
                    step = await self.call("run.next_step", history_have=len(self.history))
                do = step["do"]
                if do in ("done", "park"):
                    return
                await getattr(self, "step_" + do)(step)
            except RemoteError as exc:
                if exc.code == STORAGE_FULL:
                    # Nothing was committed and the step was not taken: wait for the
                    # disk (the supervisor stays up, read-only) and ask again.
                    log.warning("%s: %s postponed: %s", self.run_id, do, exc.message)
                    await trio.sleep(STORAGE_RETRY_S)
                    continue
                # The supervisor refused a step (a fail-closed replay, say): the ledger
                # now says what happens next; ask again unless the run is gone.
                log.warning("%s: %s refused: %s", self.run_id, do, exc)
                if exc.code not in ("conflict", "refused"):
                    raise

    async def step_provider(self, step: dict[str, Any]) -> None:
        loop = int(step["loop"])
        try:
            provider = self.get_provider()
        except Exception as exc:
            await self.call("run.fail", reason=f"provider cannot start: {exc}")
            return
        begun = step.get("begun") or await self.call("provider.begin", loop=loop)
        request = ProviderRequest(
            run_id=self.run_id,
            agent_id=self.ctx.actor_id,
            task=step["task"],
            loop_index=loop,
            history=self.provider_history(step),
            tools=self.offered,
            slot=begun["slot"],
            tool_notes=tuple(sorted((self.run.get("mcp_instructions") or {}).items())),
            project_context=self.project_context(),
        )
        try:
            response = await provider.complete(request)
        except ProviderError as exc:
            await self.call("provider.failed", slot=begun["slot"], kind=exc.kind.value, error=str(exc))
            return
        except Exception as exc:  # a provider bug is a failed lifecycle, never a hang
            await self.call(
                "provider.failed",
                slot=begun["slot"],
                kind=ErrorKind.FATAL.value,
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        failpoints.hit("provider.before-handoff")
        # The plan travels with the response it was parsed from (one round trip);
        # the supervisor commits the response first, then the plan.
        carried = {} if _unsafe_effect_order() else self.parsed(provider, response.text[:MAX_RESPONSE_CHARS])
        await self.step_call("provider.handoff", slot=begun["slot"], text=response.text, **carried)
        failpoints.hit("provider.after-handoff")

    def provider_history(self, step: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """What the model sees: a shaped view (compaction) as sent, else the run's
        observations, of which the step carries only those past ``history_from``."""
        if "history_from" not in step:
            return tuple(step["history"])
        start = int(step["history_from"])
        if start != len(self.history):
            # Cannot happen while the supervisor answers what this lane asked; refuse
            # to show the model a history with a hole in it.
            raise RuntimeError(f"history starts at {start}, this lane holds {len(self.history)}")
        self.history.extend(step["history"])
        return tuple(self.history)

    def parsed(self, provider: Provider, text: str) -> dict[str, Any]:
        """``{"plan": ...}`` or ``{"plan_invalid": {category, detail}}``."""
        try:
            plan = provider.parse(ProviderResponse(text), self.schemas)
        except PlanError as exc:
            return {"plan_invalid": {"category": exc.category.value, "detail": exc.detail}}
        return {
            "plan": {
                "actions": [{"tool": call.tool, "input": call.input} for call in plan.actions],
                "final": plan.final_reply,
            }
        }

    async def step_compact(self, step: dict[str, Any]) -> None:
        """The run's older turns passed the agent's token limit: a summary of them
        (supervisor/compaction.py), recorded once per covered range. Writing it has
        no side effect, so a kill here only means asking again."""
        summary = await self.summarize(step)
        failpoints.hit("context.mid-compaction")
        await self.step_call("context.compacted", to_seq=step["to_seq"], summary=summary)

    async def summarize(self, step: dict[str, Any]) -> str:
        """The model writes it: through its provider's ``summarize`` when it has one,
        else an ordinary request whose final reply is the summary. The runtime's
        own digest stands in only when the model gives none."""
        entries = tuple(step["entries"])
        provider = self.get_provider()
        own = getattr(provider, "summarize", None)
        try:
            if own is not None:
                text = str(await own(entries))
            else:
                request = ProviderRequest(
                    run_id=self.run_id, agent_id=self.ctx.actor_id, task=SUMMARY_TASK, loop_index=int(step["loop"]),
                    history=entries, tools=(), slot=f"{self.run_id}:compact:{step['to_seq']}", tool_notes=(),
                )
                text = provider.parse(await provider.complete(request), ()).final_reply or ""
        except (ProviderError, PlanError) as exc:
            log.warning("%s: the model wrote no summary (%s); the runtime's digest stands in", self.run_id, exc)
            text = ""
        return (text.strip() or history_digest(list(entries)))[:8000]

    async def step_parse(self, step: dict[str, Any]) -> None:
        """A response handed off without its plan (or before a crash): parse it now."""
        loop = int(step["loop"])
        carried = self.parsed(self.get_provider(), step["response"] or "")
        if "plan" in carried:
            await self.step_call("plan.commit", loop=loop, slot=step["slot"], plan=carried["plan"])
        else:
            await self.step_call("plan.invalid", loop=loop, slot=step["slot"], **carried["plan_invalid"])

    async def step_prepare(self, step: dict[str, Any]) -> None:
        await self.step_call(
            "action.prepare", loop=step["loop"], index=step["index"], tool=step["tool"], input=step["input"]
        )

    async def step_execute(self, step: dict[str, Any]) -> None:
        action_id = step["action_id"]
        if _unsafe_effect_order():
            await self._execute_unsafely(step)
            return
        if not step.get("begun"):  # else ``executing`` was committed with the last reply
            begun = await self.step_call("action.begin", action_id=action_id)
            if begun["do"] != "execute":
                return
            self.next = None
        batch = [{"action_id": action_id, "tool": step["tool"], "input": step["input"]}, *step.get("batch", ())]
        if step.get("parallel"):
            await self.execute_parallel(batch)
            return
        results = []
        for action in batch:  # a read batch runs in plan order; see supervisor/step_piggyback.py
            failpoints.hit("agent.before-effect")
            try:
                ok, output, summary, error = await self.execute(action["action_id"], action["tool"], action["input"])
            except ActionParked:
                return  # the supervisor finishes this action (an answer); the run is parked
            failpoints.hit("agent.after-effect")
            results.append(
                {"action_id": action["action_id"], "ok": ok, "output": output, "summary": summary, "error": error}
            )
        if len(results) == 1:
            await self.step_call("action.finish", **results[0])
        else:
            await self.step_call("action.finish_batch", results=results)

    async def execute_parallel(self, batch: list[dict[str, Any]]) -> None:
        """A batch of allow-listed reads, run at once; each result is committed as
        soon as its read ends (the next step is asked for afterwards)."""

        async def one(action: dict[str, Any]) -> None:
            failpoints.hit("agent.before-effect")
            ok, output, summary, error = await self.execute(action["action_id"], action["tool"], action["input"])
            failpoints.hit("agent.after-effect")
            await self.call("action.finish", action_id=action["action_id"], ok=ok, output=output, summary=summary,
                            error=error)

        async with trio.open_nursery() as nursery:
            for action in batch:
                nursery.start_soon(one, action)

    async def _execute_unsafely(self, step: dict[str, Any]) -> None:
        """The deliberately broken build: side effect first, ``executing`` after.
        Exists so that chaos can prove its checker fails; never enabled otherwise."""
        action_id = step["action_id"]
        ok, output, summary, error = await self.execute(action_id, step["tool"], step["input"])
        begun = await self.ctx.call("action.begin", action_id=action_id)
        if begun["do"] == "execute":
            await self.ctx.call(
                "action.finish", action_id=action_id, ok=ok, output=output, summary=summary, error=error
            )

    async def execute(
        self, action_id: str, tool_name: str, tool_input: dict[str, Any]
    ) -> tuple[bool, dict[str, Any], str, str | None]:
        tool = self.tools.get(tool_name)
        if tool is None:
            return False, {}, f"{tool_name} is not available here", f"tool {tool_name!r} is not available"
        context = ToolContext(
            agent_id=self.ctx.actor_id,
            run_id=self.run_id,
            action_id=action_id,
            workspace=Path(self.run.get("workspace") or "."),
            write_scopes=tuple(self.run.get("write_scopes", [])),
            home=Path(self.run["home"]),
            call=self.ctx.call,
            is_child=self.run.get("kind") == "child",
            effects_file=Path(self.run["effects_file"]) if self.run.get("effects_file") else None,
            idempotency_key=action_id,
        )
        try:
            validate_input(tool.schema, tool_input)
            result = await tool.run(context, tool_input)
        except ToolError as exc:
            return (
                False,
                {"error": str(exc), "code": exc.code},
                f"refused: {summarize(str(exc), 120)}",
                str(exc),
            )
        except RemoteError as exc:
            return (
                False,
                {"error": exc.message, "code": exc.code},
                f"refused: {summarize(exc.message, 120)}",
                exc.message,
            )
        except OSError as exc:
            return False, {"error": exc.strerror or str(exc)}, f"failed: {exc.strerror}", str(exc.strerror)
        return result.ok, result.output, result.summary, None if result.ok else result.summary

    async def step_finalize(self, step: dict[str, Any]) -> None:
        if self.run.get("kind") != "root":
            await self.call("run.child_result", reply=step["reply"])
            return
        await self.call("run.finalize", reply=step["reply"])
