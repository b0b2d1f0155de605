"""Run the multi-agent example: a root agent, two specialists and two isolated
children, then print who did what. docs/swarm.md explains it step by step.

    python examples/multi_agent/run.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import corral

HERE = Path(__file__).resolve().parent


def _paths(result: dict[str, Any]) -> str:
    return ", ".join(artifact["path"] for artifact in result.get("artifacts", []))


def report(result: corral.RunResult) -> None:
    """The root's actions, then its specialists, children and claims, as the ledger holds them."""
    print(f"run {result.run_id}: {result.status}")
    for action in result.actions:
        print(f"  loop {action.loop_index}  {action.tool:<20} {action.phase}")
    swarm = result.raw["swarm"]
    print("specialists (agent.delegate):")
    for delegation in swarm["delegations"]:
        outcome = delegation["result"] or {}
        print(f"  {delegation['target_agent']:<10} {outcome.get('status', '-'):<15} {_paths(outcome)}")
    for group in swarm["groups"]:
        print(f"isolated children (agent.spawn_isolated), group {group['status']}:")
        for child in group["children"]:
            outcome = child["result"] or {}
            status = outcome.get("status", "-")
            print(f"  {child['instance_id']:<19} {child['template']:<11} {status:<4} {_paths(outcome)}")
    claims = swarm["claims"]
    phases = ", ".join(sorted({claim["phase"] for claim in claims}))
    print(f"deliveries claimed: {len(swarm['deliveries'])} in {len(claims)} claim(s), {phases}")
    print(f"final reply: {result.final_reply}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to put the project and its home (default: a new temp dir)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="corral-swarm-")).absolute()
    (base / "project").mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "swarm.toml", base / "swarm.toml")

    # The supervisor lives as long as this block; the specialists and the children
    # are its processes, started on demand and stopped with it.
    with corral.Client.start(spec=base / "swarm.toml", home=base / ".corral") as client:
        result = client.run("editor", "Prepare release 2.0", timeout=60)
        report(result)
        result.check()  # raises corral.RunFailed if the run failed
    print("files:", ", ".join(sorted(str(p.relative_to(base / "project")) for p in (base / "project").rglob("*.md"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
