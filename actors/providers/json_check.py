"""The JSON Schema subset corral's tool inputs use, checked against a decoded value
(type, properties, required, additionalProperties, enum, items): the parser's
``arguments-schema`` check of a plan's inputs and of a plan update (plan_parse.py).
Pure functions only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
}


def short(value: str, limit: int = 64) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _type_matches(value: Any, expected: str) -> bool:
    # bool is an int subclass in Python but never a JSON number.
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    types = _JSON_TYPES.get(expected)
    return types is not None and isinstance(value, types)


def json_type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    for name, types in (("number", (float,)), *_JSON_TYPES.items()):
        if isinstance(value, types):
            return name
    return type(value).__name__


def _check_type(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    expected = schema.get("type")
    if expected is None:
        return None
    options = [expected] if isinstance(expected, str) else list(expected)
    if any(_type_matches(value, option) for option in options):
        return None
    return f"{path}: expected {'|'.join(options)}, got {json_type_name(value)}"


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> str | None:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            return f"{path}: missing required property {name!r}"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            problem = validate(item, properties[name], f"{path}.{name}")
        elif extra is False:
            problem = f"{path}: unexpected property {short(name)!r}"
        elif isinstance(extra, Mapping):
            problem = validate(item, extra, f"{path}.{name}")
        else:
            problem = None
        if problem:
            return problem
    return None


def _check_array(value: list[Any], schema: Mapping[str, Any], path: str) -> str | None:
    items = schema.get("items")
    if not isinstance(items, Mapping):
        return None
    for i, item in enumerate(value):
        problem = validate(item, items, f"{path}[{i}]")
        if problem:
            return problem
    return None


def validate(value: Any, schema: Mapping[str, Any], path: str = "$") -> str | None:
    """Check ``value`` against the JSON Schema subset corral tools use (type,
    properties, required, additionalProperties, enum, items). Returns the first
    problem, or None. Unknown keywords are ignored rather than rejected so a richer
    schema still validates its core."""
    problem = _check_type(value, schema, path)
    if problem:
        return problem
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"{path}: {short(json.dumps(value, default=str))} is not one of {allowed}"
    if isinstance(value, dict):
        return _check_object(value, schema, path)
    if isinstance(value, list):
        return _check_array(value, schema, path)
    return None
