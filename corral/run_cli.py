"""CLI for runs: run, show, runs, pending, approve, deny, reconcile, resume, cancel."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from corral.cli import EXIT_FAILED, EXIT_USAGE, CliError, arguments, command, emit_json, print_table, rpc

WAIT_DONE = {"completed", "failed", "cancelled"}
WAIT_PARKED = {"waiting-confirmation", "needs-reconciliation"}


def _run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True, help="agent id from the swarm spec")
    parser.add_argument("--task", required=True, help="what the agent should do")
    parser.add_argument("--script", help="scripted-provider script (TOML/JSON) for this run")
    parser.add_argument("--wait", action="store_true", help="wait until the run ends or parks")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to --wait at most")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


@command("run", "start a run of an agent on a task")
@arguments(_run_args)
def cmd_run(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"agent_id": args.agent, "task": args.task}
    if args.script:
        try:
            params["script"] = Path(args.script).read_text()
        except OSError as exc:
            raise CliError(f"cannot read script {args.script}: {exc.strerror}", EXIT_USAGE) from None
    run_id = rpc(args, "run", **params)["run_id"]
    if not args.wait:
        if args.json:
            emit_json({"run_id": run_id})
        else:
            print(run_id)
        return 0
    shown = wait_for_run(args, run_id, args.timeout)
    if args.json:
        emit_json(shown)
    else:
        print_run(shown)
    return 0 if shown["run"]["status"] == "completed" else EXIT_FAILED


def wait_for_run(args: argparse.Namespace, run_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    cursor = 0
    while True:
        shown: dict[str, Any] = rpc(args, "show", run_id=run_id)
        if shown["run"]["status"] in WAIT_DONE | WAIT_PARKED:
            return shown
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CliError(f"run {run_id} still {shown['run']['status']} after {timeout}s")
        reply = rpc(args, "events", timeout=remaining + 5, since=cursor, wait_ms=int(min(remaining, 5) * 1000))
        cursor = reply["cursor"]


def print_run(shown: dict[str, Any]) -> None:
    run = shown["run"]
    print(f"run {run['run_id']}  agent {run['agent_id']}  {run['kind']}  status {run['status']}")
    if run.get("reason"):
        print(f"  reason: {run['reason']}")
    print(f"  task: {run['task'][:200]}")
    if shown["actions"]:
        rows = [[a["action_id"], str(a["loop_index"]), a["tool"], a["phase"], a["policy"]] for a in shown["actions"]]
        print_table(rows, ["ACTION", "LOOP", "TOOL", "PHASE", "POLICY"])
    for receipt in shown["receipts"]:
        print(f"  receipt {receipt['action_id']} {receipt['status']}: {receipt['result_summary']}")
    if shown.get("final_reply") is not None:
        print(f"final reply: {shown['final_reply']}")


def _show_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("--json", action="store_true")


@command("show", "show a run: actions, receipts, final reply")
@arguments(_show_args)
def cmd_show(args: argparse.Namespace) -> int:
    shown = rpc(args, "show", run_id=args.run_id)
    if args.json:
        emit_json(shown)
    else:
        print_run(shown)
    return 0


def _json_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")


@command("runs", "list recent runs")
@arguments(_json_only)
def cmd_runs(args: argparse.Namespace) -> int:
    runs = rpc(args, "runs")["runs"]
    if args.json:
        emit_json(runs)
        return 0
    print_table(
        [[r["run_id"], r["agent_id"], r["kind"], r["status"], (r["reason"] or "")[:60]] for r in runs],
        ["RUN", "AGENT", "KIND", "STATUS", "REASON"],
    )
    return 0


@command("pending", "list what waits for a person: confirmations, reconciliations, retries")
@arguments(_json_only)
def cmd_pending(args: argparse.Namespace) -> int:
    pending = rpc(args, "pending")
    if args.json:
        emit_json(pending)
        return 0
    if not any(pending.get(key) for key in ("actions", "provider_requests", "provider_retries", "sessions")):
        print("nothing pending")
        return 0
    for action in pending["actions"]:
        verb = "approve/deny" if action["phase"] == "waiting-confirmation" else "reconcile"
        print(f"{action['action_id']}  {action['phase']}  {action['input_summary']}  run {action['run_id']}  ({verb})")
        if action["reason"]:
            print(f"    {action['reason']}")
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
    return 0


def _decision_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action_id", metavar="ACTION_ID")
    parser.add_argument("--fingerprint", help="expected fingerprint (default: the one shown by `corral pending`)")


def _decide(args: argparse.Namespace, decision: str) -> int:
    fingerprint = args.fingerprint
    if fingerprint is None:
        waiting = {a["action_id"]: a for a in rpc(args, "pending")["actions"]}
        if args.action_id not in waiting:
            raise CliError(f"action {args.action_id} is not waiting for confirmation (see `corral pending`)")
        fingerprint = waiting[args.action_id]["fingerprint"]
    result = rpc(args, "continue_action", action_id=args.action_id, decision=decision, fingerprint=fingerprint)
    print(f"{decision}d {args.action_id} (run {result['run_id']})")
    return 0


@command("approve", "approve an action waiting for confirmation")
@arguments(_decision_args)
def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args, "approve")


@command("deny", "deny an action waiting for confirmation")
@arguments(_decision_args)
def cmd_deny(args: argparse.Namespace) -> int:
    return _decide(args, "deny")


def _reconcile_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action_id", metavar="ACTION_ID", help="an action id, a provider request slot, or a process id (proc-...)"
    )
    parser.add_argument("--as", dest="outcome", choices=["ok", "failed"], required=True, help="what really happened")
    parser.add_argument("--note", required=True, help="what you checked")


@command("reconcile", "resolve an action whose outcome is unknown")
@arguments(_reconcile_args)
def cmd_reconcile(args: argparse.Namespace) -> int:
    result = rpc(args, "reconcile", action_id=args.action_id, outcome=args.outcome, note=args.note)
    print(f"reconciled {args.action_id} as {args.outcome} (run {result['run_id']})")
    return 0


def _run_id_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")


@command("cancel", "cancel a run (and tombstone its live children)")
@arguments(_run_id_arg)
def cmd_cancel(args: argparse.Namespace) -> int:
    rpc(args, "cancel", run_id=args.run_id)
    print(f"cancelled {args.run_id}")
    return 0


@command("resume", "re-check a parked run and continue it if nothing blocks it")
@arguments(_run_id_arg)
def cmd_resume(args: argparse.Namespace) -> int:
    print(json.dumps(rpc(args, "resume", run_id=args.run_id)))
    return 0
