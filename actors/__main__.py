"""``python -m corral.actors --boot-fd N``: the exec launch mode's entry point."""

from __future__ import annotations

import argparse
import os
import sys

import msgpack

from corral.sandbox import child_setup


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m corral.actors")
    parser.add_argument("--boot-fd", type=int, required=True, help="pipe with the boot config")
    args = parser.parse_args()
    with os.fdopen(args.boot_fd, "rb") as pipe:
        boot = msgpack.unpackb(pipe.read(), raw=False)
    child_setup.become_actor(boot["actor_id"], boot["parent"], dict(os.environ))
    child_setup.apply_rlimits(boot.get("rlimits", {}))
    from corral.actors.runtime import actor_main

    return actor_main(boot["config"], boot["token"])


if __name__ == "__main__":
    sys.exit(main())
