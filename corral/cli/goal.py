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
    "edit": "a new goal TEXT, constraints or verification list: bumps the revision, blocks the actions made"
    " for the old goal that have not started (waiting for approval or approved), and reaches the run as a steer"
    " (a verdict on an older revision no longer completes it)",
    "clear": "end the goal: its run is cancelled; conversations, runs and events are kept",
}


def _goal_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="goal_command", required=True, metavar="{status,pause,resume,edit,clear}")
    for name, text in _HELP.items():
        child = sub.add_parser(name, help=text, description=text)
        child.add_argument("run_id", metavar="RUN")
        if name == "edit":
            child.add_argument("text", metavar="TEXT", nargs="?", help="the new goal (left out: kept)")
            child.add_argument("--constraint", action="append", metavar="TEXT",
                               help="the goal's constraints become these (repeat; at most 8; left out: kept)")
            child.add_argument("--verify", action="append", metavar="TEXT",
                               help="what shows the goal is met becomes these (repeat; at most 8; left out: kept)")
            child.add_argument("--clear-constraints", action="store_true", help="the goal keeps no constraints")
            child.add_argument("--clear-verify", action="store_true",
                               help="the goal keeps no verification list (the goal itself is the standard)")
            child.add_argument("--expected-revision", type=int, metavar="N",
                               help="refuse the edit unless the goal is still at revision N")
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
        if args.text is not None and not args.text.strip():
            raise CliError("the new goal TEXT is empty", EXIT_USAGE)
        if (args.constraint and args.clear_constraints) or (args.verify and args.clear_verify):
            raise CliError("--clear-constraints goes without --constraint, --clear-verify without --verify",
                           EXIT_USAGE)
        constraints = [] if args.clear_constraints else args.constraint
        verification = [] if args.clear_verify else args.verify
        if args.text is None and constraints is None and verification is None:
            raise CliError("give the new goal TEXT, --constraint, --verify or a --clear- option", EXIT_USAGE)
        return client.goal_edit(args.run_id, args.text, constraints=constraints, verification=verification,
                                expected_revision=args.expected_revision)
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
        for action_id in shown.get("blocked") or []:
            print(f"  blocked (made for the old goal, never run): {action_id}")
    return 0


def _print_status(shown: dict[str, Any]) -> None:
    print(f"run {shown['run_id']} ({shown['status']})")
    lifecycle = shown.get("lifecycle")
    if lifecycle is None:
        print("  goal: (none: not a goal run)")
        return
    print(f"  goal ({lifecycle['status']}, revision {lifecycle['revision']}): {shown['goal']}")
    for item in lifecycle.get("constraints") or []:
        print(f"  constraint: {item}")
    for item in lifecycle.get("verification") or []:
        print(f"  verification: {item}")
    completion = lifecycle.get("completion")
    if completion:
        print(f"  completed from the run's finalization: goal revision {completion.get('goal_revision')},"
              f" plan revision {completion.get('plan_revision')}, verification {completion.get('verification_id')},"
              f" reply sha256 {str(completion.get('response_sha256'))[:12]}")
    for refinement in shown["refinements"]:
        print(f"  refined by the user: {refinement['text']}")
    plan = shown["plan"]
    if plan["steps"]:
        print(f"  plan, revision {plan['revision']}: {plan['explanation']}")
        for step in plan["steps"]:
            print(f"    [{step['status']}] {step['step']}")
    for verdict in shown["verdicts"]:
        print(f"  verdict: {'met' if verdict['met'] else 'not met'} - {verdict['evidence']}"
              f" (goal revision {verdict['goal_revision']})")
    for blocker in shown["blockers"]:
        print(f"  still blocks the final reply: {blocker}")
