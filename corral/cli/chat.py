"""``corral chat [AGENT]``: a live conversation with an agent of a running swarm.

Every line goes to one conversation (``conversation.send``): it answers the live
run's open question, else steers the live run, else starts the next turn, a run
that sees the earlier turns. A follower thread prints what happens as it happens:
tool starts and finishes, approvals (answer ``y`` or ``n``), questions, and the
final reply as it streams. Each turn ends, once settled, with one ``[turn.report]``
line (corral/cli/chat_turns.py; schema docs/schemas/swarm-turn-report.v1.json).
If the supervisor restarts, the chat reconnects and carries on with the same
conversation and history, all of which is in the ledger. Leaving the chat
(``/quit``, the end of input) leaves the supervisor and the runs as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from corral import approval_text
from corral.cli import chat_commands, chat_turns
from corral.cli.main import EXIT_USAGE, CliError, arguments, command, home_of
from corral.client import Client
from corral.core.errors import CorralError
from corral.mailbox.control import ControlError
from corral.question_text import render_question

HELP = """commands:
  /help            this help
  /agents          the swarm's agents
  /status          the live run of this conversation
  /history         the turns so far
  /goal [status | set TEXT | pause | resume | edit TEXT | clear]
                   the goal of the live (else the latest) run
  /compact         fold the live run's older turns into a summary before its next turn
  /mcp             the spec's MCP servers and their tools
  /steer TEXT      add an instruction to the live run
  /approve, /deny  decide the action waiting for approval (or answer y / n)
  /quit            leave; the supervisor and the runs carry on (corral chat --session ID)
anything else: answers the open question, steers the live run, or starts the next turn"""

#: Events the chat shows, and how.
_SHOWN = {
    "action-executing",
    "action-ok",
    "action-failed",
    "action-denied",
    "run-waiting-confirmation",
    "run-needs-input",
    "run-completed",
    "run-failed",
    "run-cancelled",
    "run-needs-reconciliation",
    "action-needs-reconciliation",
    "reply-delta",
    "reply-stream-restart",
    "steer-applied",
    # The plan's compact summary (seed 004 V1.17), read from show when it changes.
    "plan-updated",
    # The swarm under a turn: delegations, their receipts, children, joins and claims.
    "delegated",
    "delegation-receipt",
    "group-spawned",
    "child-finished",
    "claim-committed",
}
RECONNECT_S = 0.5


def _chat_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "agent", nargs="?", help="the agent (default: the spec's root agent, when it has one; else name one)"
    )
    parser.add_argument("--session", help="continue this conversation (conv-...) instead of starting one")
    parser.add_argument("--list", action="store_true", help="list the conversations and exit")
    parser.add_argument("--json", action="store_true", help="one JSON object per turn event, for scripts")


class Chat:
    def __init__(self, client: Client, conversation_id: str, *, as_json: bool) -> None:
        self.client = client
        self.conversation_id = conversation_id
        self.as_json = as_json
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.streaming: dict[str, bool] = {}
        #: Action id -> the fingerprint of the view shown for it: ``y`` approves that
        #: exactly (shared with the follower, which shows the prompts).
        self.shown: dict[str, str] = {}
        #: ``"request"`` -> the request of the question shown last: a typed line
        #: answers exactly it (seed 004 V1.23: an answer names its request), never a
        #: later one (shared with the follower, which shows the questions).
        self.asked: dict[str, str] = {}
        #: Whether a turn waits for its report (shared with the follower, which prints it).
        self.turn = chat_turns.TurnWatch()

    # -- output -----------------------------------------------------------------------

    def out(self, kind: str, text: str = "", **data: Any) -> None:
        with self.lock:
            if self.as_json:
                print(json.dumps({"event": kind, "text": text, **data}, default=str), flush=True)
            elif kind == "delta":
                sys.stdout.write(text)
                sys.stdout.flush()
            elif text:
                print(text, flush=True)

    # -- the follower ------------------------------------------------------------------

    def my_runs(self) -> set[str]:
        """The conversation's turns and every run under them (delegated specialists,
        isolated children): their events and approvals are this chat's too."""
        shown = self.client.call("conversation.show", conversation_id=self.conversation_id)
        runs = {turn["run_id"] for turn in shown["turns"] if turn.get("run_id")}
        return runs | {run["run_id"] for run in shown.get("tree", ())}

    def tree_runs(self) -> list[str]:
        """The live run and every run under the conversation's turns that may wait
        for a person, the live run first."""
        shown = self.client.call("conversation.show", conversation_id=self.conversation_id)
        live = shown.get("live_run")
        first = [live["run_id"]] if live else []
        return first + [run["run_id"] for run in shown.get("tree", ()) if run["run_id"] not in first]

    def follow(self, cursor: int) -> None:
        """Print this conversation's events until told to stop, and each turn's
        report once it settles; reconnect when the supervisor goes away (its events
        are in the ledger: nothing is missed)."""
        gone = False
        while not self.stop.is_set():
            try:
                reply = self.client.call("events", timeout=20, since=cursor, wait_ms=1000)
                runs = self.my_runs()
                if gone:
                    self.out("reconnected", "[reconnected]")
                    gone = False
                for event in reply["events"]:
                    data = event["data"]
                    if event["kind"] in _SHOWN and (
                        event["subject"] in runs or data.get("run") in runs or data.get("parent_run") in runs
                    ):
                        self.show_event(event)
                cursor = reply["cursor"]
                self.report_if_settled(cursor)
            except CorralError:
                if not gone:
                    self.out("reconnecting", "[the supervisor is gone; reconnecting...]")
                    gone = True
                self.client.close()
                self.stop.wait(RECONNECT_S)

    def report_if_settled(self, shown: int) -> None:
        """The open turn's one report, once it is settled (chat_turns.py)."""
        if not self.turn.is_open():
            return
        report = chat_turns.settled_report(self.client, self.conversation_id, shown)
        if report is not None and self.turn.is_open():
            self.out("turn.report", chat_turns.report_line(report), report=report)
            self.turn.close()

    def show_event(self, event: dict[str, Any]) -> None:
        kind, data, subject = event["kind"], event["data"], event["subject"]
        if kind == "reply-delta":
            if not self.streaming.get(subject):
                if not self.as_json:  # the prompt before streamed text, in a terminal only
                    self.out("delta", "agent> ", run=subject)
                self.streaming[subject] = True
            # The text comes from the supervisor's memory: a delta it no longer has shows nothing.
            self.out("delta", data.get("text", ""), run=subject)
        elif kind == "reply-stream-restart":
            self.out("stream-restart", "\n[the reply restarts]", run=subject)
            self.streaming[subject] = False
        elif kind == "action-executing":
            self.out("tool-start", f"  > {data.get('tool', '?')}  ({subject})", action=subject, tool=data.get("tool"))
        elif kind in ("action-ok", "action-failed", "action-denied"):
            self.out("tool-end", f"  < {kind[7:]}  ({subject})", action=subject, outcome=kind[7:])
        elif kind == "plan-updated":
            self.show_plan(subject, data)
        elif kind == "steer-applied":
            self.out("steer-applied", f"  [steer applied: {data.get('steer')}]", run=subject)
        elif kind in ("delegated", "delegation-receipt", "group-spawned", "child-finished", "claim-committed"):
            self.show_swarm(kind, subject, data)
        elif kind == "action-needs-reconciliation":
            self.out("reconcile", f"  ! {subject} needs reconciliation: its outcome is unknown and it is never run"
                     f" again by itself (corral reconcile {subject} ...)", action=subject)
        elif kind == "run-waiting-confirmation":
            self.show_approval(subject)
        elif kind == "run-needs-input":
            self.show_question(subject)
        elif kind == "run-needs-reconciliation":
            why = data.get("reason") or "an outcome is unknown"
            self.out("reconcile", f"  ! run {subject} needs reconciliation: {why}"
                     " (corral show / corral reconcile; nothing is retried)", run=subject)
        elif kind.startswith("run-"):
            self.show_end(subject, kind[4:])

    def show_plan(self, run_id: str, data: dict[str, Any]) -> None:
        """The plan's compact summary (seed 004 V1.17: "已完成数/总数、当前步骤、等待对象、下一步和
        当前专业 Agent 协作数量"), from the event's counts: never its revision, its
        explanation or the full list. A step is named by its title when the plan read
        now is still the event's revision, else by its number."""
        shown = self.client.show(run_id).raw
        plan = shown.get("plan") or {}
        steps = plan.get("steps") or [] if plan.get("revision") == data.get("revision") else []

        def named(number: Any) -> str | None:
            if not isinstance(number, int):
                return None
            return str(steps[number - 1]["step"]) if 0 < number <= len(steps) else f"step {number}"

        current, upcoming = named(data.get("active")), named(data.get("next"))
        waiting = {"waiting-confirmation": "your approval", "needs-input": "your answer"}.get(
            str(shown.get("run", {}).get("status")))
        delegations = (shown.get("swarm") or {}).get("delegations") or []
        specialists = len({d.get("target_agent") for d in delegations if d.get("status") != "terminal"})
        parts = [f"{data.get('completed')}/{data.get('steps')} completed"]
        parts += [f"now: {current}"] if current else []
        parts += [f"waiting for {waiting}"] if waiting else []
        parts += [f"next: {upcoming}"] if upcoming else []
        parts.append(f"specialists: {specialists}")
        self.out("plan", f"  [plan: {'; '.join(parts)}]", run=run_id, completed=data.get("completed"),
                 total=data.get("steps"), current=current, next=upcoming, waiting=waiting, specialists=specialists)

    def agent_of(self, run_id: str) -> str | None:
        try:
            return str(self.client.show(run_id).raw["run"]["agent_id"])
        except CorralError:
            return None

    def show_swarm(self, kind: str, subject: str, data: dict[str, Any]) -> None:
        """A delegation, its receipt, a group of children, a child's end or a claim:
        identities and states only (no task or result text)."""
        if kind == "delegated":
            parent = data.get("parent_run")
            agent = self.agent_of(str(parent)) if parent else None
            text = f"  [delegation {subject} -> {data.get('target')} (parent {agent or '?'}, run {parent})]"
        elif kind == "delegation-receipt":
            text = (f"  [receipt of delegation {data.get('delegation')}: {data.get('status')}"
                    f" -> parent run {data.get('parent_run')}]")
        elif kind == "group-spawned":
            text = f"  [isolated children spawned: group {subject} (parent run {data.get('parent_run', '?')})]"
        elif kind == "child-finished":
            text = f"  [child {subject} finished: {data.get('status', '?')}]"
        else:
            text = f"  [receipts claimed: {subject}]"
        self.out(kind, text, subject=subject, **{key: str(value) for key, value in data.items()
                                                 if key in ("target", "parent_run", "delegation", "status")})

    def show_approval(self, run_id: str) -> None:
        """The approval view of each action of ``run_id`` waiting for approval (the one
        ``corral pending`` shows), then the ``[y/n]`` prompt."""
        for action in self.client.pending().raw["actions"]:
            if action["run_id"] == run_id and action["phase"] == "waiting-confirmation":
                self.prompt(action)

    def prompt(self, action: dict[str, Any]) -> None:
        view = action.get("approval") or self.client.approval(action["action_id"]).raw
        lines = approval_text.render(view, preview=True, indent="    ")
        self.shown[action["action_id"]] = view["fingerprint"]
        self.out(
            "approval",
            "\n".join([*lines, f"  ? approve {action['action_id']}: {action['input_summary']}  [y/n]"]),
            action=action["action_id"],
            summary=action["input_summary"],
            fingerprint=view["fingerprint"],
            approval=view,
        )

    def show_question(self, run_id: str) -> None:
        """The run's structured questions (corral/question_text.py); a typed line answers."""
        for request in self.client.pending().raw.get("questions", []):
            if request["run_id"] == run_id:
                self.asked["request"] = str(request["request_id"])
                lines = render_question(request)
                self.out("question", "\n".join(["agent asks>", *lines[1:]]), request=request)

    def show_end(self, run_id: str, status: str) -> None:
        shown = self.client.show(run_id).raw
        if shown["run"].get("kind") in (None, "root") and status in ("completed", "failed", "cancelled"):
            self.asked.clear()  # the turn's run ended: nothing it asked takes a line now
        run = shown["run"]
        if run.get("kind") not in (None, "root"):
            # A delegated specialist's or a child's run: its end, never a reply to the person.
            self.out("run-end", f"  [{run['kind']} run {run_id} of {run.get('agent_id')}: {status}]", run=run_id,
                     status=status, run_kind=run["kind"], agent=run.get("agent_id"))
            return
        if self.streaming.pop(run_id, False) and not self.as_json:
            self.out("delta", "\n", run=run_id)  # end the streamed line
        if shown.get("final_reply") is not None:
            # The journal's text, the one final reply (the stream was a view of it).
            self.out("final", f"agent> {shown['final_reply']}", run=run_id, status=status)
        else:
            self.out("end", f"[run {status}: {shown['run'].get('reason') or ''}]", run=run_id, status=status)

    # -- input ---------------------------------------------------------------------------

    def live_run(self) -> dict[str, Any] | None:
        live: dict[str, Any] | None = self.client.call("conversation.show", conversation_id=self.conversation_id)[
            "live_run"
        ]
        return live

    def handle(self, line: str) -> bool:
        """One input line; False to quit."""
        text = line.strip()
        if not text:
            return True
        if text in ("/quit", "/exit"):
            return False
        word, _, rest = text.partition(" ")
        if text == "/help":
            self.out("help", HELP)
        elif word == "/agents":
            chat_commands.agents(self, rest)
        elif word == "/status":
            chat_commands.status(self, rest)
        elif word == "/history":
            chat_commands.history(self, rest)
        elif word == "/goal":
            chat_commands.goal(self, rest)
        elif word == "/compact":
            chat_commands.compact(self, rest)
        elif word == "/mcp":
            chat_commands.mcp(self, rest)
        elif text.startswith("/steer "):
            live = self.live_run()
            if live is None:
                self.out("error", "  no live run to steer; just type to start the next turn")
            else:
                result = self.client.steer(live["run_id"], text[7:])
                self.turn.open()
                self.out("steer", f"  [steer {result['steer_id']} recorded]", **result)
        elif text in ("y", "n", "/approve", "/deny"):
            self.decide(text in ("y", "/approve"))
        elif text.startswith("/"):
            self.out("error", f"  unknown command {text.split()[0]}; /help lists them")
        else:
            asked = self.asked.get("request")
            try:
                sent = self.client.send(self.conversation_id, text, request_id=asked)
            except CorralError as exc:
                if getattr(exc, "code", "") != "conflict":
                    raise
                if asked is not None:
                    self.asked.clear()  # answered meanwhile (elsewhere): the next line is not an answer to it
                    raise
                # A question waits that this chat has not shown yet: show it; the next line answers it.
                live = self.live_run()
                if live is not None:
                    self.show_question(live["run_id"])
                raise
            if sent["as"] == "answer":
                self.asked.clear()  # answered: the next line is a steer or the next turn
            self.turn.open()  # after the send: the turn's run is there to be judged
            if sent["as"] == "steer":
                self.out("steer", f"  [steer {sent['steer_id']} recorded for the live run]", **sent)
            elif sent["as"] == "answer":
                self.out("answer", "  [answer recorded]", **sent)
            else:
                self.out("turn", "", run=sent["run_id"])
        return True

    def decide(self, approve: bool) -> None:
        """Decide the first action waiting for approval in the live run or any run
        under the conversation's turns (a delegated specialist's, a child's): the
        person decides it here, never elsewhere (seed 004 V1.15)."""
        order = {run_id: n for n, run_id in enumerate(self.tree_runs())}
        waiting = sorted(
            (a for a in self.client.pending().raw["actions"]
             if a["run_id"] in order and a["phase"] == "waiting-confirmation"),
            key=lambda a: order[a["run_id"]],
        )
        if not waiting:
            self.out("error", "  nothing waits for approval")
            return
        action = waiting[0]
        action_id = action["action_id"]
        fingerprint = self.shown.get(action_id)
        if fingerprint is None:
            # Nothing was shown for it yet: show it, and decide on the next answer.
            self.prompt(action)
            self.out("error", "  answer again (y / n) for the action shown above")
            return
        if approve:
            self.client.approve(action_id, fingerprint=fingerprint)
        else:
            self.client.deny(action_id, fingerprint=fingerprint)
        self.turn.open()
        self.out("decision", f"  [{'approved' if approve else 'denied'} {action_id}]", action=action_id)


def _read_lines(chat: Chat) -> bool:
    """Lines until /quit (False) or the end of input (True)."""
    prompt = "" if chat.as_json or not sys.stdin.isatty() else "you> "
    while True:
        try:
            line = input(prompt)
        except EOFError:
            return True
        for attempt in range(40):  # a restarting supervisor: wait for it, do not drop the line
            try:
                if not chat.handle(line):
                    return False
                break
            except CorralError as exc:
                code = getattr(exc, "code", "")
                if code and code not in ("not-running",):
                    chat.out("error", f"  {code}: {getattr(exc, 'message', exc)}")
                    break
                chat.client.close()
                time.sleep(RECONNECT_S if attempt else 0)


#: How often the end of input looks again whether the turn waits for an approval.
SETTLE_LOOK_S = 1.0


def _settle(chat: Chat, timeout: float = 600.0) -> None:
    """Input ended (a script's last line): wait for the open turn's report (the
    follower prints it once the turn settles), so the turn is shown whole before
    the chat exits. No turn open: nothing to wait for. A turn that waits for an
    approval cannot settle without the person, whose input has ended: say so and
    leave, with no report (a report is never made up)."""
    deadline = time.monotonic() + timeout
    while not chat.turn.wait_closed(SETTLE_LOOK_S) and time.monotonic() < deadline:
        runs = set(chat.tree_runs())
        waiting = [a["action_id"] for a in chat.client.pending().raw["actions"]
                   if a["run_id"] in runs and a["phase"] == "waiting-confirmation"]
        if waiting:
            chat.out("input-ended", f"[input ended while {', '.join(waiting)} waits for approval: decide it with"
                     f" corral approve / corral deny, or corral chat --session {chat.conversation_id}]",
                     actions=waiting)
            return


def _new_conversation(client: Client, agent: str | None) -> tuple[str, str]:
    """A new conversation with ``agent``, or with the spec's root agent when None.
    An agent the spec does not have, or no agent named when it has several roots,
    is a usage error; the supervisor's message lists the agents."""
    try:
        named: dict[str, Any] = {} if agent is None else {"agent_id": agent}
        started = client.call("conversation.new", **named)
    except ControlError as exc:
        if exc.code in ("not-found", "bad-request"):
            hint = "; corral chat AGENT" if agent is None else ""
            raise CliError(f"{exc.message}{hint}", EXIT_USAGE) from None
        raise
    return str(started["conversation_id"]), str(started["agent_id"])


@command("chat", "talk to an agent of the running swarm: a live conversation (/help inside)")
@arguments(_chat_args)
def cmd_chat(args: argparse.Namespace) -> int:
    client = Client.connect(home_of(args))
    try:
        if args.list:
            for row in client.call("conversation.list")["conversations"]:
                fork = f"  (fork of {row['forked_from']})" if row["forked_from"] else ""
                print(f"{row['conversation_id']}  {row['agent_id']}{fork}")
            return 0
        if args.session:
            conversation = client.call("conversation.show", conversation_id=args.session)["conversation"]
            conversation_id, agent_id = conversation["conversation_id"], conversation["agent_id"]
        else:
            conversation_id, agent_id = _new_conversation(client, args.agent)
        cursor = int(client.status()["cursor"])
        chat = Chat(client, conversation_id, as_json=args.json)
        chat.out("session", f"corral chat: session {conversation_id} with {agent_id}  (/help, /quit)",
                 conversation_id=conversation_id, agent_id=agent_id)
        follower_client = Client.connect(client.home)
        follower = Chat(follower_client, conversation_id, as_json=args.json)
        follower.lock = chat.lock
        follower.shown = chat.shown
        follower.asked = chat.asked
        follower.turn = chat.turn
        thread = threading.Thread(target=follower.follow, args=(cursor,), daemon=True)
        thread.start()
        try:
            if _read_lines(chat):
                _settle(chat)
        finally:
            # Let the follower print what is already in flight for the last line.
            follower.stop.set()
            thread.join(timeout=3)
            follower_client.close()
        return 0
    except CorralError as exc:
        raise CliError(f"{getattr(exc, 'code', 'error')}: {getattr(exc, 'message', exc)}") from None
    finally:
        client.close()
