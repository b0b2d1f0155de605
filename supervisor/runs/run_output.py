"""A run's typed output as the views and the swarm results show it (issue 49 §2).

The lane checked the final reply against the agent's ``output`` before the plan
was committed (actors/typed_output.py), and the reply is the output's JSON: here it
is only read back, for ``corral show --json``, ``RunResult.output`` and a
delegation's or a child's result.
"""

from __future__ import annotations

import json
from typing import Any


def _options(options: Any) -> dict[str, Any]:
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError:
            return {}
    return options if isinstance(options, dict) else {}


def output_model(options: Any) -> str | None:
    """``module:Class`` of the run's pydantic model, when its output is one."""
    output = _options(options).get("output")
    model = output.get("model") if isinstance(output, dict) else None
    return model if isinstance(model, str) else None


def output_of(options: Any, reply: str | None) -> Any:
    """The run's validated output (None: no typed output, or no final reply yet)."""
    if reply is None or not isinstance(_options(options).get("output"), dict):
        return None
    try:
        return json.loads(reply)
    except ValueError:  # a reply committed before its agent had an output
        return None
