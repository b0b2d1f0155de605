"""CLI: ``corral transcript RUN [--turn N] [--json]``, what a run's model was sent
and what it answered, turn by turn (docs/transcripts.md). Reads through the
supervisor, or from the ledger when none runs (like ``show``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from corral.cli.main import arguments, command, emit_json, open_reader, say_where_read

#: In text, a value past this many characters is cut, saying so (``--json`` has all).
TEXT_CHARS = 4000
INDENT = "    "


def _args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN", help="the run to read (a child's or a delegate's: its own id)")
    parser.add_argument("--turn", type=int, metavar="N",
                        help="only provider turn N (1-based), with its system prompt and tool catalog in full")
    parser.add_argument("--json", action="store_true", help="machine-readable output (every value whole)")


@command("transcript", "what a run's model was sent and answered: per provider turn the system prompt, the"
         " history since the turn before, the raw completion, and the tool calls or the repair it became")
@arguments(_args)
def cmd_transcript(args: argparse.Namespace) -> int:
    with open_reader(args) as client:
        shown = client.transcript(args.run_id, args.turn)
        say_where_read(client, args)
    if args.json:
        emit_json(shown)
    else:
        print("\n".join(transcript_lines(shown, full=args.turn is not None)))
    return 0


def cut(text: str, limit: int = TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" [… {len(text) - limit} more characters: --json has all]"


def _block(text: str) -> list[str]:
    return [INDENT + line for line in cut(text).splitlines() or [""]]


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def call_text(call: dict[str, Any]) -> str:
    """``tool(name="value", ...)``: a call with its arguments, as the plan holds them."""
    arguments = call.get("input") or {}
    if not isinstance(arguments, dict):
        return f"{call.get('tool')}({_value(arguments)})"
    inner = ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in arguments.items())
    return f"{call.get('tool')}({inner})"


def history_line(entry: dict[str, Any]) -> list[str]:
    """One history entry: a tool result, a repair, the user's steer, a summary."""
    role = entry.get("role")
    seq = entry.get("seq", "?")
    if role == "repair":
        return [f"  [{seq}] repair ({entry.get('category')}): {cut(str(entry.get('detail', '')))}"]
    if role == "user":
        return [f"  [{seq}] user (steer): {cut(str(entry.get('text', '')))}"]
    if role == "plan":  # the model's plan as it stood after its update (seed 004 V1.17)
        return [f"  [{seq}] plan revision {entry.get('revision')}: {cut(str(entry.get('explanation', '')))}"]
    if role == "summary":
        return [f"  [{seq}] summary of earlier turns: {cut(str(entry.get('text', '')))}"]
    tool, status, action = entry.get("tool", "?"), entry.get("status", "?"), entry.get("action_id")
    head = f"  [{seq}] result of {tool} ({status}, action {action}):"
    return [head, *_block(_value(entry.get("output")))]


def turn_lines(turn: dict[str, Any], *, full: bool = False) -> list[str]:
    """One turn; ``full``: its tool catalog's text too (``--turn``)."""
    lines = [f"── turn {turn['turn']}  loop {turn['loop']}  {turn['status']}  slot {turn['slot']}"]
    system = turn.get("system")
    if system is None:
        lines.append("  system prompt: not recorded (the provider renders none, or an older corral ran this turn)")
    elif system["text"] is not None:  # the first, a changed one, or one turn shown alone
        same = ", unchanged since the turn before" if system["unchanged"] else ""
        lines.append(f"  system prompt ({system['sha256'][:12]}{same}):")
        lines += _block(system["text"])
    elif system["unchanged"]:
        lines.append(f"  system prompt: unchanged ({system['sha256'][:12]})")
    else:
        lines.append(f"  system prompt {system['sha256'][:12]}: not recorded (too large to send with its turn)")
    catalog = turn.get("catalog")
    if catalog is not None and (full or not catalog["unchanged"]):
        lines.append(f"  tools offered ({catalog['sha256'][:12]}): {', '.join(catalog['tools']) or '-'}")
        if full and catalog.get("text"):
            lines += _block(catalog["text"])
    if turn.get("history"):
        lines.append("  history since the turn before:")
        for entry in turn["history"]:
            lines += history_line(entry)
    if turn.get("response") is not None:
        lines.append("  model said:")
        lines += _block(turn.get("said") or turn["response"])
    if turn.get("error"):
        lines.append(f"  failed ({turn['error']['kind']}): {turn['error']['error']}")
    plan = turn.get("plan")
    if plan is not None:
        if plan.get("final") is not None:
            lines.append(f"  → final reply: {cut(str(plan['final']))}")
        for call in plan.get("actions", []):
            lines.append(f"  → {cut(call_text(call))}")
            outcome = call.get("outcome")
            if outcome is not None:
                lines.append(f"      {outcome['phase']}: {outcome['summary']}  (action {outcome['action_id']})")
                if outcome.get("traceback"):
                    lines += [f"        {line}" for line in str(outcome["traceback"]).splitlines()]
    repair = turn.get("repair")
    if repair is not None:
        lines.append(f"  not a valid plan, repair ({repair.get('category')}): {cut(str(repair.get('detail', '')))}")
    return lines


def transcript_lines(shown: dict[str, Any], *, full: bool = False) -> list[str]:
    run = shown["run"]
    lines = [f"run {run['run_id']}  agent {run['agent_id']}  {run['kind']}  status {run['status']}"
             f"  provider {run['provider']}"]
    if run.get("parent_run_id"):
        lines.append(f"started by run {run['parent_run_id']}  (corral transcript {run['parent_run_id']})")
    lines.append("task:")
    lines += _block(run["task"] or "")
    if not shown["turns"]:
        lines.append("(no provider turn yet)")
    for turn in shown["turns"]:
        lines += turn_lines(turn, full=full)
    for child in shown.get("children", []):
        lines.append(f"{child['via']} run {child['run_id']}  agent {child['agent_id']}  {child['status']}"
                     f"  (corral transcript {child['run_id']})")
    if shown.get("final_reply") is not None:
        lines.append(f"the run's reply: {cut(shown['final_reply'])}")
    return lines
