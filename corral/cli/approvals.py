"""CLI for what waits for a person: pending, approve (``--show`` to see it first), deny.

Every command shows an action through the one approval view
(supervisor/runs/approval_view.py, laid out by corral/approval_text.py): the
real argument values with only secret-looking substrings masked, the effect
class, policy, reason, the fingerprint the approval is bound to, and a file
tool's diff against the current file. Long values are paged; ``--json`` gives
them whole.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from corral import approval_text
from corral.cli.main import EXIT_USAGE, CliError, arguments, command, emit_json, json_arg, open_client
from corral.client import Client
from corral.question_text import render_question

#: What ``pending`` lists that is not an action waiting for a person.
_OTHER_PENDING = ("provider_requests", "provider_retries", "sessions", "questions")


@command("pending", "list what waits for a person: confirmations (with what they approve), reconciliations, retries")
@arguments(json_arg)
def cmd_pending(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        pending = client.pending().raw
        if args.json:
            # The full values: every page of every action's view, joined.
            for action in pending["actions"]:
                action["approval"] = client.approval(action["action_id"], all_pages=True).raw
    if args.json:
        emit_json(pending)
        return 0
    if not pending["actions"] and not any(pending.get(key) for key in _OTHER_PENDING) and not any(
        run["status"] == "needs-input" for run in pending.get("runs", [])
    ):
        print("nothing pending")
        return 0
    for action in pending["actions"]:
        verb = "approve/deny" if action["phase"] == "waiting-confirmation" else "reconcile"
        print(f"{action['action_id']}  {action['phase']}  {action['input_summary']}  run {action['run_id']}  ({verb})")
        if action["reason"]:
            print(f"    {approval_text.printable(action['reason'])}")
        if action.get("approval") is not None:
            print("\n".join(approval_text.render(action["approval"], preview=True)))
        else:
            print(f"    see `{approval_text.show_command(action['action_id'], 1)}`")
    _print_other(pending)
    return 0


def _print_other(pending: dict[str, Any]) -> None:
    asked = {question["run_id"] for question in pending.get("questions", [])}
    for run in pending.get("runs", []):
        if run["status"] == "needs-input" and run["run_id"] not in asked:
            print(f"{run['run_id']}  needs-input  {run['reason'] or ''}")
    for question in pending.get("questions", []):
        print("\n".join(render_question(question)))
    for request in pending["provider_requests"]:
        print(f"{request['slot']}  provider request needs-reconciliation  run {request['run_id']}  (reconcile)")
    for session in pending.get("sessions", []):
        print(f"{session['process_id']}  process session needs-reconciliation  run {session['run_id']}  (reconcile)")
        if session["reason"]:
            print(f"    {session['reason']}")
    for retry in pending["provider_retries"]:
        print(
            f"{retry['slot']}  waiting-for-provider-retry attempt {retry['attempt']}"
            f" at {time.strftime('%H:%M:%S', time.localtime(retry['retry_at']))}  run {retry['run_id']}"
        )


def _decision_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action_id", metavar="ACTION_ID")
    parser.add_argument(
        "--fingerprint",
        help="approve only if the action has this fingerprint (the one `corral pending` and --show print);"
        " default: the action's own",
    )


def _approve_args(parser: argparse.ArgumentParser) -> None:
    _decision_args(parser)
    parser.add_argument(
        "--show",
        action="store_true",
        help="show what approving would approve (arguments, effect, policy, diff, fingerprint); approve nothing",
    )
    parser.add_argument("--page", type=int, default=1, help="with --show: page N of long values (default: 1)")
    parser.add_argument("--all", action="store_true", help="with --show: every value whole, all pages")
    parser.add_argument("--json", action="store_true", help="with --show: the view as JSON, every value whole")


def _decide(args: argparse.Namespace, decision: str) -> int:
    with open_client(args) as client:
        if decision == "approve":
            result = client.approve(args.action_id, fingerprint=args.fingerprint)
        else:
            result = client.deny(args.action_id, fingerprint=args.fingerprint)
    print(f"{'approved' if decision == 'approve' else 'denied'} {args.action_id} (run {result['run_id']})")
    return 0


@command("approve", "approve an action waiting for confirmation (--show: see what it approves, approve nothing)")
@arguments(_approve_args)
def cmd_approve(args: argparse.Namespace) -> int:
    if not args.show:
        if args.all or args.json or args.page != 1:
            raise CliError("--page, --all and --json go with --show (which approves nothing)", EXIT_USAGE)
        return _decide(args, "approve")
    if args.page < 1:
        raise CliError("--page must be 1 or more", EXIT_USAGE)
    with open_client(args) as client:
        return _show(client, args)


def _show(client: Client, args: argparse.Namespace) -> int:
    whole = args.all or args.json
    view = client.approval(args.action_id, page=1 if whole else args.page, all_pages=whole)
    if args.json:
        emit_json(view.raw)
        return 0
    if args.page > view.pages:
        raise CliError(f"{args.action_id} has {view.pages} page(s) of values; --page {args.page} shows nothing",
                       EXIT_USAGE)
    print(f"{view.action_id}  {view.phase}" + (f"  (page {args.page} of {view.pages})" if view.pages > 1 else ""))
    if view.reason:
        print(f"    {approval_text.printable(view.reason)}")
    print("\n".join(approval_text.render(view.raw, preview=False)))
    if view.phase == "waiting-confirmation":
        print(f"approve exactly this: corral approve {view.action_id} --fingerprint {view.fingerprint}")
    return 0


@command("deny", "deny an action waiting for confirmation")
@arguments(_decision_args)
def cmd_deny(args: argparse.Namespace) -> int:
    return _decide(args, "deny")
