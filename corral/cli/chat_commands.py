"""The chat's slash commands that look at or steer the swarm (seed 004 V1.15, V1.18,
V1.21, V1.22): ``/agents``, ``/status``, ``/history``, ``/goal``, ``/compact`` and
``/mcp``. Each is a thin call of the client (corral/client.py), the same the CLI
makes; none of them opens a turn or prints a turn report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.approval_text import printable

if TYPE_CHECKING:
    from corral.cli.chat import Chat

GOAL_USAGE = "  usage: /goal [status | set TEXT | pause | resume | edit TEXT | clear]"


def agents(chat: Chat, rest: str) -> None:
    found = [a for a in chat.client.status()["actors"] if a["template"] == "agent"]
    chat.out("agents", "\n".join(f"  {a['id']}  {a['status']}" for a in found) or "  (no agents)", agents=found)


def status(chat: Chat, rest: str) -> None:
    live = chat.live_run()
    if live is None:
        chat.out("status", "  no live run", live=None)
        return
    progress = chat.client.call("progress", run_ids=[live["run_id"]])["progress"].get(live["run_id"])
    # The stream's state as counts only (seed 004 V1.19: never a hidden plan or thinking).
    generating = f"  (generating: {progress['tokens']} tokens)" if progress else ""
    chat.out("status", f"  live run: {live['run_id']} {live['status']}{generating}", live=live, progress=progress)


def history(chat: Chat, rest: str) -> None:
    turns = chat.client.call("conversation.show", conversation_id=chat.conversation_id)["turns"]
    lines = []
    for t in turns:
        lines.append(f"  you> {t['task'].split('User: ')[-1][:300]}")
        # The turn's questions and their answers (seed 004 V1.23), model text shown printable.
        said = {"question": "agent asks", "steer": "you steer"}
        lines += [f"  {said.get(m['kind'], 'you answer')}> {printable(m['text'][:300])}"
                  for m in t.get("messages") or []]
        lines.append(f"  agent> {t['reply'] or '(' + t['status'] + ')'}")
    chat.out("history", "\n".join(lines) or "  (no turns yet)", turns=turns)


def _goal_run(chat: Chat) -> str | None:
    """The run a ``/goal`` concerns: the live run, else the conversation's latest."""
    live = chat.live_run()
    if live is not None:
        return str(live["run_id"])
    turns = chat.client.call("conversation.show", conversation_id=chat.conversation_id)["turns"]
    runs = [t["run_id"] for t in turns if t.get("run_id")]
    return str(runs[-1]) if runs else None


def goal(chat: Chat, rest: str) -> None:
    verb, _, text = rest.strip().partition(" ")
    verb = verb or "status"
    if verb not in ("status", "set", "pause", "resume", "edit", "clear") or (
            verb in ("set", "edit")) != bool(text.strip()):
        chat.out("error", GOAL_USAGE)
        return
    if verb == "set":
        # The next turn, bound to a goal: the text is its first task and its standard.
        sent = chat.client.send(chat.conversation_id, text.strip(), goal=True)
        chat.turn.open()
        chat.out("goal", f"  [goal set: {sent['run_id']}]", run=sent["run_id"], result=sent)
        return
    run_id = _goal_run(chat)
    if run_id is None:
        chat.out("error", "  no run in this conversation yet")
        return
    client = chat.client
    if verb == "status":
        shown = client.call("goal.status", run_id=run_id)
        lifecycle = shown.get("lifecycle") or {}
        state = f"  [{lifecycle.get('status')}, revision {lifecycle.get('revision')}]" if lifecycle else ""
        chat.out("goal", f"  goal of {run_id}: {shown.get('goal') or '(no goal)'}{state}", **shown)
        return
    result: dict[str, Any]
    if verb == "pause":
        result = client.goal_pause(run_id)
    elif verb == "resume":
        result = client.goal_resume(run_id)
    elif verb == "edit":
        result = client.goal_edit(run_id, text.strip())
    else:
        result = client.goal_clear(run_id)
    chat.out("goal", f"  [goal {verb}: {run_id}]", run=run_id, result=result)


def compact(chat: Chat, rest: str) -> None:
    live = chat.live_run()
    if live is None:
        chat.out("error", "  no live run to compact")
        return
    result = chat.client.call("compact", run_id=live["run_id"])
    chat.out("compact", f"  [compaction requested for {live['run_id']}: before its next provider turn]", **result)


def mcp(chat: Chat, rest: str) -> None:
    servers = chat.client.call("mcp.list")["servers"]
    lines: list[str] = []
    for server in servers:
        lines.append(f"  {server['id']}  {server['transport']}  {server['status']}")
        lines.extend(f"    {tool['full_name']}  {tool['policy']}" for tool in server["tools"])
    chat.out("mcp", "\n".join(lines) or "  no MCP servers ([[mcp_servers]] in the spec)", servers=servers)

