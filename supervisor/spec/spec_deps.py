"""The ``deps`` factories of a spec's agents (actors/tools/deps.py), resolved and
loaded at load time: an agent's own ``deps``, else ``[tools] deps``.

Each reference is loaded here (``corral.actors.user_code.load``), so ``corral up``
pins its module like any user code and a reference that does not resolve to a
function is a spec error at once, naming it. The factory is not called here: it
runs in each agent's own process at start (a failure there stops ``corral up``
with its traceback: corral/deps_start.py). The resolved reference travels to the
agent's actor as its ``deps`` parameter.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from corral.supervisor.spec.spec_base import SpecError

if TYPE_CHECKING:
    from corral.supervisor.spec.swarm_spec import SwarmSpec


def resolve_deps(spec: SwarmSpec) -> SwarmSpec:
    """``spec`` with each agent's factory reference settled and passed to its actor."""
    from corral.actors.tools.deps import PARAM
    from corral.actors.user_code import check_syntax, load
    from corral.core.errors import UserCodeError

    tools = spec.raw.get("tools")
    default = tools.get("deps") if isinstance(tools, dict) else None
    settled: dict[str, str] = {}
    agents = []
    for index, agent in enumerate(spec.agents):
        reference = agent.deps or default
        if isinstance(reference, str):
            where = f"agents[{index}].deps" if agent.deps else "tools.deps"
            try:
                check_syntax(reference)
                factory = load(reference)
            except UserCodeError as exc:
                raise SpecError(f"{where}: {exc}") from None
            if not callable(factory):
                raise SpecError(f"{where}: {reference!r} is a {type(factory).__name__}, not a function to call")
            settled[agent.id] = reference
            agent = dataclasses.replace(agent, deps=reference)
        agents.append(agent)
    if not settled:
        return spec
    actors = tuple(
        dataclasses.replace(actor, params={**actor.params, PARAM: settled[actor.id]})
        if actor.template == "agent" and actor.id in settled else actor
        for actor in spec.actors
    )
    return dataclasses.replace(spec, agents=tuple(agents), actors=actors)


def agents_with_deps(spec: SwarmSpec) -> list[str]:
    """The ids of the agents whose actors build deps at start."""
    from corral.actors.tools.deps import PARAM

    return [actor.id for actor in spec.actors if actor.template == "agent" and PARAM in actor.params]
