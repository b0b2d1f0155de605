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

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ACTOR_ID = "bridge-worker"
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")


class BridgeSpecError(ValueError):
    pass


@dataclass(frozen=True)
class BridgeSpec:
    url: str
    token_env: str
    agent: str
    titles: tuple[str, ...]
    lease_ms: int
    poll_s: float

    def actor_params(self) -> dict[str, Any]:
        return {"url": self.url, "token_env": self.token_env, "agent": self.agent, "titles": list(self.titles),
                "lease_ms": self.lease_ms, "poll_s": self.poll_s}


def parse(table: Any, agent_ids: set[str]) -> BridgeSpec:
    if not isinstance(table, dict):
        raise BridgeSpecError("bridge: must be a table")
    unknown = set(table) - {"url", "token_env", "agent", "titles", "lease_ms", "poll_s"}
    if unknown:
        raise BridgeSpecError(f"bridge: unknown keys {sorted(unknown)}")
    url = table.get("url")
    if not isinstance(url, str):
        raise BridgeSpecError(f"bridge.url: must be http://HOST:PORT, not {url!r}")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise BridgeSpecError(f"bridge.url: must be http://HOST:PORT, not {url!r}")
    token_env = table.get("token_env", "CORRAL_BRIDGE_TOKEN")
    if not isinstance(token_env, str) or not _ENV.match(token_env):
        raise BridgeSpecError("bridge.token_env: must be an environment variable name (A-Z, 0-9, _)")
    agent = table.get("agent")
    if agent not in agent_ids:
        raise BridgeSpecError(f"bridge.agent: {agent!r} is not an agent of this spec (known: {sorted(agent_ids)})")
    titles = table.get("titles", ["*"])
    if not isinstance(titles, list) or not titles or not all(isinstance(t, str) and t for t in titles):
        raise BridgeSpecError("bridge.titles: must be a non-empty list of title globs")
    lease_ms = table.get("lease_ms", 60_000)
    if not isinstance(lease_ms, int) or isinstance(lease_ms, bool) or not 1000 <= lease_ms <= 86_400_000:
        raise BridgeSpecError("bridge.lease_ms: must be an integer from 1000 to 86400000")
    poll_s = table.get("poll_s", 2.0)
    if not isinstance(poll_s, (int, float)) or isinstance(poll_s, bool) or not 0.05 <= poll_s <= 3600:
        raise BridgeSpecError("bridge.poll_s: must be a number of seconds from 0.05 to 3600")
    return BridgeSpec(url, token_env, str(agent), tuple(titles), lease_ms, float(poll_s))
