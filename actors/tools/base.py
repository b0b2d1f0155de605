"""The tool interface: a schema, a read-only flag, and an async run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol

from typing_extensions import TypeVar

from corral.actors.providers.base import ToolSchema
from corral.mailbox.protocol import ActionResult, R, Request

#: The type of ``ToolContext.deps``: what the agent's ``deps`` factory returns
#: (actors/tools/deps.py). ``ToolContext`` alone means ``ToolContext[Any]``.
DepsT = TypeVar("DepsT", default=Any)


class ActionParked(Exception):
    """Raised by a tool whose action the supervisor finishes later (a question to the
    user): the agent reports no outcome and releases the lane."""


class ToolError(Exception):
    """A refused or failed tool call; the message is shown to the model and people."""

    def __init__(self, message: str, code: str = "tool-error", traceback: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        #: The tool's own traceback, redacted and bounded (code ``raised``: it crashed).
        self.traceback = traceback


#: A ToolError's code when the tool itself raised (a bug or a crash), as opposed to
#: a refusal (bad input, a policy) or a timeout: people read "raised", not "refused".
RAISED = "raised"
#: A ToolError's code when the tool cannot tell what its effect came to (a rollback
#: that did not complete, a git ref that may have moved): the action is neither ok
#: nor failed but ``needs-reconciliation``, for a person, and never run again.
OUTCOME_UNKNOWN = "outcome-unknown"


class Asker(Protocol):
    """One typed request to the supervisor (``ActorContext.ask``): its fields checked
    by the type checker here and by the supervisor's decoder there."""

    async def __call__(self, request: Request[R], timeout: float = 30.0) -> R: ...


async def _asks_nothing(request: Request[R], timeout: float = 30.0) -> R:
    raise ToolError(f"this tool context asks nothing of the supervisor ({request.METHOD.value})")


@dataclass
class ToolContext(Generic[DepsT]):
    agent_id: str
    run_id: str
    action_id: str
    workspace: Path
    write_scopes: tuple[str, ...]
    home: Path
    is_child: bool = False
    effects_file: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The same on every attempt of one action (it is the action id): pass it to an
    #: API as its idempotency key, so an idempotent tool that runs again is harmless.
    idempotency_key: str = ""
    #: Whether the agent's provider can look at images (``image.inspect``).
    sees_images: bool = False
    #: Asks the supervisor a typed request (mailbox/protocol/); a context made for
    #: a tool that needs no supervisor (an approval view's file read) has none.
    ask: Asker = _asks_nothing
    #: What the agent's ``deps`` factory made when its process started (None: it
    #: names none): annotate ``ctx: corral.ToolContext[MyDeps]`` to type it.
    deps: DepsT = None  # type: ignore[assignment]  # None until a factory is named; DepsT says what it makes


#: The ``default_policy`` of a tool that writes files, changes the project or runs a
#: command: seed 004's default (V1.2, V1.3, V1.10) is that a person approves it,
#: unless the spec says otherwise (``[policy] default = "auto"``: an unattended swarm).
ASKS_A_PERSON = "confirm"


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    #: What the model sees next (may hold file contents: it goes to the run context).
    output: dict[str, Any]
    #: One line for the receipt: no file contents, no secrets.
    summary: str


@dataclass(frozen=True)
class ToolOutcome:
    """How one executed action ended, as the agent reports it (``action.finish``)."""

    ok: bool
    output: dict[str, Any]
    summary: str
    error: str | None
    #: The tool's traceback (it raised), redacted and bounded; kept in the action's
    #: record for people, not shown to the model (its output carries the message).
    traceback: str | None = None
    #: The tool could not tell what its effect came to (``OUTCOME_UNKNOWN``).
    unknown: bool = False

    def result(self, action_id: str) -> ActionResult:
        """The outcome as ``action.finish`` reports it (mailbox/protocol.py)."""
        return ActionResult(action_id, self.ok, self.output, self.summary, self.error, self.traceback,
                            unknown=self.unknown)


class Tool(Protocol):
    schema: ToolSchema

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult: ...


def schema(
    name: str,
    description: str,
    params: Any,
    *,
    read_only: bool,
    sealed: tuple[str, ...] = (),
    effect: str = "",
) -> ToolSchema:
    """The catalog entry of a built-in tool. Its input schema comes from ``params``,
    a TypedDict of the arguments (``NotRequired`` for optional ones), exactly as a
    ``@corral.tool`` function's comes from its signature: one mechanism."""
    from corral.actors.tools.typed_schema import json_schema_of

    return ToolSchema(
        name=name,
        description=description,
        input_schema=json_schema_of(params),
        read_only=read_only,
        sealed=sealed,
        effect=effect,
    )


def is_sealed(value: Any) -> bool:
    """A sealed input field as the ledger holds it (see supervisor/runs/sealed_input.py)."""
    return isinstance(value, dict) and set(value) == {"sealed", "bytes"}


#: What one tool result may take on the wire: it travels in one ``action.finish``
#: frame (1 MiB by default) beside the envelope; larger results go to a sidecar.
MAX_RESULT_WIRE_BYTES = 768 * 1024


def checked_result(name: str, result: Any, limit: int = MAX_RESULT_WIRE_BYTES) -> ToolResult:
    """The tool boundary's last check, for every kind of tool: ``result`` is a
    ToolResult whose output can be sent and recorded, else a ToolError saying what
    is wrong (a failed action), never an exception from inside the send."""
    from corral.actors import recordable

    if not isinstance(result, ToolResult):
        raise ToolError(f"{name} returned a {type(result).__name__}, not a ToolResult", "bad-result")
    if not isinstance(result.output, dict):
        raise ToolError(f"{name} returned an output of type {type(result.output).__name__}, not a map", "bad-result")
    try:
        recordable.check_bounded(result.output, limit, "result")
    except recordable.NotRecordable as exc:
        raise ToolError(f"{name} returned a value that cannot be recorded: {exc}", "bad-result") from None
    return ToolResult(bool(result.ok), result.output, recordable.text(str(result.summary)))


def validate_input(tool_schema: ToolSchema, tool_input: dict[str, Any]) -> None:
    """The one validation path (JSON Schema, corral.actors.tools.validation): a bad
    input fails before anything runs, with an error naming the field."""
    from corral.actors.tools.validation import validation_error

    problem = validation_error(tool_schema.name, tool_schema.input_schema, tool_input, sealed=tool_schema.sealed)
    if problem is not None:
        raise ToolError(problem, "bad-input")


async def ledger_ask(ctx: ToolContext, request: Request[R], refusal: str) -> R:
    """A ledger tool's one supervisor request (keyed by its action id, which the
    record carries); a refusal of bad input becomes the tool's error (``refusal``),
    which the model sees."""
    from corral.mailbox.errors import RemoteError

    try:
        return await ctx.ask(request)
    except RemoteError as exc:
        if exc.code == "bad-request":
            raise ToolError(exc.message, refusal) from None
        raise
