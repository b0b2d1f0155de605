"""An agent's typed output (issue 49 §2): the spec's ``output``, a JSON Schema or a
pydantic model (``"module:Class"``), as a run carries it in its options
(``{"schema": {...}, "model": "module:Class" | None}``).

The model is asked for it as constrained as its provider allows (the plan schema's
``final`` becomes this schema: actors/providers/local_schema.py), and the lane
checks the final reply here, one path for both kinds: a schema by ``jsonschema``,
a model by pydantic (its own validators included). An invalid output is an
invalid plan: the run's bounded repair asks again with the field and the message,
and past the bound the run fails naming the field. A valid one becomes the final
reply as its JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from corral.actors.tools.validation import _validator
from corral.core.redact import summarize

#: The output schema's name where a server wants one (``response_format``).
SCHEMA_NAME = "corral_output"


class OutputInvalid(ValueError):
    """The final reply is not the agent's output: ``where`` names the field."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class OutputSpecError(ValueError):
    """The spec's ``output`` cannot be used (the message says why)."""


@dataclass(frozen=True)
class OutputSpec:
    schema: dict[str, Any]
    #: ``module:Class`` of a pydantic model (None: the schema was given as it is).
    model: str | None = None

    @classmethod
    def from_options(cls, value: Any) -> OutputSpec | None:
        """A run's ``output`` option, or None when its agent has no typed output."""
        if not isinstance(value, dict) or not isinstance(value.get("schema"), dict):
            return None
        model = value.get("model")
        return cls(value["schema"], model if isinstance(model, str) else None)

    def options(self) -> dict[str, Any]:
        return {"output": {"schema": self.schema, "model": self.model}}

    def check(self, reply: str) -> tuple[Any, str]:
        """The validated output of a final reply, and the reply as its JSON.
        Raises OutputInvalid naming the field."""
        try:
            value = json.loads(reply)
        except json.JSONDecodeError as exc:
            raise OutputInvalid("output", f"the final reply must be the output as JSON, matching its schema"
                                          f" ({exc.msg} at {exc.pos})") from None
        if self.model is not None:
            value = _model_checked(self.model, value)
        else:
            _schema_checked(self.schema, value)
        return value, json.dumps(value, ensure_ascii=False)


def _path(parts: Any) -> str:
    where = "output"
    for part in parts:
        where += f"[{part}]" if isinstance(part, int) else f".{part}"
    return where


def _schema_checked(schema: dict[str, Any], value: Any) -> None:
    validator = _validator(json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(value), key=lambda error: list(error.absolute_path))
    if errors:
        first = errors[0]
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise OutputInvalid(_path(first.absolute_path), summarize(first.message, 200) + more)


def _model_checked(reference: str, value: Any) -> Any:
    """Validated by the pydantic model itself (its validators too), as its JSON."""
    import pydantic

    model = load_model(reference)
    try:
        return model.model_validate(value).model_dump(mode="json")
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise OutputInvalid(_path(first["loc"]), summarize(str(first["msg"]), 200) + more) from None


def load_model(reference: str) -> Any:
    """The pydantic model class ``module:Class`` names, loaded as user code is
    (actors/user_code.py: by file, pinned at ``corral up``)."""
    import pydantic

    from corral.actors.user_code import load
    from corral.core.errors import UserCodeError

    try:
        found = load(reference)
    except UserCodeError as exc:
        raise OutputSpecError(str(exc)) from None
    if not (isinstance(found, type) and issubclass(found, pydantic.BaseModel)):
        raise OutputSpecError(f"{reference!r} is not a pydantic model class (a subclass of pydantic.BaseModel)")
    return found


def resolve(value: Any) -> OutputSpec:
    """The spec's ``output`` (a JSON Schema table, or ``"module:Class"``) checked and
    settled: a model's schema is taken from it now. Raises OutputSpecError."""
    if isinstance(value, str):
        from corral.actors.user_code import is_reference

        if not is_reference(value):
            raise OutputSpecError(f"{value!r} is neither a JSON Schema table nor a 'module:Class' reference")
        schema = load_model(value).model_json_schema()
        return OutputSpec(schema, value)
    if not isinstance(value, dict):
        raise OutputSpecError("must be a JSON Schema (a table) or a 'module:Class' naming a pydantic model")
    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as exc:
        raise OutputSpecError(f"is not a valid JSON Schema: {summarize(exc.message, 200)}") from None
    if value.get("type") not in ("object", None) or (value.get("type") is None and "properties" not in value):
        raise OutputSpecError('must describe a JSON object (`type = "object"` with `properties`)')
    return OutputSpec(value)
