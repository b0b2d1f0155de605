"""An MCP stdio server that starts workers the way launchers do (npx, uvx).

At start it spawns two grandchildren of corral's MCP actor: one in the server's
own process group, and one that calls setsid() (a session and group of its
own, out of reach of a signal to the server's group). Each writes its pid to
``SPAWN_DIR/<kind>-<server pid>.pid`` (atomically) and then waits to be killed.
The server itself serves one tool, ``workers``, that names their pids.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

#: The grandchild: publish its pid (write, then rename: a reader sees all or nothing), then wait.
WORKER = """
import os, sys, time
path = sys.argv[1]
with open(path + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.rename(path + ".tmp", path)
while True:
    time.sleep(3600)
"""

#: An orphan: waits until its parent has exited (so it is re-parented), then
#: publishes its pid and exits at once, leaving a zombie for its new parent to reap.
ORPHAN = """
import os, sys, time
while os.getppid() == int(sys.argv[2]):
    time.sleep(0.01)
with open(sys.argv[1] + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"""

server = MCPServer("spawner")
workers: dict[str, int] = {}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def worker_pids() -> str:
    """The pids of the workers this server started."""
    return " ".join(f"{kind}={pid}" for kind, pid in sorted(workers.items()))


@server.tool()
def orphan(path: str) -> str:
    """Leaves an orphan that exits as soon as it is one (its pid goes to ``path``)."""
    start = ("import os, subprocess, sys;"
             f" subprocess.Popen([sys.executable, '-c', {ORPHAN!r}, {path!r}, str(os.getpid())])")
    subprocess.run([sys.executable, "-c", start], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return "left an orphan"


def spawn(kind: str, spawn_dir: Path, *, own_session: bool) -> None:
    path = spawn_dir / f"{kind}-{os.getpid()}.pid"
    # Not the server's stdio: a worker holding the JSON-RPC pipe would be a different bug.
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=own_session,
    )
    workers[kind] = worker.pid


if __name__ == "__main__":
    spawn_dir = Path(os.environ["SPAWN_DIR"])
    spawn("group", spawn_dir, own_session=False)
    spawn("session", spawn_dir, own_session=True)
    server.run("stdio")
