"""``corral up`` (and ``Client.start``) waits for the agents that build tools' deps
at start (actors/tools/deps.py): once each has said hello its deps are ready; one
whose factory failed (it exits ``EXIT_DEPS`` before hello) stops the supervisor
it just started, and the start fails with the factory's traceback.

The wait is for events (the ``events`` control call blocks until one comes), not
a sleep; ``status`` says where each agent is.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

#: How long one events call waits for news before ``status`` is asked again.
WAIT_MS = 500


class DepsStartError(Exception):
    """An agent's deps factory failed at start: ``message`` says which, with its traceback."""


def agents_with_deps(spec_path: Path) -> list[str]:
    """The agents of the spec file that build deps at start (their own ``deps``,
    or ``[tools] deps`` for all). The spec was checked already: only the keys are read."""
    data = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    tools = data.get("tools")
    default = tools.get("deps") if isinstance(tools, dict) else None
    listed = data.get("agents")
    agents: list[Any] = listed if isinstance(listed, list) else []
    return [str(a["id"]) for a in agents if isinstance(a, dict) and "id" in a and (a.get("deps") or default)]


def wait_for_deps(home: Path, agent_ids: list[str], timeout: float) -> None:
    """Until every agent of ``agent_ids`` has said hello (its deps are ready);
    DepsStartError for one whose factory failed, TimeoutError past ``timeout``."""
    from corral import client
    from corral.actors.tools.deps import EXIT_DEPS, read_failure

    deadline = time.monotonic() + timeout
    waiting = set(agent_ids)
    cursor = int(client.call(home, "status").get("cursor") or 0)
    while True:
        for actor in _actors(client.call(home, "status")):
            if actor["id"] not in waiting:
                continue
            if actor.get("last_exit") == EXIT_DEPS:
                said = read_failure(home, actor["id"]) or f"(see {home / 'logs' / (actor['id'] + '.log')})"
                raise DepsStartError(f"agent {actor['id']}: {said.rstrip()}")
            if actor["status"] == "running":
                waiting.discard(actor["id"])
        if not waiting:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"agents {', '.join(sorted(waiting))} did not start within {timeout:g} s")
        page = client.call(home, "events", timeout=WAIT_MS / 1000 + 10, since=cursor,
                           wait_ms=int(min(WAIT_MS, remaining * 1000)))
        cursor = int(page["cursor"])


def _actors(status: dict[str, Any]) -> list[dict[str, Any]]:
    actors = status.get("actors")
    return [a for a in actors if isinstance(a, dict)] if isinstance(actors, list) else []
