"""CLI for actors: ``corral ask ACTOR MESSAGE`` (a request to any actor, user
templates included)."""

from __future__ import annotations

import argparse

from corral.cli.main import EXIT_USAGE, CliError, arguments, command, emit_json, json_object_arg, open_client


def _ask_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("actor_id", metavar="ACTOR", help="actor id (see `corral status`)")
    parser.add_argument("message", metavar="MESSAGE", help='a JSON object, e.g. \'{"op": "add", "n": 2}\'')
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer")


@command("ask", "send a request to an actor and print its reply (JSON)")
@arguments(_ask_args)
def cmd_ask(args: argparse.Namespace) -> int:
    message = json_object_arg(args.message, "MESSAGE")
    if not 0 < args.timeout <= 3600:
        raise CliError("--timeout must be within (0, 3600] seconds", EXIT_USAGE)
    with open_client(args) as client:
        emit_json(client.ask(args.actor_id, message, timeout=args.timeout))
    return 0
