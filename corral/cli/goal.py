"""``corral goal pause|resume|edit|clear|status RUN [TEXT]``: a goal run's lifecycle
(docs/interactive.md "Goal mode", seed 004 V1.18). ``corral run --goal TEXT``
starts one."""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli.main import EXIT_USAGE, CliError, arguments, command, emit_json, open_client
from corral.client import Client

_HELP = {
    "status": "the goal, its revision and lifecycle, the plan, the verdicts and what still blocks the final reply",
    "pause": "interrupt the provider turn in flight and park the run at its next safe boundary (no provider"
    " call while paused, across restarts too)",
    "resume": "a paused goal goes on, in the same run",
    "edit": "a new goal TEXT: bumps the revision and reaches the run as a steer (a verdict on an older"
    " revision no longer completes it)",
    "clear": "end the goal: its run is cancelled; conversations, runs and events are kept",
}


def _goal_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="goal_command", required=True, metavar="{status,pause,resume,edit,clear}")
    for name, text in _HELP.items():
        child = sub.add_parser(name, help=text, description=text)
        child.add_argument("run_id", metavar="RUN")
        if name == "edit":
            child.add_argument("text", metavar="TEXT", help="the new goal")
        child.add_argument("--json", action="store_true", help="machine-readable output")


def _call(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    command_name = args.goal_command
    if command_name == "status":
        return client.goal_status(args.run_id)
    if command_name == "pause":
        return client.goal_pause(args.run_id)
    if command_name == "resume":
        return client.goal_resume(args.run_id)
    if command_name == "edit":
        if not args.text.strip():
            raise CliError("the new goal TEXT is empty", EXIT_USAGE)
        return client.goal_edit(args.run_id, args.text)
    return client.goal_clear(args.run_id)


@command("goal", "goal mode: status, pause, resume, edit or clear a run's goal (corral run --goal starts one)")
@arguments(_goal_args)
def cmd_goal(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        shown = _call(client, args)
    if args.json:
        emit_json(shown)
    elif args.goal_command == "status":
        _print_status(shown)
    else:
        steer = f"; sent to the run as steer {shown['steer_id']}" if shown.get("steer_id") else ""
        print(f"goal of run {shown['run_id']}: {shown['status']}, revision {shown['revision']}{steer}")
    return 0


def _print_status(shown: dict[str, Any]) -> None:
    print(f"run {shown['run_id']} ({shown['status']})")
    lifecycle = shown.get("lifecycle")
    if lifecycle is None:
        print("  goal: (none: not a goal run)")
        return
    print(f"  goal ({lifecycle['status']}, revision {lifecycle['revision']}): {shown['goal']}")
    for refinement in shown["refinements"]:
        print(f"  refined by the user: {refinement['text']}")
    plan = shown["plan"]
    if plan["steps"]:
        print(f"  plan, revision {plan['revision']}:")
        for step in plan["steps"]:
            print(f"    [{step['status']}] {step['id']}: {step['text']}")
    for verdict in shown["verdicts"]:
        print(f"  verdict: {'met' if verdict['met'] else 'not met'} - {verdict['evidence']}"
              f" (goal revision {verdict['goal_revision']})")
    for blocker in shown["blockers"]:
        print(f"  still blocks the final reply: {blocker}")
