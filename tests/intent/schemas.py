"""The reference guard's own schemas (vendored in tests/intent/upstream), as validators."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

from corral.supervisor.intent.intent_contract import is_date_time

UPSTREAM = Path(__file__).resolve().parent / "upstream"
_BASE = "https://upstream.invalid/spec/"


@functools.cache
def upstream_validator(name: str) -> jsonschema.Draft202012Validator:
    """Upstream's schema ``name``, its relative $refs resolved among its siblings and
    ``format: date-time`` asserted (RFC 3339)."""
    resources = [(_BASE + path.name, Resource.from_contents(json.loads(path.read_text())))
                 for path in UPSTREAM.glob("*.schema.json")]
    checker = jsonschema.FormatChecker(formats=())
    checker.checks("date-time")(is_date_time)
    schema = json.loads((UPSTREAM / f"{name}.schema.json").read_text())
    return jsonschema.Draft202012Validator({**schema, "$id": _BASE + f"{name}.schema.json"},
                                           registry=Registry().with_resources(resources), format_checker=checker)


def upstream_errors(name: str, value: Any) -> list[str]:
    return [error.message for error in upstream_validator(name).iter_errors(value)]
