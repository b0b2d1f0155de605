"""``corral collaboration``: the project's collaboration policy (docs/project-context.md).

The only way to write ``.corral/collaboration-policy.json``: agents' file tools
refuse ``.corral/``. A run already bound keeps the snapshot it was bound to.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from corral.cli.main import EXIT_USAGE, CliError, arguments, command, emit_json, open_client


def _collaboration_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="collaboration_command", required=True)
    show = sub.add_parser("show", help="the live policy, its digest, and the runs bound to a snapshot")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    put = sub.add_parser("set", help="check a policy file and install it for the project")
    put.add_argument("file", help="a JSON policy (requiredInitialWave, minStaticDelegates, ...)")
    put.add_argument("--json", action="store_true", help="machine-readable output")


@command("collaboration", "the project's collaboration policy: show it, or set it (the only way to write it)")
@arguments(_collaboration_args)
def cmd_collaboration(args: argparse.Namespace) -> int:
    if args.collaboration_command == "set":
        from corral.supervisor.spec.bounded_files import FileReadError, read_text_bounded

        try:
            text = read_text_bounded(Path(args.file), "collaboration policy")
        except FileReadError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        with open_client(args) as client:
            reply: dict[str, Any] = client.call("collaboration.set", text=text)
        if args.json:
            emit_json(reply)
        else:
            print(f"collaboration policy set: {reply['path']} (sha256 {reply['digest'][:16]})")
        return 0
    with open_client(args) as client:
        shown: dict[str, Any] = client.call("collaboration.show")
    if args.json:
        emit_json(shown)
        return 0
    state = "set" if shown["exists"] else "not set: the safe defaults apply"
    print(f"{shown['path']}: {state}" + (f" (broken: {shown['problem']})" if shown["problem"] else ""))
    for key, value in sorted(shown["policy"].items()):
        print(f"  {key} = {value}")
    for binding in shown["bindings"]:
        print(f"  bound: {binding['run_id']} to {binding['digest'][:16]} at loop {binding['loop_index']}")
    return 0
