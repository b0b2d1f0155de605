"""``@corral.tool``: a typed Python function becomes a durable tool.

The input JSON Schema comes from the parameters' type hints (pydantic), as in
Pydantic AI; a parameter annotated ``ToolContext`` (any name, any position, or
none at all) gets the call's context instead. The description comes from the
docstring, and the effect class tells recovery what it may do after a crash:

- ``"read"``: no side effect; may run again.
- ``"idempotent"``: may run again with the same ``ctx.idempotency_key`` (the action
  id, the same on every attempt): pass it to the API you call.
- ``"external"`` (the default): never runs twice. A crash after ``executing`` is
  committed and before the result is recorded leaves the action
  ``needs-reconciliation`` for a person.

Arguments are validated before the action is prepared (bad ones never reach the
function), an exception is a failed action ("raised") carrying its redacted
message and the user's frames of its traceback, and
``timeout_s`` is enforced. A sync function runs in a worker thread; a timed-out sync
function cannot be killed, so its thread is abandoned (the action fails) and
finishes on its own: give blocking calls their own timeouts.

``@tool`` only declares: it attaches the ``UserTool`` to the function and registers
nothing. The catalog is built explicitly from the modules the spec names
(``user_tools_of``), and that value is passed to whoever needs it.
"""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from corral.actors import recordable
from corral.actors.providers.base import ToolSchema
from corral.actors.tools.base import RAISED, ToolContext, ToolError, ToolResult
from corral.actors.tools.sidecar import ResultTooLarge, bounded, sidecar_path
from corral.actors.tools.tool_traceback import user_traceback
from corral.actors.tools.typed_schema import SignatureError, arguments_of, normal_form
from corral.core.redact import summarize

Effect = Literal["read", "idempotent", "external"]
EFFECTS: tuple[str, ...] = ("read", "idempotent", "external")
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789._-")

#: The attribute ``@tool`` sets on a function it declared: its ``UserTool`` (how the
#: catalog finds a module's tools, and ``Client.start(tools=[f])`` tells a tool from
#: a plain function).
MARK = "__corral_tool__"

F = TypeVar("F", bound=Callable[..., Any])


class ToolDeclarationError(TypeError):
    """A ``@tool`` that cannot be a tool (a clear message at import time)."""


@dataclass
class UserTool:
    """A declared tool: the one Tool protocol (schema + run) around a function."""

    schema: ToolSchema
    effect: str
    func: Callable[..., Any]
    timeout_s: float
    model: Any  # a pydantic model class of the arguments
    #: The parameter the ToolContext is injected into (None: the function takes none).
    context: str | None = None
    #: Positional-only parameters, in order (passed by position, the context among them).
    positional: tuple[str, ...] = ()

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        import pydantic
        import trio

        try:
            arguments = self.model.model_validate(tool_input)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "(arguments)"
            raise ToolError(f"{self.schema.name}: invalid argument {where}: {first['msg']}", "bad-input") from None
        kwargs: dict[str, Any] = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        if self.context is not None:
            kwargs[self.context] = ctx
        args = [kwargs.pop(name) for name in self.positional]
        try:
            with trio.fail_after(self.timeout_s):
                if inspect.iscoroutinefunction(self.func):
                    value = await self.func(*args, **kwargs)
                else:
                    value = await trio.to_thread.run_sync(
                        lambda: self.func(*args, **kwargs), abandon_on_cancel=True
                    )
        except trio.TooSlowError:
            raise ToolError(f"{self.schema.name} did not finish within {self.timeout_s:g} s", "timeout") from None
        except ToolError:
            raise
        except Exception as exc:  # the user's bug or refusal is a failed action, not a dead agent
            raise ToolError(
                f"{self.schema.name} raised {type(exc).__name__}: {summarize(str(exc), 300)}",
                RAISED,
                traceback=user_traceback(exc, self.func),
            ) from None
        output = value if isinstance(value, dict) else {"result": value}
        try:
            # Before anything is written: a set, a datetime or a cycle is the tool's
            # error, not something to stringify into a sidecar or crash the send.
            recordable.check(value, "result")
            text = json.dumps(output)
            path = sidecar_path(ctx.home, ctx.run_id, ctx.action_id, "tool")
            shown = bounded(output, path, preview=summarize(text, 2000))
        except ResultTooLarge as exc:
            raise ToolError(f"{self.schema.name}: {exc}", ResultTooLarge.code) from None
        except recordable.NotRecordable as exc:
            message = f"{self.schema.name} returned a value that cannot be recorded: {exc}"
            raise ToolError(message, "bad-result") from None
        return ToolResult(True, shown, f"{self.schema.name}: {summarize(text, 120)}")


def declared_tool(func: object) -> UserTool | None:
    """The ``UserTool`` ``@tool`` attached to ``func``, or None: it was not declared as one."""
    try:
        # Its own attributes only: a module's odd objects (a proxy, a mock) run no
        # __getattr__ of theirs while the catalog looks through the module.
        declared = vars(func).get(MARK)
    except TypeError:  # no __dict__: nothing was attached
        return None
    return declared if isinstance(declared, UserTool) else None


def declared_name(func: object) -> str | None:
    """The tool name ``@tool`` gave ``func``, or None: it was not declared as one."""
    declared = declared_tool(func)
    return declared.schema.name if declared is not None else None


def user_tools_of(
    sources: Iterable[types.ModuleType | Callable[..., Any]], reserved: Collection[str] = ()
) -> dict[str, UserTool]:
    """The catalog of the user's tools: every ``@tool`` function found in the modules
    (their top-level objects carrying the declaration) and every declared function
    passed directly, by name. A name declared twice (two functions, in one module or
    two) or taken by a ``reserved`` name (a built-in tool's) is refused, naming both:
    one name must mean one function in the supervisor and in every agent."""
    found: dict[str, UserTool] = {}
    for source in sources:
        candidates = vars(source).values() if isinstance(source, types.ModuleType) else (source,)
        for candidate in candidates:
            declared = declared_tool(candidate)
            if declared is None:
                continue
            name = declared.schema.name
            if name in reserved:
                raise ToolDeclarationError(
                    f"tool {name} ({_where(declared.func)}): {name!r} is a built-in tool's name: pick another"
                )
            earlier = found.setdefault(name, declared)
            if earlier is not declared:
                raise ToolDeclarationError(
                    f"tool name {name!r} is declared twice: by {_where(earlier.func)} and by"
                    f" {_where(declared.func)}; give one of them another name="
                )
    return found


def tool(
    func: F | None = None,
    *,
    name: str | None = None,
    effect: Effect = "external",
    timeout_s: float = 60.0,
    description: str | None = None,
) -> Any:
    """Declare a typed function as a corral tool: ``f(city: str) -> str``.

    Every parameter is an argument the model fills, described by its type hint (a
    default makes it optional); a parameter annotated ``ToolContext`` (any name, any
    position) gets the call's context instead and is not in the schema.

    ``name`` defaults to the function's name; ``effect`` is the tool's contract with
    recovery (``"read"``, ``"idempotent"`` or ``"external"``, the safe default);
    ``timeout_s`` bounds each call; the docstring (or ``description``) tells the
    model what the tool does. Usable as ``@tool`` or ``@tool(...)``.
    """

    def declare(target: F) -> F:
        tool_name = name or target.__name__
        if not tool_name or not set(tool_name) <= _NAME_CHARS or len(tool_name) > 64:
            raise ToolDeclarationError(f"tool name {tool_name!r}: use 1-64 of a-z, 0-9, '.', '_', '-'")
        if tool_name == "default":
            raise ToolDeclarationError("tool name 'default' is the key of a policy table's default: pick another")
        if tool_name.startswith("mcp."):
            raise ToolDeclarationError(f"tool name {tool_name!r}: 'mcp.' names belong to MCP servers")
        if effect not in EFFECTS:
            raise ToolDeclarationError(f"tool {tool_name}: effect must be one of {', '.join(EFFECTS)}")
        if not 0 < timeout_s <= 24 * 3600:
            raise ToolDeclarationError(f"tool {tool_name}: timeout_s must be within (0, 86400]")
        try:
            arguments = arguments_of(target, ToolContext)
        except SignatureError as exc:
            raise ToolDeclarationError(f"tool {tool_name} ({_where(target)}): {exc}") from None
        model = arguments.model
        schema = normal_form(model.model_json_schema())
        text = description or inspect.getdoc(target) or tool_name
        declared = UserTool(
            schema=ToolSchema(
                name=tool_name,
                description=text[:2000],
                input_schema=schema,
                read_only=effect == "read",
                effect=effect,
            ),
            effect=effect,
            func=target,
            timeout_s=float(timeout_s),
            model=model,
            context=arguments.context,
            positional=arguments.positional,
        )
        try:
            setattr(target, MARK, declared)
        except (AttributeError, TypeError):
            # The declaration lives on the function; nothing else holds it.
            raise ToolDeclarationError(
                f"tool {tool_name} ({_where(target)}): this callable cannot carry its declaration"
                " (a builtin or a slotted object): wrap it in a def"
            ) from None
        return target

    if func is not None:
        return declare(func)
    return cast(Callable[[F], F], declare)


def _where(func: Callable[..., Any]) -> str:
    """``module.qualname`` of a function, for an error that points at it."""
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", repr(func))
    return f"{module}.{qualname}" if module else str(qualname)
