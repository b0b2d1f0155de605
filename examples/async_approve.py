"""An asyncio app on one client: a run whose file write asks a person, and three
tasks sharing one ``corral.AsyncClient`` at once. One waits for the run, one
follows the event stream, and one approves the write when it shows as pending.
Runs on the built-in scripted provider: no model, no API key.

    python examples/async_approve.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import corral

SPEC = """
name = "async-approve-example"

[project]
root = "project"

# A write asks a person first (the default, said here for the reader).
[policy]
"fs.write" = "confirm"

[[agents]]
id = "writer"
instructions = "You keep the project's notes."

  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "notes.md", content = "approved from asyncio\\n" } }]

  [[agents.steps]]
  final = "Wrote notes.md"
"""


async def approve_when_pending(client: corral.AsyncClient, run_id: str) -> None:
    """A person's part, automated here: approve the run's write once it waits."""
    while True:
        for action in (await client.pending()).actions:
            if action["run_id"] == run_id and action["phase"] == "waiting-confirmation":
                await client.approve(action["action_id"])
                print(f"approved {action['tool']} ({action['action_id']})")
                return
        await asyncio.sleep(0.05)


async def follow(client: corral.AsyncClient, run_id: str) -> list[str]:
    """The run's events as they happen, until it completes or fails."""
    kinds = []
    async for event in client.events(follow=True):
        if event.subject == run_id:
            kinds.append(event.kind)
            if event.kind in ("run-completed", "run-failed"):
                return kinds
    return kinds


async def main_async(base: Path) -> int:
    spec = base / "swarm.toml"
    spec.write_text(SPEC)
    async with corral.AsyncClient.start(spec=spec, home=base / ".corral") as client:
        started = await client.run("writer", "Write the note", wait=False)
        # One client, three calls in flight at once (docs/extending.md, "Many tasks, one client").
        async with asyncio.TaskGroup() as group:
            waiting = group.create_task(client.wait(started.run_id, timeout=120, until_parked=False))
            following = group.create_task(follow(client, started.run_id))
            group.create_task(approve_when_pending(client, started.run_id))
        result = waiting.result().check()  # raises corral.RunFailed if the run failed
        print(f"run {result.run_id}: {result.status}; events: {', '.join(following.result())}")
        print(f"final reply: {result.final_reply}")
    print(f"file on disk: {(base / 'project' / 'notes.md').read_text().strip()}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to put the project and its home (default: a new temp dir)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="corral-async-")).absolute()
    (base / "project").mkdir(parents=True, exist_ok=True)
    return asyncio.run(main_async(base))


if __name__ == "__main__":
    raise SystemExit(main())
