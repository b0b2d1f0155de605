"""User actor templates: ``[[actors]] template = "my_pkg.actors:Counter"``.

A template is either

* a subclass of ``Actor`` (the documented protocol below), or
* an ``async def template(ctx: ActorContext) -> int`` function: the same protocol
  the built-in templates use; it owns the inbox and returns the exit code.

Both are supervised exactly like the built-ins: restart type, group strategy,
restart intensity and backoff come from the spec. A template that cannot be
imported, or whose ``start`` raises, ends its process with a documented exit code
and a log line naming the reference and the exception; the exit counts against the
group's restart intensity like any crash.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from corral.actors import recordable
from corral.actors.runtime import EXIT_TEMPLATE_START, ActorContext, is_shutdown
from corral.mailbox.envelope import Envelope, Kind

log = logging.getLogger("corral.actor")

#: Seconds ``stop`` may take when the actor is asked to shut down.
STOP_GRACE_S = 1.0
#: Room an envelope needs beside the reply it carries.
REPLY_SLACK_BYTES = 4096


class Actor:
    """Base class of a user actor template.

    corral creates one instance per process incarnation, calls ``start`` once, then
    ``handle_ask`` for each request (its return value is the reply) and
    ``handle_tell`` for each one-way message, serially, in arrival order; ``stop``
    runs on a graceful shutdown. State kept on ``self`` lives as long as the process:
    after a crash the supervisor starts a fresh instance, so anything that must
    survive a restart belongs in durable storage.

    Let it crash: an exception in ``handle_ask`` is answered to the asker as an
    ``actor-error`` and then ends the process, and the supervisor restarts it by
    the spec's policy.
    """

    def __init__(self, ctx: ActorContext) -> None:
        #: Identity (``actor_id``, ``incarnation``), ``params`` from the spec, and
        #: ``call()`` to the supervisor.
        self.ctx = ctx

    @property
    def params(self) -> dict[str, Any]:
        """The ``[actors.params]`` table of this actor's spec."""
        return self.ctx.params

    async def start(self) -> None:
        """Called once before the first message. Raising here counts as a crash."""

    async def handle_ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Answer a request (``Client.ask(actor_id, message)``). Must return a map of
        JSON values; one that cannot be sent (a set, a datetime, a cycle, too large)
        is answered with a ``bad-reply`` error instead, and the actor lives on."""
        raise NotImplementedError(f"{type(self).__name__} does not answer requests")

    async def handle_tell(self, message: dict[str, Any]) -> None:
        """Take a one-way message. The default ignores it."""

    async def stop(self) -> None:
        """Called on a graceful shutdown (never after a SIGKILL: keep it optional)."""


Template = Callable[[ActorContext], Awaitable[int]]


def as_template(reference: str, target: Any) -> Template:
    """The runtime's template function for a resolved user reference."""
    if isinstance(target, type) and issubclass(target, Actor):
        actor_class = target

        async def run_class(ctx: ActorContext) -> int:
            return await run_actor(actor_class, ctx, reference)

        return run_class
    if inspect.iscoroutinefunction(target):
        function: Template = target
        return function
    raise TypeError(
        f"{reference!r} is a {type(target).__name__}, not a template: a template must be a"
        " subclass of corral.Actor or an `async def template(ctx) -> int` function"
    )


async def run_actor(actor_class: type[Actor], ctx: ActorContext, reference: str) -> int:
    try:
        actor = actor_class(ctx)
        await actor.start()
    except Exception as exc:
        log.error("template %s failed to start: %s: %s", reference, type(exc).__name__, exc, exc_info=True)
        return EXIT_TEMPLATE_START
    try:
        async for envelope in ctx.channel.inbox:
            if is_shutdown(envelope):
                ctx.shutdown.set()
                break
            await _dispatch(actor, ctx, envelope)
    finally:
        if ctx.shutdown.is_set():
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_GRACE_S):
                await actor.stop()
    return 0


async def _dispatch(actor: Actor, ctx: ActorContext, envelope: Envelope) -> None:
    if envelope.kind is Kind.TELL:
        await actor.handle_tell(envelope.body)
        return
    if envelope.kind is not Kind.REQUEST:
        return
    try:
        answer = await actor.handle_ask(envelope.body)
        if not isinstance(answer, dict):
            raise TypeError(f"handle_ask returned {type(answer).__name__}, not a dict")
    except Exception as exc:
        await ctx.channel.reply_error(envelope, "actor-error", recordable.text(f"{type(exc).__name__}: {exc}"))
        raise
    try:
        recordable.check_bounded(answer, _reply_budget(ctx), "the reply")
    except recordable.NotRecordable as exc:
        # A value the wire cannot carry is this answer's fault, not the actor's
        # state: the asker gets a clear error and the actor keeps serving.
        log.warning("%s: %s", ctx.actor_id, exc)
        await ctx.channel.reply_error(envelope, "bad-reply", f"handle_ask returned a reply that cannot be sent: {exc}")
        return
    await ctx.channel.reply(envelope, answer)


def _reply_budget(ctx: ActorContext) -> int:
    """What a reply's body may take: the frame limit, less room for the envelope."""
    return max(1024, ctx.config["max_frame"] - REPLY_SLACK_BYTES)
