"""Drive a corral swarm from Python: start a supervisor, run an agent, wait, print
the reply. Runs on the built-in scripted provider: no model, no API key.

    python examples/python_api.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import corral

SPEC = """
name = "python-api-example"

[project]
root = "project"

# Writing files asks a person by default; this example lets its one write run.
[policy]
"fs.write" = "auto"

[[agents]]
id = "writer"
write_scopes = ["notes"]

  # The scripted provider plays the model: one step per loop of the run.
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "notes/hello.md", content = "# Hello from corral\\n" } }]

  [[agents.steps]]
  final = "Wrote notes/hello.md"
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to put the project and its home (default: a new temp dir)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="corral-api-")).absolute()
    (base / "project").mkdir(parents=True, exist_ok=True)
    spec = base / "swarm.toml"
    spec.write_text(SPEC)

    # The supervisor lives as long as this block: it stops (gracefully) on exit.
    with corral.Client.start(spec=spec, home=base / ".corral") as client:
        result = client.run("writer", "Write a hello note", timeout=60)
        print(f"run {result.run_id}: {result.status}")
        for action in result.actions:
            print(f"  action {action.tool:<10} {action.phase}")
        print(f"final reply: {result.final_reply}")
        result.check()  # raises corral.RunFailed if the run failed
    print(f"file on disk: {(base / 'project' / 'notes' / 'hello.md').read_text().strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
