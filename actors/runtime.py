"""The actor process main: connect to the supervisor, say hello, run a template."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from corral.actors.tools.deps import EXIT_DEPS, DepsFailed, open_deps, record_failure
from corral.actors.tools.deps import PARAM as DEPS_PARAM
from corral.core import failpoints
from corral.core.errors import UserCodeError
from corral.mailbox import protocol
from corral.mailbox.actor_config import ActorConfig
from corral.mailbox.channel import Channel, open_channel
from corral.mailbox.envelope import HEARTBEAT, Envelope, Kind
from corral.mailbox.errors import ChannelClosed, MailboxFull, RemoteError
from corral.mailbox.protocol import Code, R, Request
from corral.mailbox.transport import transport_of

if TYPE_CHECKING:
    from corral.actors.tools.base import Tool

log = logging.getLogger("corral.actor")

SUPERVISOR = "supervisor"

#: Exit codes of an actor whose template could not run (see docs/extending.md).
EXIT_UNKNOWN_TEMPLATE = 2
EXIT_TEMPLATE_IMPORT = 3
EXIT_TEMPLATE_START = 4

#: The supervisor's answer while its ledger is away: nothing was committed, so
#: the request may be sent again (``ActorContext.ask``).
LEDGER_UNAVAILABLE = Code.LEDGER_UNAVAILABLE
#: How often an actor asks again while the ledger is away: doubling to the cap.
LEDGER_RETRY_FIRST_S = 0.2
LEDGER_RETRY_CAP_S = 2.0

#: Once asked to stop, a template gets this long to finish its current step before
#: it is cancelled; the supervisor's shutdown timeout stays the hard bound.
DRAIN_S = 0.5


@dataclass
class ActorContext:
    """What an actor process knows: its id and incarnation (1, 2, ... per restart),
    its spec ``params``, its channel to the supervisor, its boot ``config``
    (mailbox/actor_config.py), and ``shutdown`` (set when it is asked to stop)."""

    actor_id: str
    incarnation: int
    template: str
    channel: Channel
    config: ActorConfig
    #: Set when the supervisor asks this actor to stop (graceful shutdown).
    shutdown: trio.Event
    #: The user's ``@corral.tool`` functions, by name: the catalog built from the
    #: spec's tool modules when this process started (``user_code.tool_catalog``).
    user_tools: Mapping[str, Tool] = field(default_factory=dict)
    #: What the agent's ``deps`` factory made at start (``ctx.deps`` of its tools;
    #: actors/tools/deps.py), or None.
    deps: Any = None

    @property
    def params(self) -> dict[str, Any]:
        return self.config["params"]

    async def ask(self, request: Request[R], timeout: float = 30.0) -> R:
        """The one way to ask the supervisor: a typed request (mailbox/protocol/),
        its fields checked by the type checker here and by the supervisor's decoder
        there; raises RemoteError/DeadlineExceeded.

        While the supervisor's ledger is away (a PostgreSQL server restarting or
        refusing connections), it holds a request for a while and then answers
        ``ledger-unavailable``: nothing was committed. The request is sent again,
        with backoff, for as long as the ledger stays away: an outage must not
        crash the agent, lose the outcome it holds, or exhaust its group's
        restarts. What bounds the wait is the run's own deadlines, which the
        supervisor applies once its ledger is back (a child past
        ``child_timeout_s`` fails, and the request is then refused), and a stop
        (the runtime ends the template at shutdown). ``timeout`` is per attempt."""
        answer = await self._send(request.METHOD, protocol.encode(request), timeout)
        return protocol.reply(request, answer)  # checked as it arrives: ``BadReply`` when malformed

    async def _send(self, method: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        delay = LEDGER_RETRY_FIRST_S
        waited_since: float | None = None
        while True:
            try:
                answer = await self.channel.request(SUPERVISOR, body, timeout)
            except RemoteError as exc:
                if exc.code != LEDGER_UNAVAILABLE or self.shutdown.is_set():
                    raise
                if waited_since is None:
                    waited_since = trio.current_time()
                    log.warning("%s: the ledger is away (%s: %s); waiting for it", method, exc.code, exc.message)
                await trio.sleep(delay)
                delay = min(LEDGER_RETRY_CAP_S, delay * 2)
                continue
            if waited_since is not None:
                log.warning("%s: the ledger is back after %.1f s", method, trio.current_time() - waited_since)
            return answer


Template = Callable[[ActorContext], Awaitable[int]]

#: The context of the actor this process runs, for code that is handed no context:
#: a provider asking a model actor (``local``) goes through the supervisor with it.
_current: contextvars.ContextVar[ActorContext] = contextvars.ContextVar("corral_actor")


def current_actor() -> ActorContext:
    """This process's actor; LookupError outside an actor."""
    return _current.get()


# Each built-in template is imported when it is first looked up, not at the top:
# each template module imports this one, and the fork server preloads only the
# templates its spec starts (``preload``).
def _echo() -> Template:
    from corral.actors import echo

    return echo.run


def _agent() -> Template:
    from corral.actors import agent

    return agent.run


def _session() -> Template:
    from corral.actors import session

    return session.run


def _model() -> Template:
    from corral.actors import model_actor

    return model_actor.run


def _bridge_worker() -> Template:
    from corral.actors import bridge_worker

    return bridge_worker.run


def _mcp() -> Template:
    from corral.actors import mcp_actor

    return mcp_actor.run


BUILTIN_TEMPLATES: Mapping[str, Callable[[], Template]] = {
    "echo": _echo,
    "agent": _agent,
    "session": _session,
    "model": _model,
    "bridge_worker": _bridge_worker,
    "mcp": _mcp,
}

#: What the supervisor tells the fork server its spec starts, as JSON
#: ``{"templates": [...], "providers": [...]}`` (names only, nothing secret): the
#: fork server imports those before forking and leaves the rest to the rare actor
#: that needs it. Unset: everything (a fork server nobody told).
PRELOAD_ENV = "CORRAL_PRELOAD"


def preload_plan(templates: Iterable[str], providers: Iterable[str]) -> str:
    """The value of ``PRELOAD_ENV`` for a spec that starts ``templates`` and plans
    with ``providers``."""
    return json.dumps({"templates": sorted(set(templates)), "providers": sorted(set(providers))})


def lookup_template(name: str) -> Template:
    """A built-in template by name, else a user ``module:Name`` reference (one
    lookup for both). Raises KeyError for an unknown name, UserCodeError or
    TypeError for a reference that does not resolve to a template."""
    builtin = BUILTIN_TEMPLATES.get(name)
    if builtin is not None:
        return builtin()
    from corral.actors import user_actor, user_code

    if not user_code.is_reference(name):
        raise KeyError(name)
    return user_actor.as_template(name, user_code.load(name))


#: Enough runs for CPython's adaptive interpreter to specialize the hot paths.
WARM_RUNS = 10


def preload() -> None:
    """Import everything an actor may need, once, in the fork server.

    Imports done here are shared by every forked actor instead of repeated in each:
    templates, tools and providers cost ~75 ms per child otherwise (measured), which
    was most of a restart. Nothing imported here may start a thread (fork safety).
    Only what the spec starts (``PRELOAD_ENV``): the templates it names, and the
    openai provider's client if an agent plans with it (together a third of this
    process's start-up CPU when imported for nothing, measured)."""
    plan = json.loads(os.environ.get(PRELOAD_ENV) or "null")
    templates = set(BUILTIN_TEMPLATES) if plan is None else set(plan["templates"]) & set(BUILTIN_TEMPLATES)
    for name in sorted(templates):
        BUILTIN_TEMPLATES[name]()
    from corral.actors.user_code import import_tool_modules_from_env

    # The user's @corral.tool modules, as the spec names them, imported once here
    # (each child finds the tools in them again: a walk of names, no import). One
    # that is refused (edited since `corral up`) is refused again in each actor,
    # which reports it and counts it against its group: the fork server serves on.
    try:
        user_tools = import_tool_modules_from_env()
    except UserCodeError as exc:
        log.error("user code refused: %s", exc)
        user_tools = {}
    if plan is None or "openai" in plan["providers"]:
        from corral.actors.providers import openai  # noqa: F401
    from corral.actors.tools.registry import all_tools

    all_tools(user_tools)
    # detect-secrets' patterns come from the supervisor, with the init message
    # (sandbox/forkserver.py): built once there rather than here or in each child.
    # A child's first trio.run specializes trio's bytecode and fills its caches,
    # which copies those pages into every child (~1 ms of CPU each, measured).
    # Doing it here first leaves them warm and shared. trio.run starts no thread
    # and restores the signal state it changed.
    for _ in range(WARM_RUNS):
        trio.run(_warm_trio)


async def _warm_trio() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 0)
    with trio.move_on_after(0.001):
        await trio.sleep_forever()


def actor_main(config: ActorConfig, token: str) -> int:
    from corral.actors.user_code import import_tool_modules_from_env

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {config['actor_id']} %(levelname)s %(message)s")
    try:
        user_tools = import_tool_modules_from_env()  # no import after the fork server's preload
    except UserCodeError as exc:
        # Exits like a template that cannot be imported: it counts against the group.
        log.error("user code refused: %s", exc)
        return EXIT_TEMPLATE_IMPORT
    failpoints.configure(config["failpoints"], config["supervisor_pid"])
    return trio.run(_actor, config, token, user_tools)


async def _actor(config: ActorConfig, token: str, user_tools: Mapping[str, Tool]) -> int:
    try:
        template = lookup_template(config["template"])
    except KeyError:
        log.error("unknown template %r", config["template"])
        return EXIT_UNKNOWN_TEMPLATE
    except (UserCodeError, TypeError) as exc:
        # Exits like a crash, so it counts against the group's restart intensity.
        log.error("template %s cannot be loaded: %s", config["template"], exc)
        return EXIT_TEMPLATE_IMPORT
    actor_id = config["actor_id"]
    async with contextlib.AsyncExitStack() as resources:
        # Before hello: an actor is running only once its tools' deps are ready,
        # and what the factory opened is closed after the template ends.
        try:
            deps = await open_deps(config["params"].get(DEPS_PARAM), resources)
        except DepsFailed as exc:
            log.error("%s:\n%s", exc, exc.trace)
            record_failure(Path(config["home"]), actor_id, exc)
            return EXIT_DEPS
        return await _serve(config, token, user_tools, template, deps)


async def _serve(
    config: ActorConfig, token: str, user_tools: Mapping[str, Tool], template: Template, deps: Any
) -> int:
    actor_id = config["actor_id"]
    failpoints.hit("link.before-dial")
    async with open_channel(
        config["address"],
        actor_id,
        listen=False,
        max_frame=config["max_frame"],
        inbox_size=config["inbox_size"],
        token=token,
        transport=transport_of(config["link"]),
        secret=bytes.fromhex(config["link_secret"]),
    ) as channel:
        hello = Envelope(
            Kind.HELLO,
            actor_id,
            SUPERVISOR,
            {"actor_id": actor_id, "incarnation": config["incarnation"], "pid": os.getpid()},
            token=token,
        )
        await channel.request_envelope(hello, timeout=30)
        ctx = ActorContext(
            actor_id, config["incarnation"], config["template"], channel, config, trio.Event(), user_tools, deps
        )
        _current.set(ctx)  # tasks started below inherit it
        code = 0
        async with trio.open_nursery() as nursery:

            async def run_template() -> None:
                nonlocal code
                code = await template(ctx)
                nursery.cancel_scope.cancel()

            async def watch_shutdown() -> None:
                await ctx.shutdown.wait()
                with trio.move_on_after(DRAIN_S):
                    await trio.sleep_forever()
                nursery.cancel_scope.cancel()

            nursery.start_soon(run_template)
            nursery.start_soon(watch_shutdown)
            if config["heartbeat_interval_s"]:
                nursery.start_soon(_heartbeat, channel, config["heartbeat_interval_s"])
        return code


async def _heartbeat(channel: Channel, interval: float) -> None:
    """Proof of life for the supervisor's stall watchdog. A separate task: an actor
    busy in a long tool call still beats; a stopped (SIGSTOP) or wedged one does not."""
    while True:
        await trio.sleep(interval)
        with contextlib.suppress(ChannelClosed, MailboxFull, trio.TooSlowError):
            await channel.tell(SUPERVISOR, {"op": HEARTBEAT}, timeout=interval)


async def ask_best_effort(ctx: ActorContext, request: Request[Any], timeout: float = 5.0) -> None:
    """A typed report the supervisor may miss (it may be gone too): at most
    ``timeout`` seconds, and no failure of its own; an exit code or the ledger
    still tells."""
    with trio.move_on_after(timeout):
        try:
            await ctx.ask(request, timeout)
        except Exception:  # by contract: best effort
            pass


async def serve_requests(
    ctx: ActorContext, nursery: trio.Nursery, handlers: dict[str, Callable[[Envelope], Awaitable[None]]]
) -> None:
    """A service actor's inbox: each request whose ``op`` has a handler runs in its
    own task of ``nursery``, any other op is answered ``bad-request``; returns at
    shutdown (which it records in ``ctx.shutdown``) or when the channel closes."""
    async for envelope in ctx.channel.inbox:
        if is_shutdown(envelope):
            ctx.shutdown.set()
            return
        if envelope.kind is not Kind.REQUEST:
            continue
        handle = handlers.get(str(envelope.body.get("op")))
        if handle is not None:
            nursery.start_soon(handle, envelope)
        else:
            await ctx.channel.reply_error(envelope, "bad-request", f"unknown op {envelope.body.get('op')!r}")


def is_shutdown(envelope: Envelope) -> bool:
    return envelope.kind is Kind.TELL and envelope.body.get("op") == "shutdown"
