"""JSON Schema from Python types, for every tool: the built-ins' argument
TypedDicts and the user's ``@corral.tool`` signatures go through pydantic, then one
normal form (references inlined, no titles, no unknown keys), so providers and the
validator see the same plain schemas whichever way a tool was declared."""

from __future__ import annotations

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
