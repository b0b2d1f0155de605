"""JSON Schema from Python types, for every tool: the built-ins' argument
TypedDicts and the user's ``@corral.tool`` signatures go through pydantic, then one
normal form (references inlined, no titles, no unknown keys), so providers and the
validator see the same plain schemas whichever way a tool was declared."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def json_schema_of(params: Any) -> dict[str, Any]:
    """The input schema of a TypedDict (or pydantic model) of arguments."""
    import pydantic

    raw = pydantic.TypeAdapter(params).json_schema()
    return normal_form(raw)


def normal_form(schema: dict[str, Any]) -> dict[str, Any]:
    definitions: dict[str, Any] = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(definitions[ref.removeprefix("#/$defs/")])
            out = {key: walk(value) for key, value in node.items() if key not in ("title", "$defs")}
            properties = node.get("properties")
            if isinstance(properties, dict):
                # A map of parameter names, not a schema: a parameter named "title"
                # (or "$defs") is a parameter, whatever its name looks like.
                out["properties"] = {name: walk(value) for name, value in properties.items()}
            if out.get("type") == "object" and "properties" in out:
                out.setdefault("required", [])
                out["additionalProperties"] = False
            return out
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


class SignatureError(TypeError):
    """A function signature that cannot be described to a model (the message names
    the parameter; the caller adds the tool's name)."""


@dataclass(frozen=True)
class Arguments:
    """A tool function's parameters: the pydantic model of the ones the model fills,
    and where the context goes (injected, never in the schema)."""

    model: Any
    #: The parameter annotated with the context type; None: the function takes none.
    context: str | None
    #: Parameters that can only be passed by position, in order (the context among them).
    positional: tuple[str, ...]


def arguments_of(func: Callable[..., Any], context_type: type) -> Arguments:
    """Read ``func``'s signature as Pydantic AI does: every parameter is an argument
    the model fills, typed by its hint (a default makes it optional), except the one
    annotated ``context_type`` (at any position, under any name), which is injected.
    A parameter without a hint is an error: a silent guess is how ``f(city: str)``
    once lost ``city`` to the context."""
    import pydantic

    try:
        hints = inspect.get_annotations(func, eval_str=True)
    except Exception as exc:  # a hint naming something the module does not define
        raise SignatureError(f"its type hints cannot be evaluated ({type(exc).__name__}: {exc})") from None
    fields: dict[str, Any] = {}
    context: str | None = None
    positional: list[str] = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise SignatureError(f"parameter {param.name!r}: *args and **kwargs cannot be described to a model")
        if param.name not in hints:
            raise SignatureError(
                f"parameter {param.name!r} needs a type annotation (the model's arguments come from the hints;"
                f" annotate the context as {context_type.__name__})"
            )
        if param.kind is param.POSITIONAL_ONLY:
            positional.append(param.name)
        hint = hints[param.name]
        origin: Any = typing.get_origin(hint)  # ToolContext[MyDeps] is the context too
        candidate: Any = hint if origin is None else origin
        if isinstance(candidate, type) and issubclass(candidate, context_type):
            if context is not None:
                raise SignatureError(
                    f"parameters {context!r} and {param.name!r} are both annotated {context_type.__name__};"
                    " a tool takes the context once"
                )
            context = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    config = pydantic.ConfigDict(extra="forbid")
    try:
        model = pydantic.create_model(f"{func.__name__}_arguments", __config__=config, **fields)
        model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, NameError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SignatureError(f"its parameters cannot be described as JSON Schema: {first}") from None
    return Arguments(model, context, tuple(positional))
