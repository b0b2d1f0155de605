"""``[bridge]``: a corral swarm that works for an agent-task bridge.

```toml
[bridge]
url = "http://127.0.0.1:8471"      # the bridge (corral bridge serve)
token_env = "CORRAL_BRIDGE_TOKEN"  # the bearer token comes from this variable
agent = "writer"                   # the corral agent that runs each claimed task
titles = ["*"]                     # which tasks to claim: globs on the title
lease_ms = 60000
poll_s = 2.0
```

One ``bridge_worker`` actor (its own one_for_one group) claims, runs and submits;
the token reaches that actor's environment only, never the ledger.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, StrictFloat, StrictInt, StrictStr, field_validator
from pydantic.dataclasses import dataclass

from corral.supervisor.spec.spec_base import SECTION, SpecError, problem

ACTOR_ID = "bridge-worker"


@dataclass(frozen=True, kw_only=True, config=SECTION)
class BridgeSpec:
    """``[bridge]``: work for an agent-task bridge (docs/bridge.md). One ``bridge_worker``
    actor (``bridge-worker``, a one_for_one group of its own) claims tasks, runs each
    as a run of ``agent`` and submits its final reply; the token reaches that
    actor's environment only, never the ledger."""

    url: StrictStr = Field(description="The bridge (`corral bridge serve`), as `http://HOST:PORT`.")
    token_env: Annotated[StrictStr, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,63}$")] = Field(
        default="CORRAL_BRIDGE_TOKEN", description="The environment variable holding the bearer token.")
    agent: StrictStr = Field(description="The agent of this spec that runs each claimed task.")
    titles: tuple[Annotated[StrictStr, Field(min_length=1)], ...] = Field(
        default=("*",), min_length=1, description="Which tasks to claim: globs on their title.")
    lease_ms: StrictInt = Field(
        default=60_000, ge=1000, le=86_400_000,
        description="The lease asked for with each claim, in ms; renewed every third of it while the run lives.")
    poll_s: StrictFloat = Field(default=2.0, ge=0.05, le=3600, description="Seconds between looks for work.")

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:  # a port out of range
            port = None
        if parts.scheme != "http" or not parts.hostname or not port:
            raise problem(f"must be http://HOST:PORT, not {url!r}")
        return url

    def actor_params(self) -> dict[str, Any]:
        return {"url": self.url, "token_env": self.token_env, "agent": self.agent, "titles": list(self.titles),
                "lease_ms": self.lease_ms, "poll_s": self.poll_s}


def check_agent(bridge: BridgeSpec, agent_ids: set[str]) -> None:
    """The bridge's agent must be one of the spec's."""
    if bridge.agent not in agent_ids:
        raise SpecError(f"bridge.agent: {bridge.agent!r} is not an agent of this spec (known: {sorted(agent_ids)})")
