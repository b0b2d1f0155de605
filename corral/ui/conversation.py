"""The dashboard's conversation view of a run (``/runs/<id>/conversation``): what
its model was sent and what it answered, turn by turn, beside the run's actions
table. The same transcript as ``corral transcript`` (supervisor/runs/transcript_view.py);
every value is escaped here, and was redacted when it was stored."""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote

#: A value past this many characters is cut on the page, saying so (the CLI's --json has all).
PAGE_CHARS = 8000

CSS = (
    ".conversation{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:16px;align-items:start}"
    ".turn{border-left:3px solid #cbd5e1;padding:4px 10px;margin:10px 0}.turn h4{margin:4px 0}"
    ".turn pre{white-space:pre-wrap;word-break:break-word;margin:4px 0}.said{border-left:3px solid #3b82f6}"
    ".entry{color:#334155}.repair{color:#b45309}"
)


def _link(run_id: str, suffix: str = "") -> str:
    return f'<a href="/runs/{quote(run_id)}{suffix}">{escape(run_id)}</a>'


def _pre(text: str, css: str = "") -> str:
    if len(text) > PAGE_CHARS:
        text = text[:PAGE_CHARS] + f"\n[… {len(text) - PAGE_CHARS} more characters: corral transcript --json has all]"
    return f'<pre class="{css}">{escape(text)}</pre>'


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True)


def _entry(entry: dict[str, Any]) -> str:
    seq = escape(str(entry.get("seq", "?")))
    role = entry.get("role")
    if role == "repair":
        return (f'<div class="entry repair">[{seq}] repair ({escape(str(entry.get("category")))}):'
                f' {escape(str(entry.get("detail", "")))}</div>')
    if role == "plan":  # the model's plan as it stood after its update (seed 004 V1.17)
        return (f'<div class="entry">[{seq}] plan revision {escape(str(entry.get("revision")))}:'
                f' {escape(str(entry.get("explanation", "")))}</div>')
    if role in ("user", "summary"):
        what = "user (steer)" if role == "user" else "summary of earlier turns"
        return f'<div class="entry">[{seq}] {what}:</div>' + _pre(str(entry.get("text", "")))
    head = (f'[{seq}] result of <b>{escape(str(entry.get("tool", "?")))}</b>'
            f' ({escape(str(entry.get("status", "?")))}, action {escape(str(entry.get("action_id")))})')
    return f'<div class="entry">{head}</div>' + _pre(_json(entry.get("output")))


def _system(turn: dict[str, Any]) -> str:
    system = turn.get("system")
    if system is None:
        return "<p class=meta>system prompt: not recorded</p>"
    if system["unchanged"]:
        return f'<p class=meta>system prompt: unchanged ({escape(system["sha256"][:12])})</p>'
    if system["text"] is None:
        return f'<p class=meta>system prompt {escape(system["sha256"][:12])}: not recorded</p>'
    return (f'<details open><summary>system prompt ({escape(system["sha256"][:12])})</summary>'
            f'{_pre(system["text"])}</details>')


def _outcome(call: dict[str, Any]) -> str:
    arguments = call.get("input")
    text = escape(str(call.get("tool"))) + _pre(_json(arguments if arguments is not None else {}))
    outcome = call.get("outcome")
    if outcome is not None:
        text += (f'<div class=meta><span class="state {escape(outcome["phase"])}">{escape(outcome["phase"])}</span>'
                 f' {escape(str(outcome["summary"]))} · action {escape(outcome["action_id"])}</div>')
    return f"<li>{text}</li>"


def _turn(turn: dict[str, Any]) -> str:
    parts = [f'<div class="turn" id="turn-{turn["turn"]}"><h4>Turn {turn["turn"]} · loop {turn["loop"]} ·'
             f' <span class="state {escape(turn["status"])}">{escape(turn["status"])}</span></h4>', _system(turn)]
    catalog = turn.get("catalog")
    if catalog is not None and not catalog["unchanged"]:
        parts.append(f'<p class=meta>tools offered: {escape(", ".join(catalog["tools"]) or "-")}</p>')
    if turn.get("history"):
        parts.append("<div><b>Since the turn before</b></div>" + "".join(_entry(e) for e in turn["history"]))
    if turn.get("response") is not None:
        parts.append("<div><b>The model said</b></div>" + _pre(turn.get("said") or turn["response"], "said"))
    if turn.get("error"):
        parts.append(f'<p class=repair>failed ({escape(str(turn["error"]["kind"]))}):'
                     f' {escape(str(turn["error"]["error"]))}</p>')
    plan = turn.get("plan")
    if plan is not None and plan.get("actions"):
        parts.append("<div><b>Tool calls</b></div><ul>" + "".join(_outcome(c) for c in plan["actions"]) + "</ul>")
    if plan is not None and plan.get("final") is not None:
        parts.append(f'<p><b>Final reply</b> {escape(str(plan["final"]))}</p>')
    repair = turn.get("repair")
    if repair is not None:
        parts.append(f'<p class=repair>not a valid plan: repair ({escape(str(repair.get("category")))}):'
                     f' {escape(str(repair.get("detail", "")))}</p>')
    return "".join(parts) + "</div>"


def _actions(shown: dict[str, Any]) -> str:
    rows = "".join(
        f'<tr><td>{escape(str(a["loop_index"]))}</td><td>{escape(a["tool"])}</td>'
        f'<td><span class="state {escape(a["phase"])}">{escape(a["phase"])}</span></td>'
        f'<td>{escape(a.get("reason") or a.get("error") or "")}</td></tr>'
        for a in shown.get("actions", [])
    )
    if not rows:
        return "<p>No actions.</p>"
    return f"<table><thead><tr><th>loop</th><th>tool</th><th>phase</th><th>reason</th></tr></thead>{rows}</table>"


def page(transcript: dict[str, Any], shown: dict[str, Any]) -> str:
    """The conversation (``transcript``) beside the actions table (``shown``: the run's ``show``)."""
    run = transcript["run"]
    head = [
        f"<style>{CSS}</style>",
        f'<h2>Conversation of run {_link(run["run_id"])}</h2>',
        f'<p class="meta">agent {escape(run["agent_id"])} · {escape(run["kind"])} · provider'
        f' {escape(run["provider"])} · <span class="state {escape(run["status"])}">{escape(run["status"])}</span></p>',
    ]
    if run.get("parent_run_id"):
        head.append(f'<p class=meta>started by {_link(run["parent_run_id"], "/conversation")}</p>')
    talk = [f'<div class="turn"><b>Task</b>{_pre(run.get("task") or "")}</div>']
    talk += [_turn(turn) for turn in transcript["turns"]] or ["<p>No provider turn yet.</p>"]
    children = "".join(
        f'<li>{escape(child["via"])} {_link(child["run_id"], "/conversation")} · agent {escape(child["agent_id"])}'
        f' · {escape(child["status"])}</li>' for child in transcript.get("children", []))
    side = ["<h3>Actions</h3>", _actions(shown)]
    if children:
        side.append(f"<h3>Children and delegates</h3><ul>{children}</ul>")
    if transcript.get("final_reply") is not None:
        side.append(f'<h3>Final reply</h3>{_pre(transcript["final_reply"])}')
    return "".join(head) + f'<div class="conversation"><div>{"".join(talk)}</div><div>{"".join(side)}</div></div>'
