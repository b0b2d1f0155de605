"""Start the custom-actor swarm, talk to the counter, SIGKILL it, and watch the
supervisor restart it with its state intact.

    python examples/custom_actor/drive.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import corral

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to put the home and the counter's state (default: a new temp dir)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="corral-actor-")).absolute()
    base.mkdir(parents=True, exist_ok=True)
    # The example spec with the state file moved into this run's directory.
    spec = HERE / "swarm.toml"
    local = base / "swarm.toml"
    local.write_text(spec.read_text().replace("/tmp/corral-counter-example.txt", str(base / "total.txt")))
    (base / "counter.py").write_text((HERE / "counter.py").read_text())

    with corral.Client.start(spec=local, home=base / ".corral") as client:
        first = client.ask("counter", {"op": "add", "n": 2})
        first = client.ask("counter", {"op": "add", "n": 3})
        print(f"total {first['total']} from pid {first['pid']} (incarnation {first['incarnation']})")

        os.kill(first["pid"], signal.SIGKILL)
        print(f"SIGKILL pid {first['pid']}")
        deadline = time.monotonic() + 30
        while True:  # wait for the restart: the supervisor re-launches it by policy
            status = client.status()
            actor = next(a for a in status["actors"] if a["id"] == "counter")
            if actor["status"] == "running" and actor["incarnation"] == 2:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"counter did not restart: {actor}")
            next(client.events(status["cursor"], follow=True))  # returns when something happened
        second = client.ask("counter", {"op": "add", "n": 1})
        print(f"total {second['total']} from pid {second['pid']} (incarnation {second['incarnation']})")
        print(f"restarts: {actor['restarts']}")
    return 0 if second["total"] == 6 and second["incarnation"] == 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
