"""API keys a spec names, checked against the environment a supervisor will start
with: an ``api_key_env`` naming an unset variable has the provider send no key, and
the person would see only the server's 401 later, on the first run. Said at
``corral up`` (on stderr) and ``Client.start`` (a ``UserWarning``), naming the
variable. A warning, not a refusal: a spec may name a variable that is meant to be
unset, so that a local server that wants no key is not sent an ambient
``OPENAI_API_KEY``.

Only a variable the spec names is judged (``api_key_env`` in ``[agents.openai]``, or
a user provider's ``provider_config``): an openai agent that names none reads
``OPENAI_API_KEY`` if it is there, and a local server usually wants no key. A
key file (``api_key_file``) wins over the variable, and is checked where it is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.supervisor.spec.spec_models import AgentSpec, TemplateSpec
    from corral.supervisor.spec.swarm_spec import SwarmSpec


def key_warnings(spec: SwarmSpec, environ: Mapping[str, str]) -> list[str]:
    """One line per agent or template whose named key variable is unset or empty."""
    problems = []
    sections: tuple[tuple[str, Sequence[AgentSpec | TemplateSpec]], ...] = (
        ("agents", spec.agents), ("templates", spec.templates),
    )
    for section, members in sections:
        for index, member in enumerate(members):
            if member.provider in ("scripted", "local"):
                continue
            config = member.provider_config
            table = "openai" if member.provider == "openai" else "provider_config"
            name = config.get("api_key_env")
            if not isinstance(name, str) or not name or config.get("api_key_file"):
                continue
            if not environ.get(name, "").strip():
                problems.append(
                    f"{section}[{index}].{table}.api_key_env: ${name} is not set, so {member.id!r} sends no"
                    f" key and a server that wants one will refuse it: export {name} before starting"
                    " (a server that needs no key can ignore this)"
                )
    return problems
