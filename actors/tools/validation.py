"""One validation path for every tool's arguments: built-in, user and MCP tools.

A tool's input schema is JSON Schema (from type hints for Python tools, from the
server for MCP tools); arguments are checked against it with ``jsonschema`` before
the action is prepared, and the first error names the field.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

from corral.core.redact import summarize


@functools.lru_cache(maxsize=1024)
def _validator(schema_json: str) -> Any:
    """A checked validator per distinct schema (checking a schema costs more than using it)."""
    schema = json.loads(schema_json)
    validator_type = jsonschema.validators.validator_for(schema)
    validator_type.check_schema(schema)
    return validator_type(schema)


#: The validator of a schema object a tool holds, by identity (the schema object is
#: kept with it, so its id is not reused): no serialisation of the schema per call.
_by_identity: dict[int, tuple[dict[str, Any], Any]] = {}


def _validator_of(schema: dict[str, Any]) -> Any:
    known = _by_identity.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    validator = _validator(json.dumps(schema, sort_keys=True))
    if len(_by_identity) >= 1024:
        _by_identity.clear()
    _by_identity[id(schema)] = (schema, validator)
    return validator


def validation_error(
    name: str, schema: dict[str, Any], value: dict[str, Any], *, sealed: tuple[str, ...] = ()
) -> str | None:
    """Why ``value`` does not fit ``schema`` (naming the field), or None. Sealed
    fields, which the ledger holds as ``{"sealed": sha256, "bytes": n}``, are checked
    as the strings they stand for."""
    if sealed:
        value = {key: ("" if key in sealed and _is_sealed(item) else item) for key, item in value.items()}
    try:
        validator = _validator_of(schema)
    except jsonschema.SchemaError as exc:
        return f"{name}: the tool's input schema is invalid ({summarize(exc.message, 120)})"
    errors = sorted(validator.iter_errors(value), key=lambda error: list(error.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = ".".join(str(part) for part in first.absolute_path) or "(arguments)"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{name}: invalid argument {where}: {summarize(first.message, 200)}{more}"


def _is_sealed(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"sealed", "bytes"}
