"""Run the custom-tools example end to end and print what happened.

    python examples/custom_tools/run.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import corral

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to put the project and its home (default: a new temp dir)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="corral-tools-")).absolute()
    base.mkdir(parents=True, exist_ok=True)
    for name in ("swarm.toml", "script.toml", "tools.py"):
        shutil.copy(HERE / name, base / name)
    (base / "project").mkdir(exist_ok=True)
    with corral.Client.start(spec=base / "swarm.toml", home=base / ".corral") as client:
        result = client.run("buyer", "Restock whatever is out of stock", timeout=60)
        print(f"run {result.run_id}: {result.status}")
        for action in result.actions:
            print(f"  {action.tool:<13} {action.phase:<7} {action.error or ''}".rstrip())
        print(f"final reply: {result.final_reply}")
        result.check()
    print(f"orders: {(base / 'project' / 'orders.jsonl').read_text().count(chr(10))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
