"""CLI for runs: run, show, runs, reconcile, resume, cancel (pending, approve and deny:
corral/cli/approvals.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from corral.cli.main import (
    EXIT_FAILED,
    EXIT_USAGE,
    CliError,
    arguments,
    command,
    emit_json,
    json_arg,
    open_client,
    open_reader,
    print_table,
    say_where_read,
)
from corral.client_types import DONE, PARKED
from corral.question_text import answer_command, render_question

WAIT_DONE = set(DONE)
WAIT_PARKED = set(PARKED)


def _run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True, help="agent id from the swarm spec")
    parser.add_argument("--task", default="", help="what the agent should do (with --goal: the goal, if left out)")
    parser.add_argument("--goal", help="bind the run to a goal: it ends only on a verdict that the goal is met"
                        " (docs/long-tasks.md)")
    parser.add_argument("--constraint", action="append", default=[], metavar="TEXT",
                        help="with --goal: a constraint of the goal (repeat; at most 8)")
    parser.add_argument("--verify", action="append", default=[], metavar="TEXT",
                        help="with --goal: what shows the goal is met (repeat; at most 8; none: the goal itself)")
    parser.add_argument("--script", help="scripted-provider script (TOML/JSON) for this run")
    parser.add_argument("--intent", help="bind the run to an intent contract (JSON file; see docs/intent.md)")
    parser.add_argument("--idempotency-key", metavar="KEY",
                        help="your key for this run: given again (to any node of a cluster, or with --ledger), it"
                        " answers the same run, never a second one")
    parser.add_argument("--run-id", metavar="RUN", help="the run's id (run-<6..40 of a-z, 0-9, ->); default: a new one")
    parser.add_argument("--wait", action="store_true", help="wait until the run ends or parks")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to --wait at most")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--quiet", action="store_true", help="with --wait: no live status line (state, step, tool,"
                        " tokens/s, children) and no state-change lines on stderr while waiting; the run id and"
                        " what waits for a person are still said")


@command("run", "start a run of an agent on a task")
@arguments(_run_args)
def cmd_run(args: argparse.Namespace) -> int:
    script = None
    if args.script:
        from corral.supervisor.spec.bounded_files import FileReadError, read_text_bounded

        try:
            script = read_text_bounded(Path(args.script), "script")
        except FileReadError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    intent = read_contract(args.intent) if args.intent else None
    if not args.task and not args.goal:
        raise CliError("give --task, or --goal (a goal is also the first task)", EXIT_USAGE)
    if (args.constraint or args.verify) and not args.goal:
        raise CliError("--constraint and --verify go with --goal", EXIT_USAGE)
    if args.run_id and args.idempotency_key:
        raise CliError("give --run-id or --idempotency-key, not both", EXIT_USAGE)
    if args.idempotency_key is not None and not 1 <= len(args.idempotency_key) <= 500:
        raise CliError("--idempotency-key is 1 to 500 characters", EXIT_USAGE)
    ids = {"run_id": args.run_id, "idempotency_key": args.idempotency_key}
    goal = args.goal if args.goal is None or not (args.constraint or args.verify) else {
        "text": args.goal, "constraints": args.constraint, "verification": args.verify}
    # A person at a terminal sees the run move (on stderr: stdout stays the result);
    # elsewhere, the run id at once and one line per state change (corral/cli/run_watch.py).
    live = args.wait and not args.json and not args.quiet and sys.stderr.isatty()
    with open_client(args) as client:
        if args.wait and client.ledger_url is not None:
            # From a host with no node: no event stream to follow; the run id at
            # once, then the run as it ends or parks, wherever a node runs it.
            started = client.run(args.agent, args.task, script=script, wait=False, intent=intent, goal=goal, **ids)
            print(f"corral run: {started.run_id} queued in the cluster at {client.ledger_url} (agent {args.agent});"
                  f" waiting up to {args.timeout:g} s for it to end or to wait for a person", file=sys.stderr,
                  flush=True)
            result = client.wait(started.run_id, timeout=args.timeout)
        elif args.wait:
            from corral.cli import progress, run_watch

            since = progress.start_cursor(client)
            started = client.run(args.agent, args.task, script=script, wait=False, intent=intent, goal=goal, **ids)
            warn_intent(started.raw)
            if live:
                result = progress.watch_run(client, started.run_id, since, args.timeout, progress.stderr_console())
            else:
                print(f"corral run: {started.run_id} started (agent {args.agent}); waiting up to {args.timeout:g} s"
                      " for it to end or to wait for a person", file=sys.stderr, flush=True)
                result = run_watch.follow_run(client, started.run_id, since, args.timeout, sys.stderr,
                                              states=not args.quiet)
        else:
            result = client.run(
                args.agent, args.task, script=script, wait=args.wait, timeout=args.timeout, intent=intent,
                goal=goal, **ids,
            )
    if not args.wait:
        if args.json:
            emit_json({"run_id": result.run_id})
        else:
            print(result.run_id)
        warn_intent(result.raw)
        return 0
    shown = result.raw
    if args.json:
        emit_json(shown)
    else:
        print_run(shown)
    return 0 if shown["run"]["status"] == "completed" else EXIT_FAILED


def warn_intent(started: dict[str, Any]) -> None:
    """On stderr (stdout stays the run id or the JSON): a contract that did not bind,
    and why, since its guard then enforces nothing for this run; and scope entries
    that limit nothing."""
    intent = started.get("intent") or {}
    if intent.get("status") == "unbound":
        print(f"corral run: intent warning: the contract did not bind ({intent.get('reason', '')}); its guard is"
              " advisory for this run: nothing in it is enforced (path: excludes included); fix the contract"
              " and start a new run, or bind this one with corral intent update", file=sys.stderr)
    for warning in intent.get("scope_warnings") or []:
        print(f"corral run: intent warning: {warning}", file=sys.stderr)


def read_contract(path: str) -> str:
    """A contract file's text, read within the size limit. A missing or unreadable
    file, or text the strict JSON reader refuses (not JSON, a duplicate key, nested
    too deeply, ...), is a usage error and nothing is sent. The supervisor judges the
    rest: a contract that parses but cannot bind (a bad hash, an unsafe number, a
    schema fault, ...) starts the run unbound and advisory, and ``warn_intent`` says so."""
    from corral.core import strict_json
    from corral.supervisor.spec.bounded_files import FileReadError, read_text_bounded

    try:
        text = read_text_bounded(Path(path), "intent contract")
    except FileReadError as exc:
        raise CliError(f"intent contract {path}: {exc}", EXIT_USAGE) from None
    try:
        strict_json.loads(text)
    except strict_json.StrictJsonError as exc:
        raise CliError(f"intent contract {path}: {exc.code}: {exc.message}; nothing was sent to the"
                       " supervisor (no run was started)", EXIT_USAGE) from None
    return text


def wait_for_run(args: argparse.Namespace, run_id: str, timeout: float) -> dict[str, Any]:
    with open_client(args) as client:
        return client.wait(run_id, timeout=timeout).raw


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
    for action in shown["actions"]:
        if action.get("traceback"):  # a tool that raised: where, in the user's frames
            print(f"  action {action['action_id']} ({action['tool']}) raised:")
            for line in str(action["traceback"]).splitlines():
                print(f"    {line}")
    denied = sorted(tool for tool, mode in (shown.get("policy") or {}).items() if mode == "deny")
    if denied:  # the effective policy's refusals (a child's bound, seed 004 V1.34)
        print(f"  denied tools: {', '.join(denied)}")
    intent = shown.get("intent") or {}
    if intent.get("status") == "bound":
        inherited = f", inherited from {intent['inherited_from']}" if intent.get("inherited_from") else ""
        print(f"  intent: bound to {intent['contract_ref']} v{intent['contract_version']}"
              f" ({intent['receipts']} decision receipts{inherited})")
    elif intent.get("status") == "unbound":
        print(f"  intent: unbound ({intent.get('reason', '')}); the guard is advisory"
              f" ({intent.get('receipts', 0)} decision receipts)")
    for warning in intent.get("scope_warnings") or []:
        print(f"  intent warning: {warning}")
    project = shown.get("project") or {}
    if project.get("changed_at_revision") is not None:
        verification = project.get("verification") or {}
        verified = (f"verification {verification['status']} at revision {verification['revision']}"
                    if verification else "not verified")
        print(f"  project: changed sources (last at revision {project['changed_at_revision']}); now at revision"
              f" {project['revision']}, {verified}")
    if project.get("final_blocked"):
        print(f"  final reply blocked: {project['final_blocked']}")
    usage = shown.get("usage") or {}
    if usage.get("requests"):
        tokens = f", {usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens"
        tokens = tokens if usage["prompt_tokens"] or usage["completion_tokens"] else ""
        model = f", model time {usage['model_ms'] / 1000:.2f}s" if usage.get("model_ms") else ""
        print(f"  provider: {usage['requests']} answers, {usage['format_repairs']} format repairs{tokens}{model}")
    if shown.get("repair_histogram"):
        from corral.supervisor.runs.repair_histogram import line as repair_line

        print(f"  {repair_line(shown['repair_histogram'])}")
    if shown.get("final_reply") is not None:
        print(f"final reply: {shown['final_reply']}")


def _show_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("--json", action="store_true")


@command("show", "show a run: actions, receipts, final reply")
@arguments(_show_args)
def cmd_show(args: argparse.Namespace) -> int:
    with open_reader(args) as client:
        shown = client.show(args.run_id).raw
        say_where_read(client, args)
    if args.json:
        emit_json(shown)
    else:
        print_run(shown)
    return 0



@command("runs", "list recent runs")
@arguments(json_arg)
def cmd_runs(args: argparse.Namespace) -> int:
    with open_reader(args) as client:
        runs = client.runs()
        say_where_read(client, args)
    if args.json:
        emit_json(runs)
        return 0
    print_table(
        [[r["run_id"], r["agent_id"], r["kind"], r["status"], (r["reason"] or "")[:60]] for r in runs],
        ["RUN", "AGENT", "KIND", "STATUS", "REASON"],
    )
    return 0


def _reconcile_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action_id", metavar="ACTION_ID", help="an action id, a provider request slot, or a process id (proc-...)"
    )
    parser.add_argument("--as", dest="outcome", choices=["ok", "failed"], required=True, help="what really happened")
    parser.add_argument("--note", required=True, help="what you checked")


@command("reconcile", "resolve an action whose outcome is unknown")
@arguments(_reconcile_args)
def cmd_reconcile(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        result = client.reconcile(args.action_id, args.outcome, args.note)
    print(f"reconciled {args.action_id} as {args.outcome} (run {result['run_id']})")
    return 0


def _wait_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait at most (default: 300)")
    parser.add_argument("--done", action="store_true",
                        help="wait until it ends, not only until it waits for a person")
    json_arg(parser)


@command("wait", "wait until a run ends or waits for a person, and show it (exit 0: it completed)")
@arguments(_wait_args)
def cmd_wait(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        shown = client.wait(args.run_id, timeout=args.timeout, until_parked=not args.done).raw
    if args.json:
        emit_json(shown)
    else:
        print_run(shown)
    return 0 if shown["run"]["status"] == "completed" else EXIT_FAILED


def _run_id_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")


@command("cancel", "cancel a run (and tombstone its live children)")
@arguments(_run_id_arg)
def cmd_cancel(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.cancel(args.run_id)
    print(f"cancelled {args.run_id}")
    return 0


@command("resume", "re-check a parked run and continue it if nothing blocks it")
@arguments(_run_id_arg)
def cmd_resume(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        print(json.dumps(client.resume(args.run_id)))
    return 0


def _steer_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")
    # Kept only to refuse it by name: an instruction on the command line shows in the
    # process list, and seed 004 V1.13 reads the text from stdin only.
    parser.add_argument("text", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--stdin", action="store_true",
                        help="read the instruction from stdin (the only way: it never shows in the process list)")
    json_arg(parser)
    parser.add_argument("--steer-id", metavar="ID",
                        help="your id for this steer: sent again (a retry), it records nothing new")


def _steer_text(args: argparse.Namespace) -> str:
    if args.text is not None:
        raise CliError(
            "the instruction is read only from stdin, never from the command line (it would show in the process"
            " list): printf '%s' TEXT | corral steer RUN --stdin", EXIT_USAGE)
    if not args.stdin:
        raise CliError("the instruction is read from stdin: printf '%s' TEXT | corral steer RUN --stdin", EXIT_USAGE)
    # One instruction, as piped: only the final newline a shell adds is not part of it.
    text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text


@command(
    "steer",
    "add an instruction (at most 4 KiB) to a live root run: a provider turn in flight is interrupted, a stale"
    " plan discarded; an action waiting for approval or under way is kept and the steer applies after its receipt",
)
@arguments(_steer_args)
def cmd_steer(args: argparse.Namespace) -> int:
    text = _steer_text(args)
    with open_client(args) as client:
        result = client.steer(args.run_id, text, steer_id=args.steer_id)
    if args.json:
        emit_json(result)
    else:
        print(f"steer {result['steer_id']} recorded for run {result['run_id']} ({result['status']})")
    return 0


def _answer_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("text", metavar="TEXT", nargs="?",
                        help="the answer to a one-question request (an option's label, or free text if allowed)")
    parser.add_argument("--request", metavar="REQ",
                        help="the request id (req-...) `corral pending` shows; without it, at a terminal, the run's"
                        " one open question is shown and you are asked to confirm")
    parser.add_argument("--response-id", metavar="ID",
                        help="your id for this response: sending it again changes nothing (default: one derived"
                        " from the request and the answers)")
    parser.add_argument("--answer", metavar="QID=LABEL", action="append", default=[],
                        help="the answer to question QID (repeat for each question)")
    json_arg(parser)


def _answers(pairs: list[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    answers: dict[str, str] = {}
    for pair in pairs:
        qid, sep, label = pair.partition("=")
        if not sep or not qid or not label:
            raise CliError(f"--answer takes QID=LABEL, not {pair!r}", EXIT_USAGE)
        if qid in answers:
            raise CliError(f"question {qid} is answered twice", EXIT_USAGE)
        answers[qid] = label
    return answers


@command("answer", "answer a run's structured question (user.input_request): --request REQ, then"
         " --answer QID=LABEL per question (or TEXT for one); once only")
@arguments(_answer_args)
def cmd_answer(args: argparse.Namespace) -> int:
    answers = _answers(args.answer)
    if (answers is None) == (args.text is None):
        raise CliError("give either TEXT (a one-question request) or --answer QID=LABEL for each question",
                       EXIT_USAGE)
    with open_client(args) as client:
        request_id = args.request or _named_request(client, args.run_id)
        result = client.answer(args.run_id, args.text, request_id=request_id, response_id=args.response_id,
                               answers=answers)
    if args.json:
        emit_json(result)
    else:
        again = " (this response was already recorded)" if result.get("repeated") else ""
        print(f"answered run {result['run_id']} request {result['request_id']}"
              f" (action {result['action_id']}, response {result['response_id']}){again}")
    return 0


def _named_request(client: Any, run_id: str) -> str:
    """The request an answer without ``--request`` is for: the run's one open
    question, only once the person has seen it and said so at a terminal (seed 004
    V1.23: an answer names its request; it is never matched to whatever is open, so
    a repeated command cannot answer the next question). Else refused, naming it."""
    asked = [q for q in client.pending().raw.get("questions", []) if q["run_id"] == run_id]
    if not asked:
        raise CliError(f"run {run_id} has no open question; name the request you answer: --request REQ")
    if len(asked) > 1 or not (sys.stdin.isatty() and sys.stdout.isatty()):
        named = " or ".join(str(q["request_id"]) for q in asked)
        raise CliError(f"name the request you answer: --request {named} (run {run_id} waits for it; `corral"
                       f" pending` shows the question), e.g. {answer_command(asked[0])}", EXIT_USAGE)
    print("\n".join(render_question(asked[0])))
    if input(f"answer request {asked[0]['request_id']}? [y/N] ").strip().lower() not in ("y", "yes"):
        raise CliError("nothing was answered")
    return str(asked[0]["request_id"])


def _fork_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("conversation_id", metavar="CONVERSATION", help="a chat session id (conv-...)")
    json_arg(parser)


@command("fork", "start a new chat session holding a session's turns as persisted now")
@arguments(_fork_args)
def cmd_fork(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        result = client.call("conversation.fork", conversation_id=args.conversation_id)
    if args.json:
        emit_json(result)
    else:
        print(f"{result['conversation_id']} (forked from {result['forked_from']} with {result['turns']} turns)")
    return 0


def _intent_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["receipts", "snapshot", "contract", "update"], help="what to do")
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("--file", help="with update: the new contract (a higher version)")
    json_arg(parser)


@command("intent", "a run's intent contract: decision receipts, continuity snapshot, the contract, update"
         " (docs/intent.md)")
@arguments(_intent_args)
def cmd_intent(args: argparse.Namespace) -> int:
    if args.what == "update" and not args.file:
        raise CliError("intent update needs --file CONTRACT", EXIT_USAGE)
    if args.what == "receipts":
        with open_reader(args) as reader:
            result = reader.intent_receipts(args.run_id)
            say_where_read(reader, args)
    else:
        with open_client(args) as client:
            if args.what == "snapshot":
                result = client.call("intent.snapshot", run_id=args.run_id)
            elif args.what == "contract":
                result = client.call("intent.contract", run_id=args.run_id)
            else:
                result = client.call("intent.update", run_id=args.run_id, contract=read_contract(args.file))
    if args.what == "contract" and not args.json:
        emit_json(result["contract"])
    elif args.json or args.what == "snapshot":
        emit_json(result)
    elif args.what == "receipts":
        for receipt in result["receipts"]:
            print(f"{receipt['event_ref']}  {receipt['decision']:<8} {receipt['authority']:<18}"
                  f" {','.join(receipt['reason_codes'])}  {','.join(receipt['rule_ids'])}")
        if not result["receipts"]:
            print(f"no decision receipts (intent: {result['intent'].get('status', 'none')})")
    else:
        print(f"run {result['run_id']}: {result['contract_ref']} v{result['contract_version']} binds at its next step")
        for warning in result.get("scope_warnings") or []:
            print(f"  intent warning: {warning}")
    return 0


def _compact_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


@command("compact", "fold a run's older turns into a summary before its next provider turn (docs/long-tasks.md)")
@arguments(_compact_args)
def cmd_compact(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        reply: dict[str, Any] = client.call("compact", run_id=args.run_id)
    if args.json:
        emit_json(reply)
    else:
        print(f"{reply['run_id']}: compaction requested; {reply['note']}")
    return 0
